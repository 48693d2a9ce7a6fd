"""Benchmark: the ELECTRA pretraining step on one GPU, electra-tf on JAX vs Hugging Face's PyTorch.

For ELECTRA-small and ELECTRA-base as electra-tf builds them (electra_tf/config/pretraining_config.py presets and
electra_tf/config/model_config.py sizes: small = discriminator 256 x 12 layers, embeddings 128, generator
1/4 width; base = 768 x 12, embeddings 768, generator 1/3 width; vocab 30522), batch 128, sequence 128, 19 masked slots per
sequence, in mixed_bfloat16 and float32, it reports sequences/s, ms/step, MFU and peak device
memory of:

  electra_tf_jax  electra-tf's user path on Keras' JAX backend: `ElectraPretrainer`
                  .from_pretraining_config, `compile(optimizer=create_optimizer(config)
                  .optimizer)`, then `fit()` on NumPy batches (Keras jits the whole step:
                  masking, Gumbel sampling, both encoders, losses, clipping, AdamW, metrics).
                  Each timed window is one `fit()` call.
  electra_tf_jax_trainer  (not in the default run) the trainer `run_pretraining.py --backend jax`
                  runs (`PortableTrainer`, the same model and step) on TFRecord shards written
                  into a temp dir: each timed window is one training loop
                  (`PortableTrainer._train_chunk`: the TensorFlow-free reader decoding ahead in
                  its thread, `fit()` over its batches, the loop's scalars); checkpoints and
                  TensorBoard writes, once per loop, are left out.
  torch           Hugging Face transformers' `ElectraForMaskedLM` + `ElectraForPreTraining`
                  wired with the same objective (benchmarks/torch_electra.py), eager, on the
                  same GPU; bf16 through `torch.autocast`.
  torch_compile   the same with both forward passes (and so their backward passes) through
                  `torch.compile`.

MFU is measured against the matmul peak of the same GPU in the same run: a jitted 8192^3
`jnp.matmul` (bf16; float32 at JAX's default precision, which is TF32 on a GPU that has it, and
at "highest"), the median of a few timed windows. float32 rows are compared with the peak of the
precision they run at: `--fp32-precision default` (JAX's default, and
`torch.backends.cuda.matmul.allow_tf32` set to whatever JAX's default was measured to be) or
`highest` (true float32 on both). FLOPs per step: 6 * tokens * (matmul weights + attention) +
6 * masked * MLM head, as benchmarks/pretrain_step.py counts them.

`--steps-per-execution 1,16` (the JAX rows): each value is a model (or trainer) of its own in the
same subprocess, compiled with `steps_per_execution` k (k steps per compiled call: a scan over k
batches, metrics read once per call; `portable_fit.jax_train_function`), their windows
alternating (A, B, A, B), one row per value; the steps per window are a multiple of every k.
Default: 1 (the step as Keras calls it, one call per step).

`--model-variants default,noattndrop,noattndrop+fused,pad128` (the electra_tf_jax rows, and the
electra_tf_jax_trainer rows, where they are the hparams of the same names): the
model's speed options of issue 45, each variant a model of its own in the same subprocess (with
every steps-per-execution value), windows alternating, one row each: `pad128` the vocabulary
padded to a multiple of 128 in the MLM head (`vocab_padding_multiple`, masked: the same
numerics), `fused` the attention through `keras.ops.dot_product_attention` (cuDNN flash attention
on a GPU; it needs the attention dropout off, so it implies `noattndrop`), `noattndrop` the
attention dropout 0 (the reference `fused` is compared with). Default: default.

Every (implementation, size, dtype) runs in its own subprocess, one after the other, so JAX and
PyTorch never share the GPU (the JAX child runs with XLA_PYTHON_CLIENT_PREALLOCATE=false), with
tensorflow and tensorflow_text unimportable (as on the GPU machine, where they are absent): the
first call (compile + 1 step) is timed alone, then the steps per window are raised until a window
lasts `--min-window` seconds, then `--warmup` windows, then `--windows` timed windows; throughput
is the median window. Peak device memory: JAX `memory_stats()["peak_bytes_in_use"]`, PyTorch
`torch.cuda.max_memory_allocated()` (on a CPU: the process's peak RSS instead).

    python benchmarks/gpu_step.py --out results.json       # the GPU run (--budget: 8 min)
    python benchmarks/gpu_step.py --smoke --out s.json     # tiny model on CPU JAX / PyTorch (CI)
    python benchmarks/gpu_step.py --impl electra_tf_jax_trainer --size small --dtype bfloat16 \
        --steps-per-execution 1,16 --no-peak --out t.json  # run_pretraining.py's rate, 1 vs 16

On the lent GPU machine (no network, no TensorFlow) Keras and keras-hub travel as wheels:
benchmarks/gpu_bundle.sh prints the command. Prints a markdown table and writes JSON to --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

from benchmarks import pretrain_step  # noqa: E402  (stdlib only at import)
from benchmarks.pretrain_step import NUM_WARMUP_STEPS, SEQ_LENGTH, SPECIAL, VOCAB_SIZE  # noqa: E402

IMPLEMENTATIONS = ("electra_tf_jax", "torch", "torch_compile", "electra_tf_jax_trainer")
DEFAULT_IMPLEMENTATIONS = IMPLEMENTATIONS[:3]
JAX_WORKERS = ("electra_tf_jax", "electra_tf_jax_trainer", "peak")
LABELS = {"electra_tf_jax": "electra-tf (JAX, fit)",
          "electra_tf_jax_trainer": "electra-tf (JAX, run_pretraining)",
          "torch": "HF PyTorch eager", "torch_compile": "HF PyTorch torch.compile"}
SIZES = ("small", "base")
DTYPES = ("bfloat16", "float32")
# Unimportable in every child, as on the GPU machine: the JAX and PyTorch rows never need them,
# and a TensorFlow that loads there (transformers probes for it) would take GPU memory.
BLOCKED = ("tensorflow", "tensorflow_text")
POOL = 8  # distinct batches cycled through

# --smoke: a tiny model (2 layers, hidden 64, embeddings 32) for a few steps on CPU.
SMOKE_HPARAMS = {"model_hparam_overrides": {"hidden_size": 64, "num_hidden_layers": 2},
                 "embedding_size": 32}
# --tiny: the smoke model at vocab 1,024 and sequence 32, whose step is so small that the
# per-step host work (Keras' loop, dispatch, the reader) shows: 1 vs k steps per call on CPU.
TINY_SHAPE = {"vocab_size": 1024, "max_seq_length": 32}
SMOKE_SETTINGS = {"impl": ["electra_tf_jax", "torch"], "size": ["small"],
                  "dtype": ["float32"], "batch": 4, "steps": 2, "windows": 2,
                  "warmup": 0, "min_window": 0.0, "matmul_size": 256, "device": "cpu"}

# What the issue asks of bf16 ELECTRA-base (printed against, not asserted).
TARGETS = {"vs_torch": 1.3, "vs_torch_compile": 1.0, "mfu": 0.45}


# ------------------------------------------------------------------------------------------------
# Model and FLOPs
# ------------------------------------------------------------------------------------------------
def pretraining_config(size: str, dtype: str, batch: int, smoke: bool, tiny: bool = False,
                       model_overrides=None):
    """electra-tf's PretrainingConfig of one row (the size preset, seq 128, this batch; --tiny:
    the smoke model at `TINY_SHAPE`; `model_overrides`: more model_hparam_overrides)."""
    from electra_tf.config import PretrainingConfig

    hparams = {"model_size": size, "vocab_size": VOCAB_SIZE, "max_seq_length": SEQ_LENGTH,
               "train_batch_size": batch, "num_warmup_steps": NUM_WARMUP_STEPS,
               "mixed_precision": "mixed_bfloat16" if dtype == "bfloat16" else "float32"}
    hparams.update(SMOKE_HPARAMS if smoke or tiny else {})
    hparams.update(TINY_SHAPE if tiny else {})
    if model_overrides:
        hparams["model_hparam_overrides"] = dict(hparams.get("model_hparam_overrides", {}),
                                                 **model_overrides)
    return PretrainingConfig.create("gpu_step", "unused", hparams)


# --model-variants: each "+"-joined token's (PretrainingModel keyword arguments,
# model_hparam_overrides).
VARIANT_TOKENS = {
    "default": ({}, {}),
    "pad128": ({"vocab_padding_multiple": 128}, {}),
    "noattndrop": ({}, {"attention_probs_dropout_prob": 0.0}),
    "fused": ({"fused_attention": True}, {"attention_probs_dropout_prob": 0.0}),
}


def parse_variant(spec: str):
    """(model keyword arguments, model_hparam_overrides) of a --model-variants entry."""
    options, overrides = {}, {}
    for token in spec.split("+"):
        if token not in VARIANT_TOKENS:
            raise ValueError(f"unknown model variant token {token!r} in {spec!r}; known: "
                             + ", ".join(VARIANT_TOKENS))
        options.update(VARIANT_TOKENS[token][0])
        overrides.update(VARIANT_TOKENS[token][1])
    return options, overrides


def data_shape(config) -> dict:
    """The vocab size and sequence length of `config`, for pretrain_step's data helpers."""
    return {"vocab_size": config.vocab_size, "seq_length": config.max_seq_length}


