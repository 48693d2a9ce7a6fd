"""`mixed_precision: "auto"`: the fastest correct precision for the device a run meets.

bfloat16 halves the matmuls' memory traffic and, where the hardware multiplies bf16 natively,
doubles (AVX512_BF16) or multiplies many times over (AMX, tensor cores, TPU MXUs) their speed.
Where it does not, TensorFlow emulates it: on an AMD EPYC Zen 3 (AVX2 + FMA, no AVX-512)
every bf16 MatMul ran in Eigen's scalar `TensorContraction<bfloat16>` and ELECTRA-small
pretraining at batch 32 ran at 1.0 sequences/s against 7.3 in float32 (issue 30; 1.9 against
12.4 with oneDNN's float32 kernels, `electra_tf/onednn.py`). So one
command line must not mean one precision on every machine: `auto` decides per device.

The decision table (`resolve`, a pure function of the requested policy and the `DeviceFacts`):

| device                                         | auto picks                                        |
|------------------------------------------------|---------------------------------------------------|
| TPU                                            | mixed_bfloat16 (the MXU multiplies bf16)          |
| GPU, compute capability >= 8.0 (A100, H100...) | mixed_bfloat16                                    |
| GPU, compute capability < 8.0 (V100, T4...)    | mixed_float16 with dynamic loss scaling (float32  |
|                                                | where the caller has no loss scaling)             |
| CPU with AMX (amx_bf16) or AVX512_BF16, under  | mixed_bfloat16 (oneDNN's native bf16 kernels)     |
| TensorFlow or PyTorch                          |                                                   |
| CPU under JAX (XLA:CPU), whatever its flags    | float32 (no native bf16 kernels: not faster)      |
| any other CPU, or CPU flags unreadable         | float32                                           |

An explicit policy is always honoured; on a device without native support for it a warning
says so once per process (`warn_if_slow`), naming the device and the measured slowdown.

XLA:CPU, JAX's CPU backend, multiplies bf16 with its own kernels, not oneDNN's AVX512_BF16 /
AMX ones (and electra-tf turns its YNNPACK fusions off: `portable_runner.cpu_compiler_options`),
so bf16 buys nothing there and costs casts: on a 2-core AMD EPYC Zen 4 with AVX512_BF16,
ELECTRA-small pretraining on JAX ran 10.7 sequences/s in bf16 against 11.2 in float32, and a
fine-tuning step took 3.9-4.3 s of CPU time against 3.7-3.8 (docs/benchmarks.md); with the
malloc tunables the tools now start JAX with (`malloc_tunables`), 13.4 against 13.1 sequences/s
and 1879 against 1779 ms of wall time per fine-tuning step: no faster either way. So `auto`
picks float32 for JAX on any CPU (float32 numerics at the same speed); an explicit
mixed_bfloat16 there runs, with the warning.
PyTorch's CPU matmuls are oneDNN's: there the same fine-tuning step took 1.6-1.8 s of wall
time in bf16 against 2.3 s in float32, so PyTorch keeps TensorFlow's rule.

`detect` reads the facts of the device TensorFlow will run on: a TPU strategy, else the GPUs
TensorFlow sees (the lowest compute capability among them: every replica runs the same
policy), else the CPU's flags from /proc/cpuinfo; `detect_keras_backend` those of the device
JAX or PyTorch runs on.

Exports compute in `export_precision` (float32 by default) whatever the run trained in:
`in_export_precision` gives the exporter a copy of the model under that policy.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from typing import Any, Callable, Iterable, Iterator, Optional, Tuple

from electra_tf.console import KERAS_BACKENDS

logger = logging.getLogger("electra_tf")

AUTO = "auto"
POLICIES = ("float32", "mixed_bfloat16", "mixed_float16")
CPU_INFO = "/proc/cpuinfo"
# The CPU flags (as Linux names them in /proc/cpuinfo) under which oneDNN multiplies bf16
# natively: AMX tiles (Sapphire Rapids and later) or AVX512_BF16 (Cooper Lake, Zen 4 and later).
NATIVE_BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")
# Tensor cores multiply bf16 from Ampere (compute capability 8.0) on.
MIN_BF16_COMPUTE_CAPABILITY = (8, 0)
# What the emulation costs, as measured (issue 30; docs/benchmarks.md): quoted in the warnings.
EMULATED_BF16_SLOWDOWN = ("~7x slower than float32 (ELECTRA-small pretraining at batch 32 on an "
                          "AMD EPYC Zen 3: 1.9 against 12.4 sequences/s)")
# What bf16 does on XLA:CPU (JAX), as measured on an AVX512_BF16 CPU (docs/benchmarks.md).
XLA_CPU_BF16 = ("JAX's CPU backend (XLA:CPU) has no native bf16 matmul kernels: bf16 is no faster "
                "than float32 there (ELECTRA-small on an AVX512_BF16 AMD EPYC: pretraining 13.4 "
                "against 13.1 sequences/s, a fine-tuning step 1879 against 1779 ms)")


# The tools' `--help` paragraph on the mixed_precision hparam.
AUTO_HELP = ('mixed_precision "auto" (the default) picks the fastest correct precision for the '
             "device and prints it at start (config.json records it): mixed_bfloat16 on a TPU, "
             "a GPU of compute capability 8.0 or more, or a CPU with AMX or AVX512_BF16 (read "
             "from /proc/cpuinfo) under TensorFlow or PyTorch; mixed_float16 with dynamic loss "
             "scaling on older GPUs (pretraining; fine-tuning takes float32 there); float32 on "
             "any other CPU, where bf16 is emulated (~7x slower), and on every CPU under JAX, "
             "whose CPU backend has no native bf16 kernels. An explicit float32, mixed_bfloat16 or "
             "mixed_float16 is always used as given, with a warning where the device emulates it.")


@dataclasses.dataclass(frozen=True)
class DeviceFacts:
    """What the precision decision needs to know of the device a run trains on.

    Attributes:
        kind: str. "cpu", "gpu" or "tpu".
        name: str. The device's name as shown to the user ("AMD EPYC", "NVIDIA H100 80GB HBM3").
        cpu_flags: frozenset of str. The CPU's feature flags (Linux names); None if unreadable.
        compute_capability: (major, minor) of the GPU (the lowest of several), else None.
        backend: str. The Keras backend that computes on it ("tensorflow", "jax", "torch"): on
            a CPU it decides whose kernels multiply (oneDNN's or XLA:CPU's).
    """

    kind: str
    name: str
    cpu_flags: Optional[frozenset] = None
    compute_capability: Optional[Tuple[int, int]] = None
    backend: str = "tensorflow"

    def __post_init__(self):
        if self.kind not in ("cpu", "gpu", "tpu"):
            raise ValueError(f"device kind must be cpu, gpu or tpu, got {self.kind!r}")
        if self.backend not in KERAS_BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(KERAS_BACKENDS)}, got "
                             f"{self.backend!r}")

    def describe(self) -> str:
        """The device in a few words, for the decision's reason and warnings."""
        if self.kind == "gpu" and self.compute_capability is not None:
            major, minor = self.compute_capability
            return f"GPU {self.name} (compute capability {major}.{minor})"
        return f"{self.kind.upper()} {self.name}".strip()


