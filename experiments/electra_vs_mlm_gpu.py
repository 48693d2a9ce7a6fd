"""ELECTRA against MLM at equal pretraining FLOPs on one GPU (JAX), fine-tuned back on the CPU.

The sibling of experiments/electra_vs_mlm.py (same FLOPs counter, same fine-tuning recipe) at
GPU scale: ELECTRA-small shapes at 1e16 FLOPs per objective, ~85x the CPU experiment's budget.
Two phases, because the GPU machine has JAX but no TensorFlow and the fine-tuning code runs on
TensorFlow:

    # 1. On the GPU machine (no TensorFlow, no network; keras / keras-hub as wheels, the shards
    #    unpacked from a transport archive): both objectives pretrain at once, each in its own
    #    `run_pretraining.py --backend jax` process, checkpoints at each quarter of the budget.
    python experiments/electra_vs_mlm_gpu.py pretrain --data-dir DATA --out OUT --deadline 300

    # 2. Here, with TensorFlow, on what came back: held-out eval (discriminator AUC, MLM
    #    accuracy), fine-tuning on the labelled sets (3 seeds), the random-init floor of the same
    #    size, tables and plots beside the CPU experiment's points.
    python experiments/electra_vs_mlm_gpu.py evaluate --returned OUT --data-dir DATA

`pretrain` stops both runs at `--deadline` seconds (SIGTERM: each saves and exits 42) and
returns the checkpoints of the largest budget fraction BOTH runs reached, so the comparison stays
at equal FLOPs whatever the GPU time allowed. What comes back must fit the device tool's limits
(8 files of 16 MiB): the model variables only (no optimizer moments), in float16, tarred and split
into 15 MiB parts; `evaluate` casts them back to float32 (the rounding, < 2^-11 relative, is far
below what fine-tuning moves). `--smoke` runs both phases with a tiny model and budget on CPU
(tests/scripts/test_electra_vs_mlm_gpu.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import io
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from typing import Dict, List, Optional

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)
sys.path.insert(0, os.path.join(REPO_ROOT, "experiments"))

import electra_vs_mlm as cpu_experiment  # noqa: E402  (the FLOPs counter and fine-tuning)

logger = logging.getLogger("electra_tf.experiment")

OBJECTIVES = ("electra", "mlm")
RUN_PREFIX = "gpu_"  # model names: gpu_electra, gpu_mlm
PART_BYTES = 15 * 1024 * 1024  # under the device tool's 16 MiB per returned file
RETURNED_TAR = "returned.tar"
RESULTS_NAME = "gpu_results.json"
PREEMPTED = 42  # run_pretraining.py's exit status after a SIGTERM save


@dataclasses.dataclass(frozen=True)
class GpuSettings:
    """One scale of the GPU experiment (`GPU` or `SMOKE`)."""

    name: str
    model_hparams: dict  # model_size / model_hparam_overrides / embedding_size of both objectives
    max_seq_length: int
    train_batch_size: int
    learning_rate: float
    warmup_fraction: float
    budget_flops: float  # per objective
    parts: int  # checkpoints at each 1/parts of the budget
    finetune: cpu_experiment.Settings  # the CPU experiment's fine-tuning recipe at this size
    min_warmup_steps: int = 0  # the warmup is max(warmup_fraction * steps, this)
    adam_bias_correction: bool = False


# ELECTRA-small shapes (hidden 256, 12 layers, 4 heads, FFN 1024, embeddings 128, generator 1/4).
# Batch 512 instead of the paper's 128: on an H100, ELECTRA-small at batch 128 fills 4% of the
# GPU (docs/benchmarks.md, "The JAX trainer on the H100"), and a larger batch amortises the
# per-step host work. Learning rate 5e-4, the paper's, NOT scaled with the batch, and a warmup of
# at least 600 steps: the first run here (2026-11-26) used 1e-3 (sqrt-scaled) with 218 warmup
# steps, where the official Adam (no bias correction) peaks at 2.0x its rate, and its
# discriminator collapsed to the base rate (docs/experiments.md; docs/config.md, "Short warmups
# and large batches"). 600 steps keep that peak under 1.5x (training/adam_warmup.py).
GPU = GpuSettings(
    name="gpu",
    model_hparams={"model_size": "small"},
    max_seq_length=128, train_batch_size=512, learning_rate=5e-4, warmup_fraction=0.1,
    budget_flops=1e16, parts=4, min_warmup_steps=600,
    finetune=dataclasses.replace(
        cpu_experiment.FULL, name="gpu_small", model={}, embedding_size=128, seeds=3),
)
SMOKE = GpuSettings(
    name="smoke",
    model_hparams={"model_size": "small", "embedding_size": 32,
                   "model_hparam_overrides": {"hidden_size": 32, "num_hidden_layers": 2,
                                              "num_attention_heads": 1, "intermediate_size": 128}},
    max_seq_length=32, train_batch_size=8, learning_rate=5e-4, warmup_fraction=0.1,
    budget_flops=3e10, parts=2,
    finetune=dataclasses.replace(
        cpu_experiment.QUICK, name="smoke", seeds=1,
        model={"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 1,
               "intermediate_size": 128}, embedding_size=32,
        finetune={"bbc_news": {"max_seq_length": 32, "num_train_epochs": 1.0,
                               "max_train_examples": None},
                  "pang_lee": {"max_seq_length": 32, "num_train_epochs": 1.0,
                               "max_train_examples": None}}),
)


# ------------------------------------------------------------------------------------------------
# The plan: steps per objective for equal FLOPs
# ------------------------------------------------------------------------------------------------
def base_hparams(settings: GpuSettings) -> dict:
    extra = {"adam_bias_correction": True} if settings.adam_bias_correction else {}
    return dict(json.loads(json.dumps(settings.model_hparams)),
                max_seq_length=settings.max_seq_length, train_batch_size=settings.train_batch_size,
                learning_rate=settings.learning_rate, **extra)


def plan(settings: GpuSettings) -> dict:
    """Steps, FLOPs per step and checkpoint steps of each objective for `budget_flops` each.

    Steps are rounded to a multiple of `parts`, so every checkpoint lands on a fraction of the
    budget; the FLOPs each run really gets are reported with the rounding.
    """
    from electra_tf.config import PretrainingConfig
    from electra_tf.config.model_config import get_bert_config, get_generator_config

    config = PretrainingConfig.create("flops", "unused", dict(base_hparams(settings),
                                                               num_train_steps=1))
    disc = get_bert_config(config)
    gen = get_generator_config(config, disc)
    seq, n_pred = settings.max_seq_length, config.max_predictions_per_seq
    per_step = {
        "electra": settings.train_batch_size * cpu_experiment.flops_per_sequence(
            "electra", disc, gen, seq, n_pred, disc.vocab_size),
        "mlm": settings.train_batch_size * cpu_experiment.flops_per_sequence(
            "mlm", disc, None, seq, n_pred, disc.vocab_size),
    }
    steps = {}
    for objective, flops in per_step.items():
        chunks = max(1, round(settings.budget_flops / flops / settings.parts))
        steps[objective] = chunks * settings.parts
    return {
        "budget_flops": settings.budget_flops, "flops_per_step": per_step, "steps": steps,
        "flops": {o: steps[o] * per_step[o] for o in OBJECTIVES},
        "checkpoints": {o: [steps[o] * k // settings.parts for k in range(1, settings.parts + 1)]
                        for o in OBJECTIVES},
        "discriminator": disc.to_dict(), "generator": gen.to_dict(),
        "max_predictions_per_seq": n_pred,
    }


def warmup_steps(settings: GpuSettings, steps: int) -> int:
    """max(warmup_fraction of the run, min_warmup_steps), at least 1 and at most the run."""
    return max(1, min(steps, max(int(settings.warmup_fraction * steps),
                                 settings.min_warmup_steps)))


def run_hparams(settings: GpuSettings, objective: str, steps: int) -> dict:
    """The hparams of one pretraining run (the same for both objectives but the objective)."""
    every = steps // settings.parts
    return dict(base_hparams(settings),
                num_train_steps=steps, num_warmup_steps=warmup_steps(settings, steps),
                save_checkpoints_steps=every, keep_checkpoint_max=0,
                iterations_per_loop=min(every, 250), electra_objective=objective == "electra",
                do_eval=False, do_export=False, mixed_precision="auto", seed=0)


# ------------------------------------------------------------------------------------------------
# Phase 1: pretraining (the GPU machine)
# ------------------------------------------------------------------------------------------------
def _launch(objective: str, data_dir: str, hparams: dict, log_path: str, concurrent: bool):
    env = dict(os.environ, KERAS_BACKEND="jax", PYTHONUNBUFFERED="1",
               XLA_PYTHON_CLIENT_PREALLOCATE="false")
    if concurrent:  # two processes share one GPU: neither may take most of its memory
        env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = "0.45"
    command = [sys.executable, os.path.join(REPO_ROOT, "run_pretraining.py"), "--backend", "jax",
               "--data-dir", data_dir, "--model-name", RUN_PREFIX + objective,
               "--hparams", json.dumps(hparams)]
    log = open(log_path, "ab")
    logger.info("starting %s: %s", objective, " ".join(command[1:5]))
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                            cwd=REPO_ROOT), log


def _wait(children: Dict[str, subprocess.Popen], deadline: float, grace: float) -> Dict[str, int]:
    """Waits for every child; at `deadline` (time.monotonic) SIGTERMs the rest, which save and
    exit 42; after `grace` more seconds SIGKILLs what is left. Returns the exit statuses."""
    stopping = False
    while True:
        alive = {o: p for o, p in children.items() if p.poll() is None}
        if not alive:
            return {o: p.returncode for o, p in children.items()}
        now = time.monotonic()
        if not stopping and now >= deadline:
            logger.info("deadline reached: SIGTERM to %s (each saves a checkpoint and exits)",
                        ", ".join(alive))
            for p in alive.values():
                p.send_signal(signal.SIGTERM)
            stopping, deadline = True, now + grace
        elif stopping and now >= deadline:
            logger.warning("no exit %.0f s after SIGTERM: SIGKILL to %s", grace, ", ".join(alive))
            for p in alive.values():
                p.kill()
        try:  # wakes on the first child's exit, else re-checks the clock every second
            next(iter(alive.values())).wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            pass


def reached_steps(model_dir: str) -> List[int]:
    """Steps of the complete `ckpt-N.npz` checkpoints in `model_dir` (atomic writes: a file that
    exists is complete)."""
    from electra_tf.training import npz_checkpoint

    steps = []
    for path in npz_checkpoint.checkpoints(model_dir):
        steps.append(int(npz_checkpoint.NAME_PATTERN.match(os.path.basename(path)).group(1)))
    return sorted(steps)


_RATE = re.compile(r"\| ([0-9.]+) ex/s")


def examples_per_second(log_path: str) -> Optional[float]:
    """The last progress line's rate (examples/s over its loop, compilation excluded after the
    first loop)."""
    rates = []
    with open(log_path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = _RATE.search(line)
            if m:
                rates.append(float(m.group(1)))
    return rates[-1] if rates else None


def slim_checkpoint(path: str) -> bytes:
    """The model variables of portable checkpoint `path` (no optimizer moments), float32 arrays
    stored as float16: what `restore(path, model, None)` reads, a third of the size or less."""
    import numpy as np

    arrays = {}
    with np.load(path, allow_pickle=False) as archive:
        meta = json.loads(str(archive["meta"]))
        meta["slim"] = {"dropped": "optimizer", "float32_as": "float16"}
        # A model-only checkpoint (as an import's ckpt-0.npz): its meta lists no optimizer
        # members, or every reader's completeness check (npz_checkpoint.checkpoint_problem)
        # would call it incomplete.
        meta["optimizer_paths"] = []
        arrays["meta"] = np.array(json.dumps(meta))
        for key in archive.files:
            if key.startswith("model/"):
                value = archive[key]
                arrays[key] = value.astype(np.float16) if value.dtype == np.float32 else value
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def unslim_checkpoint(data: bytes, path: str) -> None:
    """Writes a slim checkpoint back as a model-only `ckpt-N.npz` with float32 arrays."""
    import numpy as np

    from electra_tf import atomic

    with np.load(io.BytesIO(data), allow_pickle=False) as archive:
        arrays = {key: (archive[key].astype(np.float32) if archive[key].dtype == np.float16
                        else archive[key]) for key in archive.files}
    meta = json.loads(str(arrays["meta"]))
    meta["optimizer_paths"] = []  # model-only (a slim file of an earlier script lists them)
    arrays["meta"] = np.array(json.dumps(meta))
    with atomic.atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)


def pack(data_dir: str, common_steps: Dict[str, int], out_dir: str, extra: Dict[str, str]) -> List[str]:
    """Tars each run's small files and its slim checkpoint at `common_steps[objective]` (plus
    `extra`: archive name -> local file) and splits the tar into `PART_BYTES` parts in
    `out_dir`. Returns the parts' paths."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        def add_bytes(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = int(time.time())
            tar.addfile(info, io.BytesIO(data))

        for objective, step in common_steps.items():
            name = RUN_PREFIX + objective
            model_dir = os.path.join(data_dir, "models", name)
            for path in sorted(os.listdir(model_dir)):
                full = os.path.join(model_dir, path)
                if os.path.isfile(full) and not path.startswith("ckpt-") and not path.endswith(".lock"):
                    tar.add(full, arcname=f"{name}/{path}")
            add_bytes(f"{name}/ckpt-{step}.npz", slim_checkpoint(
                os.path.join(model_dir, f"ckpt-{step}.npz")))
        for arcname, path in extra.items():
            tar.add(path, arcname=arcname)
    data = buffer.getvalue()
    parts = []
    for i in range(0, len(data), PART_BYTES):
        part = os.path.join(out_dir, f"{RETURNED_TAR}.{i // PART_BYTES:02d}")
        with open(part, "wb") as f:
            f.write(data[i:i + PART_BYTES])
        parts.append(part)
    logger.info("packed %.1f MiB into %d part(s) in %s", len(data) / 2 ** 20, len(parts), out_dir)
    return parts