def model_flops(config, batch: int) -> float:
    """Model FLOPs of one training step of `config` (pretrain_step.step_flops for any size)."""
    from electra_tf.config.model_config import get_bert_config, get_generator_config

    disc = get_bert_config(config)
    gen = get_generator_config(config, disc)
    seq = config.max_seq_length
    per_token = disc.hidden_size * disc.hidden_size + disc.hidden_size  # the RTD head
    for enc in (disc, gen):
        per_token += sum(pretrain_step._encoder_macs_per_token(
            enc.hidden_size, enc.num_hidden_layers, enc.intermediate_size, seq,
            enc.embedding_size))
    mlm_head = gen.hidden_size * gen.embedding_size + gen.embedding_size * config.vocab_size
    return 6 * batch * seq * per_token + 6 * batch * config.max_predictions_per_seq * mlm_head


# ------------------------------------------------------------------------------------------------
# Workers (one per subprocess)
# ------------------------------------------------------------------------------------------------
def measure(run_window, args, prepare=None) -> dict:
    """Times `run_window(steps)` (which returns the last loss after waiting for the device): the
    first call alone, then windows long enough to hide the per-call overhead (`prepare(steps)`
    is called, untimed, once the steps per window are known)."""
    return measure_variants({"": run_window}, args, prepare=prepare)[""]