@dataclasses.dataclass(frozen=True)
class PrecisionChoice:
    """The policy a run uses, and why.

    Attributes:
        requested: str. The `mixed_precision` setting ("auto" or a policy).
        policy: str. The Keras dtype policy to set ("float32", "mixed_bfloat16", ...).
        reason: str. One clause saying why (what auto saw, or "set explicitly").
        slow: str or None. Why the policy is slow on this device (an explicit policy the device
            lacks native support for), else None.
    """

    requested: str
    policy: str
    reason: str
    slow: Optional[str] = None

    def line(self) -> str:
        """The one line printed at the start of a run."""
        return f"precision: {self.policy} ({self.reason})"


def native_bf16(facts: DeviceFacts) -> Tuple[bool, str]:
    """Whether the device multiplies bf16 natively, and the fact that decides it.

    Returns:
        (native, because): `because` is a clause naming the flag or capability seen.
    """
    if facts.kind == "tpu":
        return True, "TPUs multiply bf16 natively"
    if facts.kind == "gpu":
        if facts.compute_capability is None:
            return False, f"{facts.describe()} reports no compute capability"
        native = tuple(facts.compute_capability) >= MIN_BF16_COMPUTE_CAPABILITY
        return native, (f"{facts.describe()} {'has' if native else 'lacks'} native bf16 "
                        f"(compute capability 8.0 and above)")
    if facts.backend == "jax":
        return False, f"{facts.describe()}: {XLA_CPU_BF16}"
    if facts.cpu_flags is None:
        return False, f"{facts.describe()}: CPU flags unreadable, native bf16 unknown"
    seen = [flag for flag in NATIVE_BF16_CPU_FLAGS if flag in facts.cpu_flags]
    if seen:
        return True, f"{facts.describe()} has {seen[0].upper()}: native bf16 matmuls"
    return False, (f"{facts.describe()} has no AVX512_BF16 or AMX: bf16 matmuls would be "
                   f"emulated, {EMULATED_BF16_SLOWDOWN}")


