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
from typing import Dict, Sequence

import tensorflow as tf

from electra_tf.finetuning.encoding import TextEncoder
from electra_tf.finetuning.tasks import Task
from electra_tf.training.export import save_atomically

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
    labels = json.dumps({t.name: list(t.labels) for t in module.tasks}, indent=1)
    return save_atomically(module, module.signature_functions, target,
                           extra_files={"vocab.txt": vocab_path},
                           extra_texts={CONFIG_FILE: config_json + "\n", LABELS_FILE: labels})
