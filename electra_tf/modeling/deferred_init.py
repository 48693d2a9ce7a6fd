"""JAX: a model's variables built from shapes and initialized in a few compiled calls.

Keras on JAX runs eagerly outside `jit`: building a model by calling it on a dummy batch runs
the forward pass op by op, and each variable's initializer runs op by op too. Every eager op of
a new shape is an XLA compilation of its own (about 350 for ELECTRA-small, most of its build
time on a CPU; the 39 s of ELECTRA-base's build on an H100, issue 45). Here:

- `build_by_shapes(call)` runs the build call under `jax.eval_shape` (abstract values: no op
  runs, nothing compiles), with the variables it creates deferred (Keras' `StatelessScope`);
- `deferred_variables()` defers the variables created inside it and, on leaving, initializes
  them with one compiled program per initializer signature (class, configuration without the
  seed, shape, dtype), the integer seed passed in as an argument: ELECTRA-small's 475
  variables in 27 programs. Each value is the initializer's own, computed by the same XLA ops
  (the seed is the array `keras.random` draws from it), so the weights equal the eager build's
  (bit for bit on CPU: tests/modeling/test_deferred_init.py).

Variables Keras initializes its own way keep it (`_deferred_initialize`): those Keras makes in
place on their devices (`_sharded_at_init`: under a `keras.distribution`, a layout-aware
initializer or a table too large to be made on one device first; a replicated variable is made
here and distributed, as Keras does), an initializer that is not a Keras `Initializer` (seed
generator states: a constant, no compilation) or one seeded by a `SeedGenerator` (stateful).
On TensorFlow and PyTorch both are no-ops around the eager path.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import copy
import inspect
import json
import os
from typing import Any, Callable, Dict, List, Optional, Tuple

import keras

# Compiled initializers by signature, shared by every build of the process (a second model of
# the same sizes compiles nothing).
_COMPILED: Dict[Tuple, Any] = {}


def _jax() -> bool:
    return keras.backend.backend() == "jax"


@contextlib.contextmanager
def deferred_variables():
    """Defers the variables created inside (JAX) and initializes them on leaving, a compiled
    program per initializer signature. Nested uses initialize once, at the outermost exit; on
    other backends it does nothing.

    Inside, a new variable has no value yet: only build (create variables, `build_by_shapes`)
    there; reading or assigning a variable created inside raises or is lost.
    """
    from keras.src.backend.common.stateless_scope import in_stateless_scope

    if not _jax() or in_stateless_scope():
        yield
        return
    completed = False
    try:
        with keras.StatelessScope(initialize_variables=False):
            yield
        completed = True
    finally:
        # Also after an error, so no variable is left without a value for the next build.
        _initialize_pending(compile_in_parallel=completed)


def build_by_shapes(call: Callable[[], Any]) -> None:
    """Runs `call()` (a call of the model that creates its variables) for its variables only:
    on JAX under `jax.eval_shape` in `deferred_variables()` (no op runs); elsewhere eagerly."""
    if not _jax():
        call()
        return
    import jax  # lazy: JAX is an optional backend, only this path needs it

    def abstract():
        with keras.StatelessScope(initialize_variables=False):
            call()
        return 0

    with deferred_variables():
        jax.eval_shape(abstract)


def _pending() -> List[Any]:
    from keras.src.backend.common import global_state

    pending = global_state.get_global_attribute("uninitialized_variables") or []
    global_state.set_global_attribute("uninitialized_variables", [])
    return [v for v in pending if v._value is None]


def _signature(variable) -> Optional[Tuple]:
    """The key of the compiled program that initializes `variable`, or None where Keras' own
    initialization is kept."""
    initializer = variable._initializer
    if not isinstance(initializer, keras.initializers.Initializer) or _sharded_at_init(variable):
        return None
    seed = getattr(initializer, "seed", None)
    if seed is not None and not isinstance(seed, int):
        return None  # a SeedGenerator: stateful, Keras draws from it
    try:
        settings = {k: v for k, v in initializer.get_config().items() if k != "seed"}
        settings = json.dumps(settings, sort_keys=True)
    except (TypeError, ValueError, NotImplementedError):
        return None
    import jax  # lazy: JAX is an optional backend, only this path needs it

    # The device a program was compiled for (`jax.default_device` may change between builds).
    return (type(initializer), settings, tuple(variable._shape), variable._dtype,
            str(jax.config.jax_default_device), seed is not None)


def _sharded_at_init(variable) -> bool:
    """Whether Keras initializes `variable` in place on its devices (a layout-aware initializer,
    or one too large to be made on one device first): `JaxVariable._initialize_with_initializer`'s
    own tests. Any other variable with a layout (`DataParallel`: replicated) is made on the
    default device and distributed, which `_initialize` does for a value computed here too."""
    # lazy: Keras' JAX backend, importable only under it
    from keras.src.backend.jax.core import should_shard_at_init
    from keras.src.distribution.distribution_lib import TensorLayout

    variable._initialize_layout()
    layout = variable._layout
    if layout is None:
        return False
    if "layout" in inspect.signature(variable._initializer).parameters:
        return True
    backend_layout = layout.backend_layout if isinstance(layout, TensorLayout) else layout
    return should_shard_at_init(backend_layout, variable._shape)


def _seed_array(initializer):
    """The [2] seed array `keras.random` draws an integer seed's values from."""
    from keras.src.random.seed_generator import draw_seed

    return draw_seed(initializer.seed)


def _lower(variable, seeded: bool):
    import jax  # lazy: JAX is an optional backend, only this path needs it

    initializer, shape, dtype = variable._initializer, variable._shape, variable._dtype
    if seeded:
        def init(seed):
            own = copy.copy(initializer)
            own.seed = seed  # an array: keras.random uses it as the drawn seed
            return own(shape, dtype=dtype)

        return jax.jit(init).lower(_seed_array(initializer))
    return jax.jit(lambda: initializer(shape, dtype=dtype)).lower()


def _initialize_pending(compile_in_parallel: bool = True) -> None:
    groups: Dict[Tuple, List[Any]] = {}
    for variable in _pending():
        key = _signature(variable)
        if key is None:
            variable._deferred_initialize()
        else:
            groups.setdefault(key, []).append(variable)
    missing = [key for key in groups if key not in _COMPILED]
    # Traced here (Keras' scopes are thread-local), compiled on threads: XLA compiles without
    # the GIL, so a many-core GPU host compiles the programs side by side.
    lowered = [_lower(groups[key][0], key[-1]) for key in missing]
    workers = min(len(lowered), os.cpu_count() or 1, 8) if compile_in_parallel else 1
    if workers > 1:
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            compiled = list(pool.map(lambda low: low.compile(), lowered))
    else:
        compiled = [low.compile() for low in lowered]
    _COMPILED.update(zip(missing, compiled))
    for key, variables in groups.items():
        program = _COMPILED[key]
        for variable in variables:
            value = (program(_seed_array(variable._initializer)) if key[-1] else program())
            variable._initialize(variable._convert_to_tensor(value))
            variable._initializer = None
