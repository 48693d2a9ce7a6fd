"""SavedModel export of a fine-tuned model, serving raw text.

Every task of the run contributes its signatures (`FinetuningTask.serving`); `serving_default`
is the first task's raw-text signature:

| family | `<task>` (raw text) | `<task>_ids` (int32 `input_ids`, `input_mask`, `segment_ids`) |
|---|---|---|
| classification | `text` [batch] (+ `text_b` for a pair task) -> `probabilities`, `logits`, `label_ids`, `labels` | the same outputs |
| regression (sts) | `text`, `text_b` -> `predictions` ([0, 1], as trained), `scores` (x 5: the 0-5 scale) | the same |
| question answering | `question`, `context` -> `answer`, `answer_start`, `answer_end` (character offsets into the context), `score`, `null_odds`, `has_answer` | the head's `start_logits` [batch, seq]; with `joint_prediction` the beam's `start_top_log_probs`, `start_top_index` [batch, beam], `end_top_log_probs`, `end_top_index` [batch, beam, beam], else `end_logits`; with `answerable_classifier` `answerable_logit` [batch] (to decode outside TensorFlow, e.g. after the ONNX export) |
| tagging (chunk, ner, pos) | `text` (chunk: words separated by whitespace; ner, pos: raw text) -> `tags` [batch, words], `tag_ids`, `num_words`, `num_tagged`; ner, pos: + `words`, `word_starts`, `word_ends` (character offsets); ner: + `entity_types`, `entity_starts`, `entity_ends`, `entity_texts`, `num_entities` | + `labeled_positions` -> `tag_ids` [batch, seq] |

The signatures compute in `export_precision` (float32 by default whatever `mixed_precision`
trained in, or bfloat16 on request; `precision.in_export_precision`), recorded in
`finetuning_config.json`.

Text is tokenized and packed in-graph by the same code that built the training features
(classification/regression: `encoding.TextEncoder`; QA: `qa/serving.py`; tagging:
`tagging/serving.py`), padded to the longest sequence of the batch.

`assets.extra/` holds `finetuning_config.json`, `vocab.txt` (`spm.model` for a SentencePiece
vocabulary) and `labels.json` ({task: label
names} of the classification and tagging tasks). Loading needs TensorFlow and `import tensorflow_text` (for the tokenizer's ops).
The export is written to a temporary directory and renamed into place.
"""

from __future__ import annotations

import json
from typing import Callable, Dict, Mapping, Sequence

import tensorflow as tf

from electra_tf import precision
from electra_tf.finetuning.encoding import TextEncoder
from electra_tf.training import run_dir
from electra_tf.training.tf.export import save_atomically

CONFIG_FILE = "finetuning_config.json"
LABELS_FILE = "labels.json"


def int_spec(name: str) -> tf.TensorSpec:
    return tf.TensorSpec([None, None], tf.int32, name=name)


def text_spec(name: str) -> tf.TensorSpec:
    return tf.TensorSpec([None], tf.string, name=name)


class TaskServing(tf.Module):
    """One task's serving functions and the objects they capture (tracked for the SavedModel).

    Args:
        functions: {signature name: tf.function with an input_signature}.
        trackables: {attribute name: tf.Module or constant} the functions use (tokenizers...).
    """

    def __init__(self, functions: Mapping[str, Callable], trackables: Mapping[str, object] = None,
                 name=None):
        super().__init__(name=name)
        for key, value in (trackables or {}).items():
            setattr(self, key, value)
        self.signature_functions = dict(functions)
        for i, fn in enumerate(self.signature_functions.values()):
            setattr(self, f"function_{i}", fn)


def sentence_serving(model, task_name: str, text_encoder: TextEncoder, is_pair: bool,
                     postprocess: Callable[[Dict[str, tf.Tensor]], Dict[str, tf.Tensor]]
                     ) -> TaskServing:
    """`<task>` (raw text, one or two strings) and `<task>_ids` signatures of a sentence(-pair)
    task whose head reads only the shared features.

    Args:
        model: FinetuningModel.
        task_name: str.
        text_encoder: the TextEncoder that built the training features.
        is_pair: bool. Takes `text` and `text_b`.
        postprocess: head outputs -> signature outputs.
    """
    def outputs(features):
        return postprocess(model.task_outputs(features, task_name, training=False))

    if is_pair:
        @tf.function(input_signature=[text_spec("text"), text_spec("text_b")])
        def serve_text(text, text_b):
            return outputs(text_encoder.encode(text, text_b))
    else:
        @tf.function(input_signature=[text_spec("text")])
        def serve_text(text):
            return outputs(text_encoder.encode(text))

    @tf.function(input_signature=[int_spec("input_ids"), int_spec("input_mask"),
                                  int_spec("segment_ids")])
    def serve_ids(input_ids, input_mask, segment_ids):
        return outputs({"input_ids": input_ids, "input_mask": input_mask,
                        "segment_ids": segment_ids})

    return TaskServing({task_name: serve_text, f"{task_name}_ids": serve_ids},
                       {"text_encoder": text_encoder})


class FinetunedModule(tf.Module):
    """A fine-tuned `FinetuningModel` with every task's signatures (see module docstring).

    Args:
        model: FinetuningModel.
        tasks: list of FinetuningTask, in the model's task order.
        export_precision: what the signatures compute in (`precision.EXPORT_PRECISIONS`):
            float32 (the default) whatever `model` trained in, or bfloat16.
    """

    def __init__(self, model, tasks: Sequence,
                 export_precision: str = precision.DEFAULT_EXPORT_PRECISION):
        super().__init__(name="electra_finetuned")
        self.export_precision = export_precision
        model = precision.in_export_precision(model, export_precision)
        self.model = model
        self.task_names = [t.name for t in tasks]
        # Layers a signature builds while it is traced take the export's policy too.
        with precision.keras_policy(precision.EXPORT_POLICIES[export_precision]):
            self.servings = [task.serving(model) for task in tasks]
        self.signature_functions: Dict[str, Callable] = {}
        for serving in self.servings:
            self.signature_functions.update(serving.signature_functions)
        self.signature_functions["serving_default"] = self.signature_functions[tasks[0].name]
        # {task: [label names]} of the tasks that have labels (classification, tagging).
        self.labels = {t.name: list(t.labels) for t in tasks if getattr(t, "labels", None)}


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
    # The config as the export computes: its export_precision is the module's.
    texts = {CONFIG_FILE: json.dumps(dict(json.loads(config_json),
                                          export_precision=module.export_precision),
                                     indent=2, sort_keys=True) + "\n"}
    if module.labels:
        texts[LABELS_FILE] = json.dumps(module.labels, indent=1, ensure_ascii=False)
    with precision.keras_policy(precision.EXPORT_POLICIES[module.export_precision]):
        return save_atomically(module, module.signature_functions, target,
                               extra_files={run_dir.vocab_copy_name(vocab_path): vocab_path},
                               extra_texts=texts)