def measure_variants(run_windows, args, unit: int = 1, prepare=None, timed=None) -> dict:
    """`measure` for several variants in one process: each one's first call (`unit` steps)
    alone, then a probe of the first variant sizing the windows (a multiple of `unit` steps),
    then the variants' windows alternating (A, B, A, B: load changes hit every variant alike).

    Args:
        run_windows: {name: run_window(steps) -> the last loss, after waiting for the device}.
        args: the worker's arguments (steps, min_window, warmup, windows).
        unit: int. Every window's steps are a multiple of it (each variant's steps per call).
        prepare: called untimed with the steps per window once they are known.
        timed: {name: seconds of the window just run} filled by a run_window that times itself
            (the trainer's loop), else each window's wall time is taken.

    Returns:
        {name: {"first_call_seconds", "steps", "window_seconds", "losses"}}.
    """
    losses = {name: [] for name in run_windows}

    def window(name, steps):
        start = time.perf_counter()
        losses[name].append(run_windows[name](steps))
        return timed.pop(name) if timed is not None else time.perf_counter() - start

    first = {name: window(name, unit) for name in run_windows}
    steps = unit * math.ceil(args.steps / unit)
    probe = window(next(iter(run_windows)), steps)
    if probe < args.min_window:
        steps = unit * math.ceil(steps * args.min_window / probe / unit)
    if prepare:
        prepare(steps)
    times = {name: [] for name in run_windows}
    for w in range(args.warmup + args.windows):
        for name in run_windows:
            seconds = window(name, steps)
            if w >= args.warmup:
                times[name].append(seconds)
    return {name: {"first_call_seconds": first[name], "steps": steps,
                   "window_seconds": times[name], "losses": losses[name]}
            for name in run_windows}


def worker_electra_tf_jax(args) -> dict:
    import jax
    import keras
    import numpy as np

    from electra_tf.modeling import deferred_init
    from electra_tf.training.optimization import create_optimizer
    from electra_tf.training.pretrainer import ElectraPretrainer
    from electra_tf.vocab import SpecialTokens

    if args.fp32_precision == "highest":
        jax.config.update("jax_default_matmul_precision", "highest")
    config = pretraining_config(args.size_one, args.dtype_one, args.batch, args.smoke,
                                args.tiny)
    keras.mixed_precision.set_global_policy(config.mixed_precision)
    models, build = {}, None
    for variant in args.model_variants:
        options, overrides = parse_variant(variant)
        variant_config = pretraining_config(args.size_one, args.dtype_one, args.batch,
                                            args.smoke, args.tiny, overrides)
        for k in args.steps_per_execution:  # one model per (variant, k), each from seed 0
            keras.utils.set_random_seed(0)
            start = time.perf_counter()
            with deferred_init.deferred_variables():  # as the trainer builds it
                model = ElectraPretrainer.from_pretraining_config(
                    variant_config, SpecialTokens(**SPECIAL), **options)
                model.build_from_sequence_length()
            model.compile(optimizer=create_optimizer(variant_config).optimizer,
                          steps_per_execution=k)
            models[(variant, k) if args.model_variants != ["default"] else k] = model
            build = build or time.perf_counter() - start
    pool = pretrain_step.numpy_batches(args.batch, POOL, seed=1, **data_shape(config))
    windows = {}  # steps -> that many batches as one dict of int32 arrays (built untimed once)

    def window_data(steps):
        if steps not in windows:
            rows = [pool[i % POOL] for i in range(steps)]
            windows[steps] = {k: np.concatenate([b[k] for b in rows]).astype("int32")
                              for k in pool[0]}
        return windows[steps]

    def run_window(model, steps):
        data = window_data(steps)
        history = model.fit(data, batch_size=args.batch, epochs=1, shuffle=False, verbose=0)
        return float(history.history["loss"][-1])  # a host float: waits for the device

    unit = math.lcm(*args.steps_per_execution)
    for steps in (unit, unit * math.ceil(args.steps / unit)):
        window_data(steps)
    by_k = measure_variants({k: (lambda steps, m=m: run_window(m, steps))
                             for k, m in models.items()}, args, unit=unit, prepare=window_data)
    return _jax_variants_result(by_k, build)


