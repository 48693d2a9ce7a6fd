"""Frees the traced graphs that TensorFlow's custom-gradient registry would keep forever.

Every time a function using `tf.custom_gradient` is traced (electra-tf's fused XLA kernels and its
MLM loss use it: dozens of registrations per traced training step), TensorFlow registers the
gradient in a process-wide registry under a fresh name, `CustomGradient-<uid>`, and never removes
it. The registered closure holds tensors of the traced graph, so the whole graph (its operations,
shapes and captured constants) outlives the model it belongs to (tensorflow/tensorflow#97697, still
so in TF 2.21). One ELECTRA training run in a process leaks nothing that matters; several in one
process (fine-tuning trials, a notebook, a sweep, a test suite) add up: each ELECTRA-small run
left ~350 MiB behind (benchmarks/graph_memory.py), which `keras.backend.clear_session()` does not
free.

`custom_gradients_released()` removes, when its block ends, the registrations made inside it.
The library wraps each pretraining `run` and each fine-tuning trial in it.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Iterator, Optional

logger = logging.getLogger("electra_tf")

_PREFIX = "CustomGradient-"  # the names tf.custom_gradient registers (graph mode)


def _registry() -> Optional[dict]:
    """TensorFlow's gradient registry (name -> entry), or None if this TensorFlow has none where
    expected (then nothing is released: the leak is TensorFlow's as before, never an error)."""
    try:
        from tensorflow.python.framework import ops
    except ImportError:
        return None
    registry = getattr(getattr(ops, "_gradient_registry", None), "_registry", None)
    return registry if isinstance(registry, dict) else None


def registered_custom_gradients() -> int:
    """How many custom gradients the process's registry holds now (0 if it cannot be read)."""
    registry = _registry()
    return 0 if registry is None else sum(1 for name in list(registry) if name.startswith(_PREFIX))


@contextlib.contextmanager
def custom_gradients_released() -> Iterator[None]:
    """Removes the custom gradients registered inside the block when it ends (also on error).

    Use it around work whose models are dropped at its end: a function traced inside the block
    cannot be differentiated from outside once it ends (a gradient taken inside a traced function,
    as every training step does, is complete when the trace ends). Registrations made outside the
    block, before or after, are kept, so nesting is fine; a model traced in another thread while
    the block runs loses its registrations too, so do not share the block with concurrent tracing.
    """
    registry = _registry()
    before = set(registry) if registry is not None else set()
    try:
        yield
    finally:
        if registry is not None:
            added = [name for name in list(registry) if name.startswith(_PREFIX)
                     and name not in before]
            for name in added:
                registry.pop(name, None)
            if added:
                logger.debug("released %d custom-gradient registrations", len(added))