def resolve(requested: str, facts: DeviceFacts,
            allowed: Iterable[str] = POLICIES) -> PrecisionChoice:
    """Turns the `mixed_precision` setting into the policy to use on `facts`' device.

    Args:
        requested: "auto" or one of `allowed`.
        facts: the device (see `detect`).
        allowed: the policies the caller can run (fine-tuning has no loss scaling, so no
            mixed_float16): auto never picks another.

    Returns:
        A PrecisionChoice; `slow` is set when an explicit policy is emulated on this device.

    Raises:
        ValueError: `requested` is neither "auto" nor an allowed policy.
    """
    allowed = tuple(allowed)
    if requested != AUTO and requested not in allowed:
        raise ValueError(f"mixed_precision must be one of {', '.join((AUTO,) + allowed)}, "
                         f"got {requested!r}")
    native, because = native_bf16(facts)
    if requested != AUTO:
        return PrecisionChoice(requested, requested, "set explicitly",
                               _slow_reason(requested, facts, native, because))
    if native and "mixed_bfloat16" in allowed:
        return PrecisionChoice(AUTO, "mixed_bfloat16", f"auto: {because}")
    if facts.kind == "gpu" and facts.compute_capability is not None:
        if "mixed_float16" in allowed:
            return PrecisionChoice(AUTO, "mixed_float16",
                                   f"auto: {because}; float16 with dynamic loss scaling")
        return PrecisionChoice(AUTO, "float32", f"auto: {because}; float16 needs loss scaling, "
                                                "which this tool does not do")
    return PrecisionChoice(AUTO, "float32", f"auto: {because}")


def _slow_reason(policy: str, facts: DeviceFacts, native: bool, because: str) -> Optional[str]:
    if policy == "mixed_bfloat16" and not native:
        return because
    if policy == "mixed_float16" and facts.kind in ("cpu", "tpu"):
        return (f"{facts.describe()} has no fast float16 matmuls (float16 is a GPU format; "
                f"TensorFlow emulates it here)")
    return None


_warned = set()


def warn_if_slow(choice: PrecisionChoice) -> bool:
    """Logs one warning per process and (policy, reason) when `choice` is emulated here.

    Returns:
        True if a warning was logged by this call.
    """
    if choice.slow is None or (choice.policy, choice.slow) in _warned:
        return False
    _warned.add((choice.policy, choice.slow))
    logger.warning("mixed_precision %s runs, but slowly: %s; \"mixed_precision\": \"auto\" picks "
                   "the fastest precision for this device", choice.policy, choice.slow)
    return True