def worker_electra_tf_jax_trainer(args) -> dict:
    """The trainer of `run_pretraining.py --backend jax` (`PortableTrainer`), one per
    `--steps-per-execution` value, on the same TFRecord shards (written here without
    TensorFlow); a window is one training loop (`_train_chunk`), timed as the trainer times its
    loops (its `examples_per_second`: the reader and fit(), which ends waiting for the device)."""
    import jax

    from electra_tf.config import PretrainingConfig
    from electra_tf.training.portable.trainer import PortableTrainer

    if args.fp32_precision == "highest":
        jax.config.update("jax_default_matmul_precision", "highest")
    data_dir = tempfile.mkdtemp(prefix="gpu_step_trainer_")
    trainers, timed = {}, {}
    try:
        base = pretraining_config(args.size_one, args.dtype_one, args.batch, args.smoke,
                                  args.tiny)
        pretrain_step.write_dataset(data_dir, num_shards=2,
                                    examples_per_shard=max(512, 4 * args.batch),
                                    **data_shape(base))
        unit = math.lcm(*args.steps_per_execution)
        build = None
        named = args.model_variants != ["default"]
        for variant in args.model_variants:
            # The speed options are hparams (config.json's vocab_padding_multiple and
            # fused_attention), as a user of run_pretraining.py sets them.
            options, overrides = parse_variant(variant)
            for k in args.steps_per_execution:
                start = time.perf_counter()
                hparams = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)
                           if f.name in ("model_size", "vocab_size", "max_seq_length",
                                         "train_batch_size", "num_warmup_steps",
                                         "mixed_precision", "model_hparam_overrides",
                                         "embedding_size")}
                hparams["model_hparam_overrides"] = dict(hparams["model_hparam_overrides"],
                                                         **overrides)
                hparams.update(options, backend="jax", steps_per_execution=k,
                               iterations_per_loop=unit, save_checkpoints_steps=unit,
                               num_train_steps=10 ** 7, do_eval=False, do_export=False,
                               keep_checkpoint_max=1)
                name = f"{variant.replace('+', '_')}_k{k}" if named else f"k{k}"
                config = PretrainingConfig.create(name, data_dir, hparams)
                trainers[(variant, k) if named else k] = PortableTrainer(config)
                build = build or time.perf_counter() - start

        def run_window(k, steps):
            scalars = trainers[k]._train_chunk(steps)  # one training loop of `steps` steps
            timed[k] = steps * args.batch / scalars["examples_per_second"]
            return scalars["total_loss"]

        by_k = measure_variants({k: (lambda steps, k=k: run_window(k, steps)) for k in trainers},
                                args, unit=unit, timed=timed)
    finally:
        for trainer in trainers.values():
            trainer.close()
        shutil.rmtree(data_dir, ignore_errors=True)
    return _jax_variants_result(by_k, build)


def worker_torch(args) -> dict:
    import torch
    import transformers

    from benchmarks.torch_electra import TorchElectra

    cuda = args.device != "cpu" and torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    if cuda:  # float32 matmuls as JAX's default runs them (measured by the peak worker)
        torch.backends.cuda.matmul.allow_tf32 = args.tf32 == "on"
        torch.backends.cudnn.allow_tf32 = args.tf32 == "on"
    config = pretraining_config(args.size_one, args.dtype_one, args.batch, args.smoke,
                                args.tiny)
    start = time.perf_counter()
    peer = TorchElectra.from_pretraining_config(
        config, SPECIAL, dtype=args.dtype_one, compile=args.worker == "torch_compile",
        device=device)
    build = time.perf_counter() - start
    batches = [{k: torch.from_numpy(v).to(device) for k, v in b.items()}
               for b in pretrain_step.numpy_batches(args.batch, POOL, seed=1,
                                                    **data_shape(config))]

    def run_window(steps):
        for i in range(steps):
            out = peer.step(batches[i % POOL], auc_outputs=False)
        return float(out["loss"])  # a host float: waits for the device

    result = measure(run_window, args)
    result.update(build_seconds=build,
                  device=f"cuda: {torch.cuda.get_device_name()}" if cuda else "cpu",
                  peak_device_bytes=torch.cuda.max_memory_allocated() if cuda else None,
                  allow_tf32=torch.backends.cuda.matmul.allow_tf32 if cuda else None,
                  versions={"torch": torch.__version__, "torch_cuda": torch.version.cuda,
                            "cudnn": torch.backends.cudnn.version() if cuda else None,
                            "transformers": transformers.__version__})
    return result