def _device_info() -> dict:
    info = {}
    try:
        import jax

        device = jax.devices()[0]
        info = {"platform": device.platform, "device_kind": getattr(device, "device_kind", ""),
                "device_count": jax.device_count(), "jax": jax.__version__}
    except Exception as e:  # noqa: BLE001  (reported, never fatal: the runs are what matters)
        info = {"error": str(e)}
    try:
        import keras

        info["keras"] = keras.__version__
    except ImportError:
        pass
    return info


def pretrain_phase(settings: GpuSettings, data_dir: str, out_dir: str, deadline: float,
                   concurrent: bool = True, grace: float = 90.0) -> dict:
    """Phase 1 (see the module docstring). Returns what it wrote to `out_dir`/gpu_results.json."""
    started = time.monotonic()
    os.makedirs(out_dir, exist_ok=True)
    the_plan = plan(settings)
    logger.info("plan: %.3g FLOPs per objective; steps %s; FLOPs/step %s", settings.budget_flops,
                the_plan["steps"], {k: f"{v:.3g}" for k, v in the_plan["flops_per_step"].items()})
    logs_dir = os.path.join(data_dir, "models", "gpu_logs")
    os.makedirs(logs_dir, exist_ok=True)
    logs = {o: os.path.join(logs_dir, f"{o}.log") for o in OBJECTIVES}
    hparams = {o: run_hparams(settings, o, the_plan["steps"][o]) for o in OBJECTIVES}
    children, files, statuses = {}, [], {}
    end = started + deadline
    try:
        for objective in OBJECTIVES:
            child, log = _launch(objective, data_dir, hparams[objective], logs[objective], concurrent)
            children[objective] = child
            files.append(log)
            if not concurrent:
                statuses.update(_wait({objective: child}, end, grace))
                children.pop(objective)
        statuses.update(_wait(children, end, grace))
    finally:
        for f in files:
            f.close()
    wall = time.monotonic() - started
    reached = {o: reached_steps(os.path.join(data_dir, "models", RUN_PREFIX + o))
               for o in OBJECTIVES}
    fractions = {o: [k for k in range(1, settings.parts + 1)
                     if the_plan["checkpoints"][o][k - 1] in reached[o]] for o in OBJECTIVES}
    common = max(set(fractions["electra"]) & set(fractions["mlm"]), default=0)
    with open(os.path.join(data_dir, "pretrain_tfrecords", "manifest.json"), encoding="utf-8") as f:
        splits = json.load(f)["splits"]
    train_examples = splits["train"]["examples"]
    results = {"settings": dataclasses.asdict(settings), "plan": the_plan, "hparams": hparams,
               "data": {"train_examples": train_examples,
                        "eval_examples": splits.get("eval", {}).get("examples"),
                        "epochs_planned": {o: the_plan["steps"][o] * settings.train_batch_size
                                           / train_examples for o in OBJECTIVES}},
               "exit_status": statuses, "wall_seconds": wall, "deadline_seconds": deadline,
               "concurrent": concurrent, "checkpoints_reached": reached,
               "common_fraction": f"{common}/{settings.parts}",
               "common_steps": {o: the_plan["checkpoints"][o][common - 1] for o in OBJECTIVES}
               if common else {},
               "examples_per_second": {o: examples_per_second(logs[o]) for o in OBJECTIVES},
               "device": _device_info()}
    for objective in OBJECTIVES:
        with open(logs[objective], encoding="utf-8", errors="replace") as f:
            tail = f.readlines()[-8:]
        logger.info("%s (exit %s), last lines:\n%s", objective, statuses.get(objective),
                    "".join(tail).rstrip())
    if common:
        logger.info("both runs reached %d/%d of the budget: steps %s", common, settings.parts,
                    results["common_steps"])
        results["parts"] = [os.path.basename(p) for p in pack(
            data_dir, results["common_steps"], out_dir,
            {f"logs/{o}.log": logs[o] for o in OBJECTIVES})]
    else:
        logger.error("the runs share no checkpoint fraction (reached %s): nothing to bring back",
                     reached)
    with open(os.path.join(out_dir, RESULTS_NAME), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1, sort_keys=True)
    return results


