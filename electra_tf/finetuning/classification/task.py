"""Classification as a `FinetuningTask`: GLUE and generic TSV/CSV tasks (files: `data.py`).

Features: the pair layout of `encoding.TextEncoder` plus `label_ids`. Metrics (official units,
percent): `accuracy`, `f1` (binary tasks), `macro_f1`, `mcc` (`metrics.py`) and `loss` (the mean
cross-entropy, as the official scorers report it). Unlabelled test files are predicted and, with
`write_test_outputs`, written as `index<TAB>prediction`.
"""

from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np

from electra_tf.finetuning import metrics as metrics_lib
from electra_tf.finetuning.classification.data import Example, Task, load_task
from electra_tf.finetuning.task import (CLASSIFICATION, EVAL_SPLITS, EvalSet, FeatureSpec,
                                        FinetuningTask, ScoreContext, test_predictions_path,
                                        write_test_predictions)
from electra_tf.finetuning.task_files import DEBUG_MAX_LINES


class ClassificationTask(FinetuningTask):
    """A GLUE or generic classification task.

    Args:
        name: str. GLUE name (or alias) or a generic task's directory name.
        config: FinetuningConfig.
        text_encoder: the run's `encoding.TextEncoder` (TensorFlow), or a
            `portable_encoding.PortableTextEncoder` (JAX: no serving).
    """

    family = CLASSIFICATION

    def __init__(self, name: str, config, text_encoder):
        data = load_task(name, config.raw_data_dir, ("train",) + EVAL_SPLITS,
                         config.double_unordered, DEBUG_MAX_LINES if config.debug else None)
        super().__init__(data.task.name, config)
        self.data = data
        self.task: Task = data.task
        self.labels = data.task.labels
        self.text_encoder = text_encoder

    def _encode(self, examples: List[Example], labelled: bool) -> Dict[str, np.ndarray]:
        texts_b = [e.text_b for e in examples] if self.task.is_pair else None
        features = self.text_encoder.encode_examples([e.text_a for e in examples], texts_b)
        if labelled:
            features["label_ids"] = np.array([self.task.label_id(e) for e in examples], np.int32)
        return features

    def feature_specs(self):
        return {"label_ids": FeatureSpec((), "int32")}

    def train_features(self):
        return self._encode(self.data.train, True) if self.data.train else None

    def eval_sets(self):
        sets = []
        for split in EVAL_SPLITS:
            examples = getattr(self.data, split)
            if examples:
                labelled = self.data.labelled[split]
                sets.append(EvalSet(split, self._encode(examples, labelled), labelled, examples))
        return sets

    def summary(self):
        return {"family": self.family, "directory": self.task.directory,
                "labels": list(self.labels), "is_pair": self.task.is_pair,
                **{s: len(getattr(self.data, s) or []) for s in ("train",) + EVAL_SPLITS}}

    def head_config(self):
        return {"name": self.name, "family": CLASSIFICATION, "num_labels": self.task.num_labels}

    def score(self, eval_set: EvalSet, outputs, context: ScoreContext) -> Optional[Dict[str, float]]:
        predictions = np.argmax(outputs["logits"], axis=-1)
        if not eval_set.labelled:
            if context.write_test_outputs:
                path = test_predictions_path(context, self.name, eval_set.split, "tsv")
                write_test_predictions(path, [f"{i}\t{self.labels[int(p)]}"
                                              for i, p in enumerate(predictions)],
                                       "index\tprediction")
            return None
        values = metrics_lib.classification_metrics(
            eval_set.features["label_ids"], predictions, self.task.num_labels)
        result = {k: 100.0 * values[k] for k in metrics_lib.METRIC_NAMES if k in values}
        result["loss"] = float(np.mean(outputs["loss"]))
        return result

    def serving(self, model):
        import tensorflow as tf

        # lazy: TensorFlow is optional here (export is TensorFlow's; training runs on JAX too)
        from electra_tf.finetuning.export import sentence_serving

        label_names = tf.constant(list(self.labels), tf.string)

        def postprocess(outputs):
            logits = outputs["logits"]
            label_ids = tf.argmax(logits, axis=-1, output_type=tf.int32)
            return {"probabilities": tf.nn.softmax(logits), "logits": logits,
                    "label_ids": label_ids, "labels": tf.gather(label_names, label_ids)}

        return sentence_serving(model, self.name, self.text_encoder, self.task.is_pair, postprocess)