def worker_peak(args) -> dict:
    """TFLOP/s of a jitted n x n x n jnp.matmul (median of windows of back-to-back products):
    bf16 and float32 at JAX's default precision, float32 at "highest"; and whether the default
    float32 product is TF32 (its error against "highest" on a 1024^3 product)."""
    import jax
    import jax.numpy as jnp

    n = args.matmul_size
    keys = jax.random.split(jax.random.PRNGKey(0), 2)
    tflops = {}
    for name, dtype, precision in (("bfloat16", jnp.bfloat16, None),
                                   ("float32", jnp.float32, None),
                                   ("float32_highest", jnp.float32, "highest")):
        a, b = (jax.random.normal(k, (n, n), dtype) for k in keys)
        product = jax.jit(lambda x, y, p=precision: jnp.matmul(x, y, precision=p))
        product(a, b).block_until_ready()
        repeats = 10
        times = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(repeats):
                out = product(a, b)
            out.block_until_ready()
            times.append((time.perf_counter() - start) / repeats)
        tflops[name] = 2.0 * n ** 3 / statistics.median(times) / 1e12
    a, b = (jax.random.normal(k, (1024, 1024), jnp.float32) for k in keys)
    exact = jnp.matmul(a, b, precision="highest")
    error = float(jnp.max(jnp.abs(jnp.matmul(a, b) - exact)) / jnp.max(jnp.abs(exact)))
    device = jax.devices()[0]
    return {"tflops": tflops, "matmul_size": n, "float32_default_relative_error": error,
            # TF32 keeps 10 mantissa bits: ~1e-4 here; float32 ~1e-7.
            "float32_default_is_tf32": error > 1e-5, "device": _jax_device(device),
            "versions": {"jax": jax.__version__, "jax_backend": _jax_platform_version()}}


def _version(module: str):
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:  # noqa: BLE001  (a record, never a failure)
        return None


def _jax_variants_result(by_k: dict, build) -> dict:
    """A JAX worker's result: one row per steps-per-execution value, the build time, the device,
    its peak memory, the matmul precision and the versions."""
    import jax
    import keras
    import keras_hub

    result = {"variants": [dict(r, steps_per_execution=k[1], model_variant=k[0])
                           if isinstance(k, tuple) else dict(r, steps_per_execution=k)
                           for k, r in by_k.items()]}
    device = jax.devices()[0]
    stats = device.memory_stats() or {}
    result.update(build_seconds=build, device=_jax_device(device),
                  peak_device_bytes=stats.get("peak_bytes_in_use"),
                  matmul_precision=str(jax.config.jax_default_matmul_precision or "default"),
                  versions={"jax": jax.__version__, "jaxlib": _version("jaxlib"),
                            "keras": keras.__version__, "keras_hub": keras_hub.__version__,
                            "jax_backend": _jax_platform_version()})
    return result


def _jax_device(device) -> str:
    """"cuda: NVIDIA H100 80GB HBM3" (as torch's rows say it), or "cpu"."""
    platform_name = "cuda" if device.platform == "gpu" else device.platform
    kind = device.device_kind
    return platform_name if kind == device.platform else f"{platform_name}: {kind}"


def _jax_platform_version():
    """The JAX backend's platform version (on a GPU: its CUDA version)."""
    try:
        from jax.extend import backend

        return " ".join(backend.get_backend().platform_version.split())
    except Exception:  # noqa: BLE001
        return None


WORKERS = {"electra_tf_jax": worker_electra_tf_jax,
           "electra_tf_jax_trainer": worker_electra_tf_jax_trainer, "torch": worker_torch,
           "torch_compile": worker_torch, "peak": worker_peak}


def run_worker(args) -> None:
    for name in BLOCKED:
        sys.modules[name] = None
    result = WORKERS[args.worker](args)
    result["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    result["tensorflow_loaded"] = sys.modules.get("tensorflow") is not None
    with open(args.result_file, "w", encoding="utf-8") as f:
        json.dump(result, f)


# ------------------------------------------------------------------------------------------------
# Driver
# ------------------------------------------------------------------------------------------------
def machine_info() -> dict:
    from electra_tf import precision

    cpu, flags = precision.read_cpu()
    info = {"cpu": cpu, "cpu_flags": precision.recorded_cpu_flags(flags),
            "nproc": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform(), "gpus": []}
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                                  "--format=csv,noheader"], capture_output=True, text=True,
                                 timeout=60).stdout
            info["gpus"] = [dict(zip(("name", "driver", "memory"), (v.strip() for v in
                                                                     line.split(","))))
                            for line in out.strip().splitlines() if line.strip()]
        except (OSError, subprocess.SubprocessError) as e:
            info["nvidia_smi_error"] = str(e)
    return info


def spawn(worker: str, args, extra, timeout: float) -> dict:
    fd, result_file = tempfile.mkstemp(suffix=".json", prefix="gpu_step_")
    os.close(fd)
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", worker, "--result-file",
           result_file, "--batch", str(args.batch), "--steps", str(args.steps),
           "--windows", str(args.windows), "--warmup", str(args.warmup),
           "--min-window", str(args.min_window), "--matmul-size", str(args.matmul_size),
           "--device", args.device, "--fp32-precision", args.fp32_precision,
           "--steps-per-execution", ",".join(map(str, args.steps_per_execution)),
           "--model-variants", ",".join(args.model_variants)] + extra
    cmd += ["--smoke"] * args.smoke + ["--tiny"] * args.tiny
    env = dict(os.environ, HF_HUB_OFFLINE="1", TF_CPP_MIN_LOG_LEVEL="2")
    if worker in JAX_WORKERS:
        env.update(KERAS_BACKEND="jax", XLA_PYTHON_CLIENT_PREALLOCATE="false")
        if args.device == "cpu":
            env["JAX_PLATFORMS"] = "cpu"
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=timeout, env=env)
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            tail = "\n".join(proc.stdout.strip().splitlines()[-15:])
            return {"error": f"exit {proc.returncode}: {tail}", "wall_seconds": wall}
        with open(result_file, encoding="utf-8") as f:
            return dict(json.load(f), wall_seconds=wall)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s",
                "wall_seconds": time.perf_counter() - start}
    finally:
        os.remove(result_file)