# ------------------------------------------------------------------------------------------------
# Phase 2: eval and fine-tuning (here, TensorFlow)
# ------------------------------------------------------------------------------------------------
def unpack(returned_dir: str, data_dir: str) -> dict:
    """Joins and extracts the returned parts into `data_dir`/models/ (float32 checkpoints) and
    returns the pretraining phase's results."""
    with open(os.path.join(returned_dir, RESULTS_NAME), encoding="utf-8") as f:
        results = json.load(f)
    parts = sorted(glob.glob(os.path.join(returned_dir, RETURNED_TAR + ".*")))
    if not parts or [os.path.basename(p) for p in parts] != results.get("parts"):
        raise SystemExit(f"electra_vs_mlm_gpu.py: error: {returned_dir} holds parts "
                         f"{[os.path.basename(p) for p in parts]}, the results list "
                         f"{results.get('parts')}")
    data = b"".join(open(p, "rb").read() for p in parts)
    models = os.path.join(data_dir, "models")
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
        for member in tar.getmembers():
            if not member.isfile() or member.name.startswith(("/", "..")) or ".." in member.name:
                raise SystemExit(f"electra_vs_mlm_gpu.py: error: unexpected member {member.name}")
            target = os.path.join(models, member.name)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            payload = tar.extractfile(member).read()
            if member.name.endswith(".npz"):
                unslim_checkpoint(payload, target)
            else:
                with open(target, "wb") as f:
                    f.write(payload)
    return results


