"""SavedModel export of the discriminator (what users keep) and of the generator.

`model_dir/export/discriminator/STEP/` (a numeric version folder, the exported global step, as
TF Serving's `--model_base_path=.../export/discriminator` expects; older versions are removed
once the new one is complete) serves two signatures:
- `serving_default`: int32 `input_ids`, `input_mask`, `segment_ids` [batch, seq] ->
  `replaced_probs` [batch, seq] (probability each token was replaced) and `sequence_output`
  [batch, seq, hidden];
- `serve_text`: a batch of raw strings, tokenized in-graph exactly as the dataset builder does
  (tensorflow-text, with the `do_lower_case` / `strip_accents` recorded in the dataset
  manifest, see `run_dir.tokenization_settings`), packed as `[CLS] tokens [SEP]`, truncated to
  max_seq_length and padded to the longest in the batch -> the same outputs plus the
  `input_ids` and `input_mask` used.

`model_dir/export/generator/STEP/` serves `serving_default` -> `mlm_logits` [batch, seq, vocab]
(masked-LM logits at every position; feed [MASK] where you want predictions).

Both are also TF Hub reusable SavedModels (`hub.ReusableModule`): `model(inputs, training=...)`,
`model.variables`, `model.trainable_variables`, `model.regularization_losses`, so the loaded
discriminator can be fine-tuned under a GradientTape.

Both compute in `export_precision` (float32 by default, whatever `mixed_precision` trained in:
`precision.in_export_precision`; "bfloat16" on request), recorded in `assets.extra/config.json`
(the run's config.json, with the export's `export_precision`) beside the vocab.

Loading needs only TensorFlow (and `import tensorflow_text` for `serve_text`'s ops). Each export
is written to a temporary directory and renamed into place, so a crash never leaves a half
SavedModel; re-exporting the same run replaces the previous export of that run.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
from typing import Optional

import tensorflow as tf

from electra_tf import precision
from electra_tf.atomic import atomic_path
from electra_tf.config import PretrainingConfig
from electra_tf.data.text.tokenization import Tokenizer
from electra_tf.errors import TrainingError, error_line, shown_path
from electra_tf.training import preemption, run_dir
from electra_tf.training.tf import hub
from electra_tf.vocab import Vocab

logger = logging.getLogger("electra_tf")

EXTRA_DIR = "assets.extra"  # SavedModel convention for files beside the model


def int_spec(name):
    """int32 [batch, seq] token-id input of the serving signatures."""
    return tf.TensorSpec([None, None], tf.int32, name=name)


def rtd_outputs(encoder, head, inputs, training) -> dict:
    """{"sequence_output" [b, s, hidden], "replaced_logits" and "replaced_probs" [b, s]} (float32)
    of the discriminator encoder + RTD head: `serving_default`'s computation, also what the ONNX
    export converts."""
    sequence_output = encoder(inputs, training=training)["sequence_output"]
    logits = tf.cast(head(sequence_output), tf.float32)
    return {"sequence_output": tf.cast(sequence_output, tf.float32),
            "replaced_logits": logits, "replaced_probs": tf.sigmoid(logits)}


class DiscriminatorModule(hub.ReusableModule):
    """The discriminator encoder + RTD head, with a raw-text front end."""

    def __init__(self, encoder, head, tokenizer: Tokenizer, max_seq_length: int):
        super().__init__(name="electra_discriminator")
        self.encoder = encoder
        self.head = head
        self.graph_tokenizer = tokenizer.graph_tokenizer()
        self._cls_id = tokenizer.vocab.special.cls_id
        self._sep_id = tokenizer.vocab.special.sep_id
        self._max_seq_length = max_seq_length
        self.track([encoder, head])

    def call(self, inputs, training):
        """{"sequence_output" [b, s, hidden], "replaced_logits" and "replaced_probs" [b, s]}."""
        return rtd_outputs(self.encoder, self.head, inputs, training)

    @tf.function(input_signature=[int_spec("input_ids"), int_spec("input_mask"),
                                  int_spec("segment_ids")])
    def serve(self, input_ids, input_mask, segment_ids):
        outputs = self.call({"input_ids": input_ids, "input_mask": input_mask,
                             "segment_ids": segment_ids}, training=False)
        return {k: outputs[k] for k in ("replaced_probs", "sequence_output")}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
    def serve_text(self, text):
        pieces = self.graph_tokenizer.tokenize(text)  # ragged [batch, (tokens)]
        pieces = tf.cast(pieces[:, : self._max_seq_length - 2], tf.int32)
        batch = pieces.nrows()
        cls = tf.fill([batch, 1], self._cls_id)
        sep = tf.fill([batch, 1], self._sep_id)
        ids = tf.concat([cls, pieces, sep], axis=1)
        input_ids = ids.to_tensor(default_value=0)
        input_mask = tf.ones_like(ids).to_tensor(default_value=0)
        outputs = self.serve(input_ids, input_mask, tf.zeros_like(input_ids))
        outputs.update({"input_ids": input_ids, "input_mask": input_mask})
        return outputs


class GeneratorModule(hub.ReusableModule):
    """The masked-LM encoder + head at every position."""

    def __init__(self, encoder, head):
        super().__init__(name="electra_generator")
        self.encoder = encoder
        self.head = head
        self.track([encoder, head])

    def call(self, inputs, training):
        """{"mlm_logits" [b, s, vocab]}."""
        hidden = self.encoder(inputs, training=training)["sequence_output"]
        table = self.encoder.embeddings.word_embeddings.embeddings
        return {"mlm_logits": tf.cast(self.head(hidden, table), tf.float32)}

    @tf.function(input_signature=[int_spec("input_ids"), int_spec("input_mask"),
                                  int_spec("segment_ids")])
    def serve(self, input_ids, input_mask, segment_ids):
        return self.call({"input_ids": input_ids, "input_mask": input_mask,
                          "segment_ids": segment_ids}, training=False)


def save_atomically(module: tf.Module, signatures: dict, target: str, extra_files: dict,
                    extra_texts: Optional[dict] = None) -> str:
    """Saves a SavedModel to `target` via a temporary directory and a rename (`atomic_path`).

    Args:
        module: the tf.Module to save.
        signatures: {name: tf.function} serving signatures.
        target: str. Export directory; an existing one is replaced only once the new one is
            complete, so a crash never leaves a half SavedModel.
        extra_files: {file name: source path} copied into `assets.extra/`.
        extra_texts: {file name: text} written into `assets.extra/`.

    Returns:
        target.

    Raises:
        TrainingError: the export cannot be written (a full disk, a read-only directory); the
            staging directory is removed and a previous export is left as it was.
        preemption.Interrupted: a SIGTERM while the staging directory was written (a run's
            `SigtermWatch`); it is removed likewise.
    """
    tf_logger = logging.getLogger("tensorflow")
    tf_level = tf_logger.level
    try:
        with atomic_path(target, directory=True) as staging:
            # While saving, TensorFlow warns about every captured constant's auto-generated name
            # (thousands for the tokenizer's tables) and logs each asset: harmless, kept quiet.
            tf_logger.setLevel(max(tf_level, logging.ERROR))
            # A SIGTERM while the staging directory is written abandons it (removed by
            # atomic_path); not around the rename, which must not be cut in two.
            with preemption.interruptible():
                if isinstance(module, hub.ReusableModule):
                    module.trace_call()
                tf.saved_model.save(module, staging, signatures=signatures)
                extra = os.path.join(staging, EXTRA_DIR)
                os.makedirs(extra, exist_ok=True)
                for name, source in extra_files.items():
                    shutil.copyfile(source, os.path.join(extra, name))
                for name, text in (extra_texts or {}).items():
                    with open(os.path.join(extra, name), "w", encoding="utf-8") as f:
                        f.write(text)
    except (OSError, tf.errors.OpError) as e:  # a full disk is a ResourceExhaustedError
        raise TrainingError(f"cannot write the export {shown_path(target)} ({error_line(e)}); "
                            "free space there and rerun with do_train false to export "
                            "again") from None
    finally:
        tf_logger.setLevel(tf_level)
    return target


def export_all(model, vocab: Vocab, config: PretrainingConfig, step: int = 0) -> dict:
    """Exports the discriminator (ELECTRA objective) and the masked-LM generator.

    Args:
        model: a built `ElectraPretrainer`.
        vocab: the run's `Vocab`.
        config: the run's `PretrainingConfig` (for max_seq_length and the paths).
        step: int. The global step of the weights: the version folder's name.

    Returns:
        {"discriminator": path or None, "generator": path or None}: the version folders
        `export/<network>/<step>` written.
    """
    export_dir = os.path.join(config.model_dir, run_dir.EXPORT_DIR)
    extra = {run_dir.vocab_copy_name(vocab.path): vocab.path}
    texts = {run_dir.CONFIG_NAME: _config_copy(config)}
    # float32 by default whatever the run trained in (a bf16 SavedModel would disagree with the
    # Hugging Face and ONNX exports of the same weights); the layers an export builds (GDES's
    # merged embeddings) take the same policy.
    model = precision.in_export_precision(model, config.export_precision,
                                          finish=lambda copy: copy.build_from_sequence_length())
    with precision.keras_policy(precision.EXPORT_POLICIES[config.export_precision]):
        return _export_networks(model, vocab, config, step, export_dir, extra, texts)


def _config_copy(config: PretrainingConfig) -> str:
    """`assets.extra/config.json`: the run's config.json (else the config in memory) with the
    `export_precision` this export computes in (an export-only run may ask for another than
    training did)."""
    try:
        with open(os.path.join(config.model_dir, run_dir.CONFIG_NAME), encoding="utf-8") as f:
            saved = json.load(f)
    except (OSError, ValueError):  # none (a model exported by a script), or damaged since
        saved = config.to_dict()
    saved["export_precision"] = config.export_precision
    return json.dumps(saved, indent=2, sort_keys=True) + "\n"


def _export_networks(model, vocab: Vocab, config: PretrainingConfig, step: int, export_dir: str,
                     extra: dict, texts: dict) -> dict:
    """`export_all`'s SavedModels of `model` (already in the export's precision)."""
    save = functools.partial(save_atomically, extra_texts=texts)
    paths = {"discriminator": None, "generator": None}
    if model.discriminator_head is not None:
        settings = run_dir.tokenization_settings(config)
        logger.info("serve_text tokenises with do_lower_case=%s, strip_accents=%s (from %s)",
                    settings.do_lower_case, settings.strip_accents, settings.source)
        tokenizer = Tokenizer(vocab, do_lower_case=settings.do_lower_case,
                              strip_accents=settings.strip_accents)
        # Under GDES, a discriminator whose embedding block holds the merged tables (the same
        # outputs, the variables of a tied discriminator: fine-tuning reads them as such).
        module = DiscriminatorModule(model.exported_discriminator(), model.discriminator_head, tokenizer,
                                     config.max_seq_length)
        paths["discriminator"] = hub.save_version(
            save, module,
            {"serving_default": module.serve, "serve_text": module.serve_text},
            os.path.join(export_dir, "discriminator"), step, extra)
    if model.generator_head is not None:
        module = GeneratorModule(model.mlm_encoder, model.generator_head)
        paths["generator"] = hub.save_version(
            save, module, {"serving_default": module.serve},
            os.path.join(export_dir, "generator"), step, extra)
    return paths
