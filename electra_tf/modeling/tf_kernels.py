"""TensorFlow's kernel modules, loaded when a layer traces its TensorFlow path.

The layers (`embeddings.py`, `transformer_layer.py`, `heads.py`) ask `kernel_settings` which
path a call traces; on the TensorFlow one they call `load()` here for TensorFlow and the kernel
modules. Those modules read their switches from `kernel_settings`, so the loader lives apart
from the switches: `kernel_settings` imports none of them, and JAX and PyTorch runs import
neither TensorFlow nor them.
"""

from __future__ import annotations


def load():
    """(tensorflow, fused, dropout_streams, xla_clusters): TensorFlow and its kernel modules
    (op-by-op kernels, dropout draws, XLA clusters), imported on the first TensorFlow kernel
    path traced."""
    import tensorflow as tf

    # lazy: TensorFlow is optional here (JAX and PyTorch runs never take this path)
    from electra_tf.modeling import dropout_streams, fused, xla_clusters
    return tf, fused, dropout_streams, xla_clusters