def evaluate_run(data_dir: str, objective: str, hparams: dict, num_eval_steps: int) -> dict:
    """Held-out eval of a returned run with the TensorFlow trainer (it reads ckpt-N.npz)."""
    from electra_tf.config import PretrainingConfig
    from electra_tf.training.tf import trainer as trainer_lib

    eval_hparams = dict(hparams, do_train=False, do_eval=True, do_export=False,
                        num_eval_steps=num_eval_steps)
    eval_hparams.pop("backend", None)
    config = PretrainingConfig.create(RUN_PREFIX + objective, data_dir, eval_hparams)
    return trainer_lib.run(config)["eval"]


def evaluate_phase(settings: GpuSettings, returned_dir: str, data_dir: str, work_dir: str,
                   output_dir: str, num_eval_steps: int, raw_dir: Optional[str] = None,
                   seeds: Optional[int] = None, tasks=cpu_experiment.TASKS) -> dict:
    """Phase 2 (see the module docstring). Writes results.json and summary.md to `output_dir`."""
    from electra_tf.sources import labelled

    started = time.time()
    pretraining = unpack(returned_dir, data_dir)
    ft = settings.finetune if seeds is None else dataclasses.replace(settings.finetune, seeds=seeds)
    if raw_dir is None:
        labelled.fetch_labelled_data(work_dir, cpu_experiment.TASKS)
        raw_dir = os.path.join(work_dir, labelled.FINETUNING_DATA_DIR)
    os.makedirs(os.path.join(work_dir, "data"), exist_ok=True)
    shutil.copyfile(os.path.join(data_dir, "vocab.txt"), os.path.join(work_dir, "data", "vocab.txt"))
    evals, finetuning = {}, {}
    for objective in OBJECTIVES:
        cached = os.path.join(work_dir, f"eval_{objective}.json")  # a rerun reuses it
        if os.path.exists(cached):
            with open(cached, encoding="utf-8") as f:
                evals[objective] = json.load(f)
        else:
            evals[objective] = {k: float(v) for k, v in evaluate_run(
                data_dir, objective, pretraining["hparams"][objective], num_eval_steps).items()}
            with open(cached, "w", encoding="utf-8") as f:
                json.dump(evals[objective], f)
        logger.info("%s held-out eval: %s", objective, evals[objective])
    starts = {o: os.path.join(data_dir, "models", RUN_PREFIX + o) for o in OBJECTIVES}
    for label, init in list(starts.items()) + [("random", None)]:
        for task in tasks:
            # A fine-tuning run with at least `seeds` trials in the work dir is reused whole.
            result = cpu_experiment.finetune(work_dir, raw_dir, ft, f"gpu_{label}", task,
                                             ft.seeds, init)
            finetuning.setdefault(label, {})[task] = dict(result["summary"][task],
                                                          trials=len(result["trials"]))
    curves = {o: cpu_experiment.read_scalars(starts[o]) for o in OBJECTIVES}
    results = {"pretraining": pretraining, "eval": evals, "finetuning": finetuning,
               "curves": curves, "cpu_experiment": _cpu_points(),
               "seconds_evaluate": time.time() - started}
    os.makedirs(output_dir, exist_ok=True)
    with open(os.path.join(output_dir, "results.json"), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1, sort_keys=True, default=float)
    with open(os.path.join(output_dir, "summary.md"), "w", encoding="utf-8") as f:
        f.write(summary_markdown(results))
    return results


