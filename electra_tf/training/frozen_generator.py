"""A generator taken from a finished run and frozen: two-stage training and Fast-ELECTRA.

Both start a run whose generator is a fixed, already trained masked LM (`ElectraPretrainer`'s
`frozen_generator`: its own embeddings, no trainable variables, no backward pass; the model
freezes it when it is built, so on every start):

- `two_stage_generator_dir` (the ELECTRA paper's two-stage baseline): stage 1 is an MLM-only
  run of the discriminator's size; its encoder and MLM head become the generator, and its
  encoder also starts the discriminator.
- `frozen_generator_dir` (Fast-ELECTRA, Dong et al., ICLR 2024): the masked LM of any finished
  run of this vocab becomes the generator: an MLM-only run's encoder, an ELECTRA run's generator
  (its embeddings copied out of the block it shared), or Google's released generator imported
  by `python -m electra_tf.convert from-google` (a run directory like any other). The
  discriminator keeps its own initialisation.

The weights are copied at step 0 only (`fresh`): a resumed run reads them from its own
checkpoint, which holds the whole model. On every backend (`capabilities`): the TensorFlow run
reads a source of any backend; a JAX / PyTorch run reads a JAX / PyTorch source's `ckpt-N.npz`
(`run_dir.load_run` needs no TensorFlow for those).
"""

from __future__ import annotations

import logging

import keras

from electra_tf.errors import TrainingError, error_line
from electra_tf.training import run_dir

logger = logging.getLogger("electra_tf")


def start(model, config, vocab_tokens, fresh: bool) -> None:
    """Copies the source run's masked LM into `model`'s frozen generator at step 0 (`fresh`).

    Args:
        model: the ElectraPretrainer, built with `frozen_generator`.
        config: the run's PretrainingConfig (`two_stage_generator_dir` or `frozen_generator_dir`).
        vocab_tokens: the run's vocab tokens; the source's must be the same (the generator's
            samples are token ids).
        fresh: bool. The run starts at step 0 (no checkpoint of its own).

    Raises:
        TrainingError: the source is not a readable run of this vocab, of the right kind, or
            its masked LM does not have this run's generator sizes.
    """
    key = "two_stage_generator_dir" if config.two_stage_generator_dir else "frozen_generator_dir"
    source = getattr(config, key)
    if not fresh:
        return
    backend = keras.backend.backend()
    if backend != "tensorflow" and not run_dir.is_portable_run(source):
        raise TrainingError(f"{key} {source} is not a JAX or PyTorch run (no ckpt-N.npz to "
                            f"read without TensorFlow): --backend {backend} starts from one; "
                            "start from a TensorFlow run with --backend tensorflow")
    try:
        loaded = run_dir.load_run(source, another=f"point {key} at a run that has one")
    except TrainingError as e:
        raise TrainingError(f"{key}: {e}") from None
    two_stage = key == "two_stage_generator_dir"
    if two_stage and loaded.config.electra_objective:
        raise TrainingError(f"two_stage_generator_dir {source} is an ELECTRA run; stage 1 "
                            "is an MLM-only run (electra_objective: false)")
    if loaded.model.generator_head is None:
        raise TrainingError(f"{key} {source} has no masked LM to sample from (uniform_generator)")
    if list(loaded.vocab.tokens) != list(vocab_tokens):
        raise TrainingError(f"{key} {source} was trained with another vocab than this run's: "
                            "its samples would be other tokens' ids")
    encoder = loaded.model.mlm_encoder.get_weights()  # the MLM-only run's encoder, or a generator
    try:
        model.generator.set_weights(encoder)
        model.generator_head.set_weights(loaded.model.generator_head.get_weights())
        if two_stage:
            model.discriminator.set_weights(encoder)
    except ValueError as e:
        raise TrainingError(f"{key} {source} does not match this model's sizes "
                            f"({_sizes(loaded.model.mlm_encoder)} there, "
                            f"{_sizes(model.generator)} here): "
                            f"{error_line(e, whole=True)}") from None
    logger.info("%s: the generator%s starts from %s (step %d) and is frozen", key,
                " and the discriminator" if two_stage else "", source, loaded.step)


def _sizes(encoder) -> str:
    """An encoder's sizes as the hparams that set a generator's."""
    return (f"hidden {encoder.hidden_size}, {encoder.num_hidden_layers} layers, embedding "
            f"{encoder.embedding_size}")
