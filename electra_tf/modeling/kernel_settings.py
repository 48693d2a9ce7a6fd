"""Which kernels and random streams the model traces: four process-wide switches.

Read when a model is traced (`tf.function`, `jax.jit`, or an eager Keras call), so set them
before building the training step: `configure`, the `kernel_options` context manager, or the
ELECTRA_TF_KERNELS / ELECTRA_TF_DROPOUT_RNG / ELECTRA_TF_SAMPLING_RNG / ELECTRA_TF_DENSE_GRAD
environment variables for a whole process (e.g. a run_pretraining.py job).

- `KERNELS`, how the transformer block, the embeddings' LayerNorm + dropout and the
  discriminator head compute their elementwise work:
    "xla" (default)  TensorFlow: op-by-op kernels in inference, XLA-compiled elementwise clusters
                     in training calls (`xla_clusters.py`);
    "tf"             TensorFlow: op-by-op kernels with closed-form gradients (`fused.py`);
    "ops"            `keras.ops` (`ops_kernels.py`), the code every backend runs.
  JAX and PyTorch always run "ops" (the two others are TensorFlow kernels), so on TensorFlow
  "ops" exists to check the fast paths against the portable one.
- `DROPOUT_RNG`: "hash" (default), a counter-based stream keyed by each Dropout layer's seed
  generator, the same bits on every backend and device (`rng.dropout_bits`,
  `dropout_streams.hash_bits`);
  "philox", the backend's own stream as `keras.layers.Dropout` draws it (on TensorFlow exactly
  keras' masks; on JAX and PyTorch their own generators, so other masks than TensorFlow's).
- `SAMPLING_RNG`: the generator's Gumbel noise, "hash" (default) or "philox"
  (`electra_tf.pretraining.sampling`).
- `DENSE_GRAD`: how TensorFlow's fused dense products compute their input gradient, "einsum"
  (default) or "matmul" (`fused.matmul`); the "ops" kernels leave it to the backend.

This module needs no TensorFlow: JAX and PyTorch runs import it, never `fused.py`
(nor dropout_streams.py or xla_clusters.py).
"""

from __future__ import annotations

import contextlib
import os
from typing import Optional

import keras

KERNEL_CHOICES = ("tf", "xla", "ops")
DROPOUT_RNG_CHOICES = ("philox", "hash")
SAMPLING_RNG_CHOICES = ("philox", "hash")
DENSE_GRAD_CHOICES = ("matmul", "einsum")

DEFAULT_KERNELS = "xla"
DEFAULT_DROPOUT_RNG = "hash"
DEFAULT_SAMPLING_RNG = "hash"
DEFAULT_DENSE_GRAD = "einsum"
KERNELS = DEFAULT_KERNELS
DROPOUT_RNG = DEFAULT_DROPOUT_RNG
SAMPLING_RNG = DEFAULT_SAMPLING_RNG
DENSE_GRAD = DEFAULT_DENSE_GRAD
ENVIRONMENT = ("ELECTRA_TF_KERNELS", "ELECTRA_TF_DROPOUT_RNG", "ELECTRA_TF_SAMPLING_RNG",
               "ELECTRA_TF_DENSE_GRAD")


def configure(kernels: Optional[str] = None, dropout_rng: Optional[str] = None,
              sampling_rng: Optional[str] = None, dense_grad: Optional[str] = None) -> None:
    """Sets the kernel implementation and the random streams for models traced from now on.

    Args:
        kernels: "xla", "tf" or "ops" (see the module docstring); None keeps the current.
        dropout_rng: "philox" (the backend's stream) or "hash" (counter-based); None keeps the
            current.
        sampling_rng: the generator's Gumbel noise, "philox" (per-example Philox draws) or "hash"
            (counter-based); None keeps the current.
        dense_grad: how `fused.matmul` computes its input gradient, "matmul" (TensorFlow's
            MatMul gradient) or "einsum"; None keeps the current.

    Raises:
        ValueError: an unknown choice (and nothing is changed).
    """
    global KERNELS, DROPOUT_RNG, SAMPLING_RNG, DENSE_GRAD
    for name, value, choices in (("kernels", kernels, KERNEL_CHOICES),
                                 ("dropout_rng", dropout_rng, DROPOUT_RNG_CHOICES),
                                 ("sampling_rng", sampling_rng, SAMPLING_RNG_CHOICES),
                                 ("dense_grad", dense_grad, DENSE_GRAD_CHOICES)):
        if value is not None and value not in choices:
            raise ValueError(f"{name} must be one of {', '.join(choices)}, got {value!r}")
    if kernels is not None:
        KERNELS = kernels
    if dropout_rng is not None:
        DROPOUT_RNG = dropout_rng
    if sampling_rng is not None:
        SAMPLING_RNG = sampling_rng
    if dense_grad is not None:
        DENSE_GRAD = dense_grad


try:
    configure(*(os.environ.get(name) or None for name in ENVIRONMENT))
except ValueError as error:
    raise ValueError(f"environment variable {' / '.join(ENVIRONMENT)}: {error}") from None


@contextlib.contextmanager
def kernel_options(kernels: Optional[str] = None, dropout_rng: Optional[str] = None,
                   sampling_rng: Optional[str] = None, dense_grad: Optional[str] = None):
    """`configure` for the duration of a `with` block (restores the previous choices)."""
    previous = (KERNELS, DROPOUT_RNG, SAMPLING_RNG, DENSE_GRAD)
    configure(kernels, dropout_rng, sampling_rng, dense_grad)
    try:
        yield
    finally:
        configure(*previous)


def use_tensorflow_kernels() -> bool:
    """Whether a call traced now runs TensorFlow's own kernels (`fused.py`, `xla_clusters.py`):
    the TensorFlow backend and KERNELS "tf" or "xla". False means the `keras.ops` kernels
    (`ops_kernels.py`)."""
    return keras.backend.backend() == "tensorflow" and KERNELS != "ops"


def use_xla(training) -> bool:
    """Whether a call traced now runs its elementwise work in XLA clusters: TensorFlow, KERNELS
    "xla" and a training call. Inference (training False: evaluation, export, fine-tuned serving)
    runs the op-by-op kernels, so a SavedModel never needs the XLA JIT."""
    return use_tensorflow_kernels() and KERNELS == "xla" and bool(training)