def _cpu_points() -> dict:
    """The CPU experiment's final fine-tuning results and budget (docs/experiments/...)."""
    path = os.path.join(REPO_ROOT, "docs", "experiments", "electra_vs_mlm", "results.json")
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:
        cpu = json.load(f)
    return {"budget_flops": cpu["plan"]["budget_flops"],
            "finetuning": {m: {t: s for t, s in tasks.items()}
                           for m, tasks in cpu["finetuning"].items()}}


def _stat(summary: dict, split: str, metric: str = "accuracy") -> str:
    stat = summary.get(split, {}).get(metric)
    if not stat:
        return "-"
    scale = 100.0 if stat["mean"] <= 1.0 else 1.0  # fractions from the runner, percent in docs
    return f"{scale * stat['mean']:.1f} ± {scale * stat['std']:.1f}"


def summary_markdown(results: dict) -> str:
    """The tables docs/experiments.md shows for the GPU run."""
    pre = results["pretraining"]
    the_plan = pre["plan"]
    common = pre.get("common_steps", {})
    lines = ["## Pretraining on the GPU (equal FLOPs)", "",
             f"Device: {pre['device'].get('device_kind', '?')} ({pre['device'].get('platform', '?')}); "
             f"both objectives {'at once' if pre['concurrent'] else 'one after the other'}; "
             f"wall {pre['wall_seconds']:.0f} s (deadline {pre['deadline_seconds']:.0f} s); "
             f"both reached {pre['common_fraction']} of the budget.", "",
             "| objective | steps planned | FLOPs/step | steps compared | FLOPs compared | ex/s | exit |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for o in OBJECTIVES:
        step, rate = common.get(o), pre["examples_per_second"].get(o)
        per_step = the_plan["flops_per_step"][o]
        compared = f"{step} | {step * per_step:.3g}" if step else "- | -"
        lines.append(f"| {o} | {the_plan['steps'][o]} | {per_step:.3g} | {compared} | "
                     f"{f'{rate:.0f}' if rate else '-'} | {pre['exit_status'].get(o)} |")
    keys = sorted({k for ev in results["eval"].values() for k in ev})  # MLM runs lack disc_*
    data = pre.get("data", {})
    if common and data:
        lines += ["", f"Data: {data['train_examples']} training examples of "
                  f"{pre['settings']['max_seq_length']} tokens; epochs over them at the compared "
                  "steps: " + ", ".join(
                      f"{o} {common[o] * pre['settings']['train_batch_size'] / data['train_examples']:.2f}"
                      for o in OBJECTIVES) + "."]
    lines += ["", "## Held-out eval of the pretrained models", "",
              "| objective | " + " | ".join(keys) + " |", "|---|" + "---:|" * len(keys)]
    for o, ev in results["eval"].items():
        lines.append(f"| {o} | " + " | ".join(f"{ev[k]:.4f}" if k in ev else "-" for k in keys)
                     + " |")
    lines += ["", "## Fine-tuning (mean ± sample std over seeds, %)", "",
              "| model | task | dev accuracy | test accuracy |", "|---|---|---:|---:|"]
    for model, tasks in results["finetuning"].items():
        for task, summary in tasks.items():
            lines.append(f"| {model} (GPU run, {summary.get('trials', '?')} seed(s)) | {task} | "
                         f"{_stat(summary, 'dev')} | {_stat(summary, 'test')} |")
    cpu = results.get("cpu_experiment") or {}
    for model, tasks in cpu.get("finetuning", {}).items():
        for task, summary in tasks.items():
            lines.append(f"| {model} (CPU run, {cpu['budget_flops']:.3g} FLOPs, tiny) | {task} | "
                         f"{_stat(summary, 'dev')} | {_stat(summary, 'test')} |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="phase", required=True)
    p = sub.add_parser("pretrain", help="phase 1, on the GPU machine (JAX, no TensorFlow)")
    p.add_argument("--data-dir", required=True,
                   help="vocab.txt and pretrain_tfrecords/ (the builder's output); the runs go "
                        "to DATA_DIR/models/gpu_electra and gpu_mlm")
    p.add_argument("--out", required=True, help="where gpu_results.json and the returned parts go")
    p.add_argument("--deadline", type=float, default=300.0,
                   help="seconds after which both runs are stopped (SIGTERM: they save and "
                        "exit); what both reached is returned. Default: 300")
    p.add_argument("--sequential", action="store_true",
                   help="one objective after the other (default: both at once on the device)")
    p.add_argument("--budget-flops", type=float, default=None,
                   help="pretraining FLOPs per objective (default: 1e16; --smoke: 3e10)")
    p.add_argument("--learning-rate", type=float, default=None,
                   help="peak learning rate of both runs (default: 5e-4; --smoke: 5e-4)")
    p.add_argument("--train-batch-size", type=int, default=None,
                   help="global batch of both runs (default: 512; --smoke: 8); the FLOPs budget "
                        "fixes the steps")
    p.add_argument("--min-warmup-steps", type=int, default=None,
                   help="the warmup is max(10%% of the steps, this) (default: 600; --smoke: 0)")
    p.add_argument("--adam-bias-correction", action="store_true",
                   help="Adam's bias correction (the adam_bias_correction hparam; default: the "
                        "official update, without it)")
    p.add_argument("--smoke", action="store_true", help="tiny model and budget (CPU, tests)")
    e = sub.add_parser("evaluate", help="phase 2, here (TensorFlow): eval and fine-tuning")
    e.add_argument("--returned", required=True, help="the folder phase 1 wrote (--out there)")
    e.add_argument("--data-dir", required=True,
                   help="the same data as phase 1 (its held-out split is evaluated)")
    e.add_argument("--work-dir", default=None,
                   help="fine-tuning runs and labelled data (default: DATA_DIR/experiment_gpu)")
    e.add_argument("--output-dir", default=None,
                   help="results.json and summary.md (default: docs/experiments/electra_vs_mlm_gpu;"
                        " --smoke: WORK_DIR/output)")
    e.add_argument("--num-eval-steps", type=int, default=100,
                   help="held-out eval batches (default: 100)")
    e.add_argument("--raw-dir", default=None,
                   help="fine-tuning task TSVs (default: fetched, electra_tf.sources.labelled)")
    e.add_argument("--seeds", type=int, default=None,
                   help="fine-tuning seeds (default: 3); a fine-tuning run already in the work "
                        "dir with at least this many is reused whole")
    e.add_argument("--tasks", default=",".join(cpu_experiment.TASKS),
                   help="comma-separated fine-tuning tasks (default: "
                        f"{','.join(cpu_experiment.TASKS)})")
    e.add_argument("--smoke", action="store_true", help="tiny settings (CPU, tests)")
    return parser


def recipe_overrides(settings: GpuSettings, args) -> GpuSettings:
    """`settings` with the pretrain phase's recipe flags applied (a sweep runs one process per
    setting, side by side on the GPU with XLA_PYTHON_CLIENT_MEM_FRACTION)."""
    changes = {}
    for flag, field in (("learning_rate", "learning_rate"), ("train_batch_size", "train_batch_size"),
                        ("min_warmup_steps", "min_warmup_steps")):
        value = getattr(args, flag, None)
        if value is not None:
            if value <= 0 and field != "min_warmup_steps" or value < 0:
                raise SystemExit(f"electra_vs_mlm_gpu.py: error: --{flag.replace('_', '-')} "
                                 f"must be positive, got {value}")
            changes[field] = value
    if getattr(args, "adam_bias_correction", False):
        changes["adam_bias_correction"] = True
    return dataclasses.replace(settings, **changes)


def _tasks(text: str) -> tuple:
    tasks = tuple(t.strip() for t in text.split(",") if t.strip())
    unknown = [t for t in tasks if t not in cpu_experiment.TASKS]
    if unknown or not tasks:
        raise SystemExit(f"electra_vs_mlm_gpu.py: error: --tasks {text!r}: choose from "
                         f"{', '.join(cpu_experiment.TASKS)}")
    return tasks


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("electra_tf").setLevel(logging.INFO)
    settings = SMOKE if args.smoke else GPU
    if args.phase == "pretrain":
        # Before anything imports keras (the plan reads electra_tf.config): no TensorFlow there.
        os.environ.setdefault("KERAS_BACKEND", "jax")
        if args.budget_flops:
            settings = dataclasses.replace(settings, budget_flops=args.budget_flops)
        settings = recipe_overrides(settings, args)
        results = pretrain_phase(settings, args.data_dir, args.out, args.deadline,
                                 concurrent=not args.sequential)
        print(json.dumps({k: results[k] for k in ("common_fraction", "common_steps",
                                                  "examples_per_second", "exit_status",
                                                  "wall_seconds")}, sort_keys=True))
        return 0 if results.get("parts") else 1
    work_dir = args.work_dir or os.path.join(args.data_dir, "experiment_gpu")
    output_dir = args.output_dir or (os.path.join(work_dir, "output") if args.smoke else
                                     os.path.join(REPO_ROOT, "docs", "experiments",
                                                  "electra_vs_mlm_gpu"))
    results = evaluate_phase(settings, args.returned, args.data_dir, work_dir, output_dir,
                             args.num_eval_steps, raw_dir=args.raw_dir, seeds=args.seeds,
                             tasks=_tasks(args.tasks))
    print(summary_markdown(results))
    print(f"outputs: {output_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