# --- Reading the device -----------------------------------------------------------------------
def read_cpu(path: str = CPU_INFO) -> Tuple[str, Optional[frozenset]]:
    """The CPU's model name and flags from a Linux /proc/cpuinfo (its first processor).

    Returns:
        (name, flags): flags is None when the file is missing or lists none (not Linux, or an
        architecture that names them otherwise): native bf16 is then taken as absent.
    """
    name, flags = "", None
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and not name:
                    name = " ".join(value.split())
                elif key == "flags" and flags is None:
                    flags = frozenset(value.split())
                if not line.strip() and (name or flags):
                    break  # the first processor's block is enough
    except OSError:
        pass
    return name or _platform_cpu_name(), flags


def recorded_cpu_flags(flags: Optional[Iterable[str]]) -> list:
    """The AVX-512 and AMX flags among `flags`, sorted: what `grep -o
    'avx512[a-z_0-9]*\\|amx[a-z_0-9]*' /proc/cpuinfo | sort -u` prints, the CPU record every
    benchmark figure carries (docs/benchmarks.md).

    Args:
        flags: a CPU's flags (`read_cpu`'s), or None when unreadable.
    """
    return sorted(f for f in flags or () if f.startswith(("avx512", "amx")))


def _platform_cpu_name() -> str:
    import platform

    return platform.processor() or platform.machine() or "unknown"


def detect(strategy=None, cpu_info: str = CPU_INFO) -> DeviceFacts:
    """The facts of the device TensorFlow trains on (see the module docstring).

    Args:
        strategy: the run's tf.distribute.Strategy, or None (the default device).
        cpu_info: where to read the CPU's flags.
    """
    import tensorflow as tf

    if strategy is not None and isinstance(strategy, (tf.distribute.TPUStrategy,)):
        return DeviceFacts("tpu", "")
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        details = [tf.config.experimental.get_device_details(gpu) for gpu in gpus]
        capabilities = [tuple(d["compute_capability"]) for d in details
                        if d.get("compute_capability")]
        names = sorted({d.get("device_name", "") for d in details} - {""})
        return DeviceFacts("gpu", ", ".join(names) or f"{len(gpus)} GPU(s)",
                           compute_capability=min(capabilities) if capabilities else None)
    name, flags = read_cpu(cpu_info)
    return DeviceFacts("cpu", name, cpu_flags=flags)


def detect_keras_backend(backend: str, cpu_info: str = CPU_INFO) -> DeviceFacts:
    """The facts of the device Keras trains on with the JAX or PyTorch backend (no TensorFlow).

    Args:
        backend: "jax" or "torch" (recorded in the facts: on a CPU it decides `native_bf16`).
        cpu_info: where to read the CPU's flags.
    """
    if backend == "jax":
        import jax

        device = jax.devices()[0]
        if device.platform == "tpu":
            return DeviceFacts("tpu", getattr(device, "device_kind", ""), backend=backend)
        if device.platform == "gpu":
            capability = getattr(device, "compute_capability", None)
            parsed = tuple(int(x) for x in str(capability).split(".")[:2]) if capability else None
            return DeviceFacts("gpu", getattr(device, "device_kind", "GPU"),
                               compute_capability=parsed, backend=backend)
    elif backend == "torch":
        import torch

        if torch.cuda.is_available():
            return DeviceFacts("gpu", torch.cuda.get_device_name(0),
                               compute_capability=tuple(torch.cuda.get_device_capability(0)),
                               backend=backend)
    name, flags = read_cpu(cpu_info)
    return DeviceFacts("cpu", name, cpu_flags=flags, backend=backend)