def summarize(impl, size, dtype, batch, result, peak, args) -> dict:
    row = {"implementation": impl, "size": size, "dtype": dtype, "batch_size": batch}
    row.update(result)
    if "error" in result or "skipped" in result:
        return row
    config = pretraining_config(size, dtype, batch, args.smoke, args.tiny)
    median = statistics.median(result["window_seconds"])
    row["step_seconds"] = median / result["steps"]
    row["sequences_per_second"] = batch / row["step_seconds"]
    row["model_tflops_per_step"] = model_flops(config, batch) / 1e12
    row["achieved_tflops"] = row["model_tflops_per_step"] / row["step_seconds"]
    key = dtype if dtype == "bfloat16" or args.fp32_precision == "default" else "float32_highest"
    row["mfu"] = row["achieved_tflops"] / peak[key] if peak and peak.get(key) else None
    row["peak_memory_gib"] = ((row["peak_device_bytes"] if row.get("peak_device_bytes")
                               else row["peak_rss_bytes"]) / 2 ** 30)
    row["peak_memory_kind"] = "device" if row.get("peak_device_bytes") else "host RSS"
    return row


def add_ratios(rows) -> None:
    """Each row's seq/s over torch eager's and torch.compile's of the same size and dtype."""
    speed = {(r["implementation"], r["size"], r["dtype"]): r["sequences_per_second"]
             for r in rows if "sequences_per_second" in r}
    for r in rows:
        for peer, key in (("torch", "vs_torch"), ("torch_compile", "vs_torch_compile")):
            other = speed.get((peer, r["size"], r["dtype"]))
            if "sequences_per_second" in r and other:
                r[key] = r["sequences_per_second"] / other


