"""SavedModel export of a fine-tuned classifier, serving raw text.

Signatures (one set per task; `serving_default` is the first task's text signature):

- `serving_default` / `<task>`: `text` tf.string [batch] (and `text_b` [batch] for a
  sentence-pair task) -> `probabilities` float32 [batch, num_labels], `logits` float32
  [batch, num_labels], `label_ids` int32 [batch], `labels` tf.string [batch] (label names).
  The text is tokenized and packed in-graph by the same `TextEncoder` that built the training
  features (BERT tokenization, longest-first pair truncation to max_seq_length), padded to the
  longest sequence of the batch.
- `<task>_ids`: int32 `input_ids`, `input_mask`, `segment_ids` [batch, seq] -> the same
  `probabilities`, `logits`, `label_ids`, `labels`.

`assets.extra/` holds `finetuning_config.json`, `labels.json` ({task: [label names]}) and
`vocab.txt`. Loading needs TensorFlow and `import tensorflow_text` (for the tokenizer's ops).
The export is written to a temporary directory and renamed into place.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from typing import Dict, List, Sequence

import tensorflow as tf

from electra_tf.finetuning.encoding import TextEncoder
from electra_tf.finetuning.tasks import Task

EXTRA_DIR = "assets.extra"
LABELS_FILE = "labels.json"
CONFIG_FILE = "finetuning_config.json"


def _int_spec(name: str) -> tf.TensorSpec:
    return tf.TensorSpec([None, None], tf.int32, name=name)


def _text_spec(name: str) -> tf.TensorSpec:
    return tf.TensorSpec([None], tf.string, name=name)


class FinetunedModule(tf.Module):
    """A fine-tuned `ElectraClassifier` with raw-text signatures (see module docstring).

    Args:
        model: ElectraClassifier.
        text_encoder: TextEncoder used for the training features.
        tasks: list of Task, in the model's task order.
    """

    def __init__(self, model, text_encoder: TextEncoder, tasks: Sequence[Task]):
        super().__init__(name="electra_classifier")
        self.model = model
        self.text_encoder = text_encoder
        self.tasks = list(tasks)
        self._label_names = {t.name: tf.constant(list(t.labels), tf.string) for t in tasks}
        self.signature_functions: Dict[str, tf.types.experimental.GenericFunction] = {}
        for i, task in enumerate(self.tasks):
            text_fn, ids_fn = self._make_functions(task)
            # Attributes, so the functions (and what they capture) are tracked into the SavedModel.
            setattr(self, f"serve_text_{i}", text_fn)
            setattr(self, f"serve_ids_{i}", ids_fn)
            self.signature_functions[task.name] = text_fn
            self.signature_functions[f"{task.name}_ids"] = ids_fn
        self.signature_functions["serving_default"] = self.signature_functions[self.tasks[0].name]

    def _outputs(self, task: Task, features: Dict[str, tf.Tensor]) -> Dict[str, tf.Tensor]:
        logits = self.model(features, training=False)[task.name]
        label_ids = tf.argmax(logits, axis=-1, output_type=tf.int32)
        return {"probabilities": tf.nn.softmax(logits), "logits": logits, "label_ids": label_ids,
                "labels": tf.gather(self._label_names[task.name], label_ids)}

    def _make_functions(self, task: Task):
        if task.is_pair:
            @tf.function(input_signature=[_text_spec("text"), _text_spec("text_b")])
            def serve_text(text, text_b):
                return self._outputs(task, self.text_encoder.encode(text, text_b))
        else:
            @tf.function(input_signature=[_text_spec("text")])
            def serve_text(text):
                return self._outputs(task, self.text_encoder.encode(text))

        @tf.function(input_signature=[_int_spec("input_ids"), _int_spec("input_mask"),
                                      _int_spec("segment_ids")])
        def serve_ids(input_ids, input_mask, segment_ids):
            return self._outputs(task, {"input_ids": input_ids, "input_mask": input_mask,
                                        "segment_ids": segment_ids})

        return serve_text, serve_ids


def export_finetuned(module: FinetunedModule, target: str, config_json: str, vocab_path: str) -> str:
    """Saves `module` to `target` atomically (temporary directory, then rename).

    Args:
        module: FinetunedModule.
        target: str. Export directory; an existing one is replaced (the caller checks
            `--overwrite` before training).
        config_json: str. The resolved FinetuningConfig as JSON.
        vocab_path: str. The vocab the model was trained with.

    Returns:
        target.
    """
    parent = os.path.dirname(os.path.abspath(target))
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.tmp-", dir=parent)
    tf_logger = logging.getLogger("tensorflow")
    tf_level = tf_logger.level
    try:
        tf_logger.setLevel(max(tf_level, logging.ERROR))  # one warning per captured constant
        tf.saved_model.save(module, staging, signatures=module.signature_functions)
        extra = os.path.join(staging, EXTRA_DIR)
        os.makedirs(extra, exist_ok=True)
        with open(os.path.join(extra, CONFIG_FILE), "w", encoding="utf-8") as f:
            f.write(config_json + "\n")
        with open(os.path.join(extra, LABELS_FILE), "w", encoding="utf-8") as f:
            json.dump({t.name: list(t.labels) for t in module.tasks}, f, indent=1)
        shutil.copyfile(vocab_path, os.path.join(extra, "vocab.txt"))
        if os.path.exists(target):
            old = staging + ".old"
            os.replace(target, old)
            os.replace(staging, target)
            shutil.rmtree(old)
        else:
            os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        tf_logger.setLevel(tf_level)
    return target


def load_labels(export_dir: str) -> Dict[str, List[str]]:
    """{task: label names} of an export."""
    with open(os.path.join(export_dir, EXTRA_DIR, LABELS_FILE), encoding="utf-8") as f:
        return json.load(f)