def choose(requested: str, strategy=None, allowed: Iterable[str] = POLICIES,
           facts: Optional[DeviceFacts] = None) -> PrecisionChoice:
    """`resolve` on this machine's device (`facts`, by default TensorFlow's: `detect`), with its
    start line logged and any warning once."""
    choice = resolve(requested, facts or detect(strategy), allowed)
    logger.info("%s", choice.line())
    warn_if_slow(choice)
    return choice



# --- Exports ----------------------------------------------------------------------------------
# What an export computes in, whatever the run trained in (`export_precision`, an hparam of
# pretraining and fine-tuning): float32 by default, so a SavedModel says what its weights say
# (issue 47: a bf16-trained run's SavedModel differed from the Hugging Face export of the same
# weights by 2.3e-3 in the replaced-token probabilities), or bfloat16 on request (the Keras
# policy mixed_bfloat16: float32 weights, bf16 matmuls, float32 outputs).
EXPORT_PRECISIONS = ("float32", "bfloat16")
DEFAULT_EXPORT_PRECISION = "float32"
EXPORT_POLICIES = {"float32": "float32", "bfloat16": "mixed_bfloat16"}
EXPORT_HELP = ('export_precision "float32" (the default) makes every export (SavedModels, the '
               'fine-tuned models) compute in float32 whatever mixed_precision trained in; '
               '"bfloat16" exports bf16 matmuls (faster where bf16 is native, ~1e-2 from '
               'float32; ONNX Runtime cannot run it, so to-onnx refuses such a SavedModel).')


def check_export_precision(value) -> Optional[str]:
    """Why `value` is not an `export_precision`, or None if it is one."""
    if value in EXPORT_PRECISIONS:
        return None
    return f"export_precision must be one of {', '.join(EXPORT_PRECISIONS)}, got {value!r}"


@contextlib.contextmanager
def keras_policy(policy: str) -> Iterator[None]:
    """Sets Keras' global dtype policy for the block, then restores the previous one."""
    import keras

    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(policy)
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(previous)


def in_export_precision(model, export_precision: str,
                        finish: Optional[Callable[[Any], None]] = None):
    """`model`, or a copy of it that computes in `export_precision`, for an export.

    Args:
        model: a built Keras model whose class rebuilds it from `get_config()`.
        export_precision: one of EXPORT_PRECISIONS.
        finish: creates the copy's variables where its constructor does not (e.g.
            `build_from_sequence_length`); called under the export's policy.

    Returns:
        `model` itself when its dtype policy is already `export_precision`'s, else a copy built
        under that policy holding `model`'s weights (float32 under every policy, so the copy's
        weights are `model`'s exactly).

    Raises:
        ValueError: `export_precision` is not one of EXPORT_PRECISIONS, or the copy's variables
            do not match `model`'s, or one of its layers computes in another precision.
    """
    problem = check_export_precision(export_precision)
    if problem is not None:
        raise ValueError(problem)
    policy = EXPORT_POLICIES[export_precision]
    if model.dtype_policy.name == policy:
        return model
    with keras_policy(policy):
        # Layers the model builds take the global policy; the model's own is in its config.
        copy = type(model).from_config(dict(model.get_config(), dtype=policy))
        if finish is not None:
            finish(copy)
    # A layer that kept a dtype of its own (one serialized in its config) would compute in it.
    stray = sorted({type(layer).__name__ for layer in copy._flatten_layers()
                    if layer.compute_dtype != copy.compute_dtype})
    if stray:
        raise ValueError(f"the {export_precision} copy of {model.name} computes in other "
                         f"precisions in {', '.join(stray)}")
    weights = model.get_weights()
    shapes = [tuple(w.shape) for w in copy.weights]
    if shapes != [tuple(w.shape) for w in weights]:
        raise ValueError(f"the {export_precision} copy of {model.name} does not have its "
                         f"variables ({len(shapes)} against {len(weights)})")
    copy.set_weights(weights)
    logger.info("exporting in %s (the model computes in %s)", export_precision,
                model.dtype_policy.name)
    return copy