def markdown_table(rows) -> str:
    lines = ["| impl | size | dtype | seq/s | ms/step | MFU % | peak memory GiB | vs torch eager "
             "| vs torch.compile | 1st call s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    fmt = lambda v, spec, scale=1: "-" if v is None else format(v * scale, spec)  # noqa: E731
    for r in rows:
        label = LABELS[r["implementation"]]
        if "steps_per_execution" in r and (r["steps_per_execution"] > 1
                                           or r["implementation"] == "electra_tf_jax_trainer"):
            label += f", {r['steps_per_execution']} step(s)/call"
        if r.get("model_variant"):
            label += f", {r['model_variant']}"
        head = f"| {label} | {r['size']} | {r['dtype']} |"
        if "sequences_per_second" not in r:
            why = r.get("skipped") or r.get("error", "").splitlines()[-1][:120]
            lines.append(f"{head} {'skipped' if 'skipped' in r else 'ERROR'}: {why} |"
                         + " |" * 6)
            continue
        memory = f"{r['peak_memory_gib']:.2f}" + (" (host RSS)" if
                                                  r["peak_memory_kind"] != "device" else "")
        lines.append(f"{head} {r['sequences_per_second']:.1f} | {r['step_seconds'] * 1e3:.1f} | "
                     f"{fmt(r.get('mfu'), '.1f', 100)} | {memory} | "
                     f"{fmt(r.get('vs_torch'), '.2f')} | {fmt(r.get('vs_torch_compile'), '.2f')} | "
                     f"{r['first_call_seconds']:.1f} |")
    return "\n".join(lines)


def target_lines(rows, smoke: bool) -> list:
    found = [r for r in rows if (r["implementation"], r["size"], r["dtype"])
             == ("electra_tf_jax", "base", "bfloat16") and "sequences_per_second" in r]
    if not found:
        return ["targets (bf16 ELECTRA-base, electra-tf on JAX): no such row in this run"]
    r = found[0]
    out = []
    for key, label in (("vs_torch", "vs torch eager"), ("vs_torch_compile", "vs torch.compile"),
                       ("mfu", "MFU")):
        value = r.get(key)
        shown = "-" if value is None else (f"{100 * value:.1f}%" if key == "mfu"
                                           else f"{value:.2f}x")
        goal = f"{100 * TARGETS[key]:.0f}%" if key == "mfu" else f"{TARGETS[key]:.1f}x"
        verdict = "n/a" if value is None else ("met" if value >= TARGETS[key] else "not met")
        out.append(f"target bf16 ELECTRA-base electra-tf {label} >= {goal}: {shown} ({verdict}"
                   f"{', smoke sizes: not meaningful' if smoke else ''})")
    return out


def run_driver(args) -> int:
    started = time.time()
    t0 = time.perf_counter()
    info = machine_info()
    gpus = "; ".join(f"{g['name']} (driver {g['driver']}, {g['memory']})" for g in info["gpus"])
    print(f"machine: {gpus or 'no nvidia-smi'}; CPU {info['cpu']}, {info['nproc']} cores, "
          f"flags {' '.join(info['cpu_flags']) or '-'}", flush=True)
    peak_result = None
    if not args.no_peak:
        peak_result = spawn("peak", args, [], args.timeout)
        if "error" in peak_result:
            print(f"matmul peak failed: {peak_result['error']}", flush=True)
        else:
            print(f"matmul peak ({peak_result['device']}, {args.matmul_size}^3): " + ", ".join(
                f"{k} {v:.1f} TFLOP/s" for k, v in peak_result["tflops"].items())
                + f"; float32 default is TF32: {peak_result['float32_default_is_tf32']}",
                flush=True)
    peak = peak_result.get("tflops") if peak_result else None
    if args.fp32_precision == "highest" or args.device == "cpu":
        tf32 = "off"
    else:  # torch as JAX's default was measured (a GPU without the measure: assume TF32)
        tf32 = "on" if (peak_result or {}).get("float32_default_is_tf32", True) else "off"
    rows, longest = [], {}  # longest: the longest child of each implementation so far (s)
    for dtype in args.dtype:
        for size in args.size:
            for impl in args.impl:
                elapsed = time.perf_counter() - t0
                if impl in longest and elapsed + longest[impl] > args.budget:
                    result = {"skipped": f"over the --budget of {args.budget:.0f} s "
                                         f"({elapsed:.0f} s spent)"}
                else:
                    print(f"running {impl} {size} {dtype} ({elapsed:.0f} s) ...", flush=True)
                    result = spawn(impl, args, ["--size-one", size, "--dtype-one", dtype,
                                                "--tf32", tf32], args.timeout)
                    longest[impl] = max(longest.get(impl, 0.0), result["wall_seconds"])
                variants = result.pop("variants", [{}])  # the JAX rows: one per k
                for variant in variants:
                    row = summarize(impl, size, dtype, args.batch, dict(result, **variant),
                                    peak, args)
                    rows.append(row)
                    if "sequences_per_second" in row:
                        per_call = (f"{variant.get('model_variant', '')} "
                                    f"{variant['steps_per_execution']} step(s)/call: "
                                    if variant else "")
                        print(f"  {per_call}{row['sequences_per_second']:.1f} seq/s; build "
                              f"{row['build_seconds']:.1f} s, first call (compile + "
                              f"{variant.get('steps_per_execution', 1)} step(s)) "
                              f"{row['first_call_seconds']:.1f} s, {row['steps']} steps/window, "
                              f"child wall {row['wall_seconds']:.0f} s", flush=True)
                    else:
                        print(f"  {row.get('skipped') or 'ERROR ' + row['error']}", flush=True)
    add_ratios(rows)
    versions = {}
    for r in rows + [peak_result or {}]:
        versions.update({k: v for k, v in r.get("versions", {}).items() if v is not None})
    devices = sorted({r["device"] for r in rows if r.get("device")})
    command = " ".join([os.path.relpath(sys.argv[0], REPO_ROOT)] + sys.argv[1:])
    print()
    print(markdown_table(rows))
    print()
    precision_note = ("float32 rows: matmuls at JAX's default precision (TF32: "
                      f"{(peak_result or {}).get('float32_default_is_tf32', 'not measured')}), "
                      f"torch allow_tf32 {tf32}; " if args.fp32_precision == "default"
                      else "float32 rows: true float32 matmuls (precision highest, no TF32); ")
    seq = TINY_SHAPE["max_seq_length"] if args.tiny else SEQ_LENGTH
    print(f"batch {args.batch}, seq {seq}; devices: {', '.join(devices) or '-'}; "
          f"{precision_note if 'float32' in args.dtype else ''}MFU against the measured "
          "matmul peak "
          f"({', '.join(f'{k} {v:.1f}' for k, v in (peak or {}).items()) or 'not measured'} "
          f"TFLOP/s)")
    print("versions: " + ", ".join(f"{k} {v}" for k, v in sorted(versions.items())))
    print(f"command: {command}")
    for line in target_lines(rows, args.smoke or args.tiny):
        print(line)
    report = {"command": command,
              "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
              "elapsed_seconds": time.perf_counter() - t0, "smoke": args.smoke,
              "machine": info, "versions": dict(versions, python=platform.python_version()),
              "settings": {k: getattr(args, k) for k in (
                  "batch", "steps", "windows", "warmup", "min_window", "matmul_size", "device",
                  "fp32_precision", "budget", "steps_per_execution", "model_variants")},
              "torch_allow_tf32": tf32, "seq_length": seq, "tiny": args.tiny,
              "matmul_peak": peak_result,
              "results": rows, "targets": TARGETS, "table": markdown_table(rows)}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
    print(f"wrote {args.out} ({time.perf_counter() - t0:.0f} s)")
    return 0


def _variant_list(text: str) -> list:
    """--model-variants: comma-separated variants, each checked by `parse_variant`."""
    variants = [v.strip() for v in text.split(",") if v.strip()]
    for variant in variants:
        try:
            parse_variant(variant)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return variants


def build_parser() -> argparse.ArgumentParser:
    from benchmarks.cli_types import positive_int

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    listed = lambda allowed: lambda text: pretrain_step._csv(text, allowed)  # noqa: E731
    parser.add_argument("--impl", type=listed(IMPLEMENTATIONS),
                        default=list(DEFAULT_IMPLEMENTATIONS),
                        help="implementations, comma-separated. Default: "
                             + ",".join(DEFAULT_IMPLEMENTATIONS))
    parser.add_argument("--size", type=listed(SIZES), default=["base", "small"],
                        help="model sizes, run in this order. Default: base,small")
    parser.add_argument("--dtype", type=listed(DTYPES), default=list(DTYPES),
                        help="bfloat16 (Keras mixed_bfloat16 / torch autocast) and/or float32, "
                             "run in this order. Default: bfloat16,float32")
    parser.add_argument("--batch", type=positive_int, default=128, help="Default: 128")
    parser.add_argument("--steps", type=positive_int, default=10,
                        help="steps of the first timed window (raised to --min-window). "
                             "Default: 10")
    parser.add_argument("--steps-per-execution", type=lambda v: pretrain_step._csv(v, None, int),
                        default=[1],
                        help="the JAX rows' steps per compiled call, comma-separated: one row "
                             "each, measured in one process, windows alternating. Default: 1")
    parser.add_argument("--model-variants", type=_variant_list, default=["default"],
                        help="the electra_tf_jax (and _trainer) rows' model speed options, "
                             "comma-separated, "
                             "each a '+'-joined set of " + ", ".join(VARIANT_TOKENS)
                             + " (one row each, in one process). Default: default")
    parser.add_argument("--min-window", type=float, default=1.0,
                        help="seconds a timed window lasts at least (hides fit()'s per-call "
                             "cost). Default: 1.0")
    parser.add_argument("--windows", type=positive_int, default=3,
                        help="timed windows; the median is reported. Default: 3")
    parser.add_argument("--warmup", type=int, default=1,
                        help="untimed windows after the first call and the probe. Default: 1")
    parser.add_argument("--fp32-precision", choices=("default", "highest"), default="default",
                        help="float32 matmuls: JAX's default (TF32 on a GPU with it; torch "
                             "allow_tf32 set alike) or 'highest' (true float32 on both)")
    parser.add_argument("--matmul-size", type=positive_int, default=8192,
                        help="n of the n^3 matmul peak. Default: 8192")
    parser.add_argument("--no-peak", action="store_true", help="skip the matmul peak (no MFU)")
    parser.add_argument("--device", choices=("auto", "cpu"), default="auto",
                        help="auto: the GPU where JAX / PyTorch see one; cpu: force CPU")
    parser.add_argument("--budget", type=float, default=450.0,
                        help="seconds: a child is skipped when it would end past this, judged "
                             "by the longest child of its implementation so far (the first of "
                             "each always runs). Default: 450")
    parser.add_argument("--timeout", type=float, default=400.0,
                        help="seconds before one child is abandoned. Default: 400")
    parser.add_argument("--smoke", action="store_true",
                        help="CI: a tiny model for a few steps on CPU JAX and CPU PyTorch ("
                             + ", ".join(f"{k} {v}" for k, v in SMOKE_SETTINGS.items()) + ")")
    parser.add_argument("--tiny", action="store_true",
                        help="the --smoke model at vocab %d and sequence %d (with --smoke's "
                             "settings unless given): a step small enough that the per-step "
                             "host work shows, e.g. with --steps-per-execution 1,16 on CPU"
                             % (TINY_SHAPE["vocab_size"], TINY_SHAPE["max_seq_length"]))
    parser.add_argument("--out", default=os.path.join(REPO_ROOT, "benchmarks", "results",
                                                      "gpu_step.json"),
                        help="JSON results. Default: benchmarks/results/gpu_step.json")
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--result-file", help=argparse.SUPPRESS)
    parser.add_argument("--size-one", help=argparse.SUPPRESS)
    parser.add_argument("--dtype-one", help=argparse.SUPPRESS)
    parser.add_argument("--tf32", choices=("on", "off"), default="on", help=argparse.SUPPRESS)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.worker:
        run_worker(args)
        return 0
    if args.smoke or args.tiny:
        given = {arg.split("=")[0] for arg in (sys.argv[1:] if argv is None else argv)}
        explicit = {a.dest for a in parser._actions if given & set(a.option_strings)}
        for key, value in SMOKE_SETTINGS.items():
            if key not in explicit:
                setattr(args, key, value)
    return run_driver(args)


if __name__ == "__main__":
    sys.exit(main())
