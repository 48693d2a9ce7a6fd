"""Benchmark: one fine-tuning step on JAX against TensorFlow (issue 48's 1.2x target), alternating.

Times the fine-tuning runners' own training steps on one fixed batch: the TensorFlow runner's
`tf.function` step (`runner.train`'s `step_fn`: GradientTape, `summed_loss`, `apply_gradients`
with the repeated embedding rows summed; one inter-op thread, as `runner._run` sets) and the
JAX runner's `portable_runner._JaxSteps` (one jitted `value_and_grad` + clip +
AdamWeightDecay), with dropout as in real fine-tuning (`training=True`; `--no-dropout` sets
both dropout rates to 0 for an ablation).

Each backend runs in its own worker process (a Keras backend is chosen once per process); both
build their model and compile their step first, then the parent asks them in turn for `--steps`
steps at a time (TF, JAX, TF, JAX, ... for `--rounds` rounds), so that a shared machine's load
falls on both alike; the worker not asked waits on its stdin (no CPU). Per round and backend:
wall and process CPU time (`time.process_time`: every thread of the worker) per step, each
step synchronised on its loss (`float(loss)`, as the runners' loops do).

The model: `--size small` (default) is ELECTRA-small as fine-tuning builds it for
`random_init` (`pretrained.load_pretrained`: hidden 256, 12 layers, 4 heads, intermediate 1024,
embedding 128, vocab 30522); `--tiny` the tiny encoder of docs/finetuning.md's 3-seed runs
(hidden 64, 2 layers, 2 heads, intermediate 128, embedding 32). One classification head of 5
labels (BBC News' topics). The batch is synthetic: random ids from the vocab, every position
real (`input_mask` all ones, as BBC News' articles are longer than 128 tokens), `--batch` rows
of `--seq-length`; the step's time does not depend on the ids (fixed shapes).

    python benchmarks/finetune_step.py --tiny --rounds 3 --steps 5        # a quick look
    python benchmarks/finetune_step.py --size small --rounds 6 --steps 5 \
        --precision auto                                 # each runner's default precision here

Prints one JSON object: the arguments, the CPU's AVX-512 / AMX flags, the load average before
and after, per backend the per-round ms/step (wall, cpu), their medians, and the ratio of JAX's
medians to TensorFlow's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

from benchmarks.cli_types import positive_int  # noqa: E402
from electra_tf import malloc_tunables, precision  # noqa: E402

BACKENDS = ("tensorflow", "jax")
TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
        "intermediate_size": 128}
NUM_LABELS = 5
TASK = "bbc_news"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--size", choices=["small", "base", "large"], default="small",
                      help="the model size fine-tuning builds for random_init. Default: small")
    size.add_argument("--tiny", action="store_true",
                      help="the tiny encoder of docs/finetuning.md's 3-seed runs instead")
    parser.add_argument("--backends", default=",".join(BACKENDS),
                        help="comma-separated, timed in this order each round. "
                             "Default: tensorflow,jax")
    parser.add_argument("--batch", type=positive_int, default=32, help="Default: 32")
    parser.add_argument("--seq-length", type=positive_int, default=128, help="Default: 128")
    parser.add_argument("--precision", choices=["float32", "mixed_bfloat16", "auto"],
                        default="float32",
                        help="the Keras policy of both models; auto: what `mixed_precision: "
                             "auto` picks for each backend on this machine (the runners' "
                             "default: each worker prints its choice). Default: float32")
    parser.add_argument("--no-dropout", action="store_true",
                        help="dropout rates 0 (an ablation; fine-tuning has 0.1)")
    parser.add_argument("--rounds", type=positive_int, default=5,
                        help="timed rounds per backend, alternating. Default: 5")
    parser.add_argument("--steps", type=positive_int, default=5,
                        help="steps per round. Default: 5")
    parser.add_argument("--warmup", type=positive_int, default=3,
                        help="untimed steps after compiling. Default: 3")
    parser.add_argument("--default-malloc", action="store_true",
                        help="run the JAX worker with glibc's malloc as it comes, not with the "
                             "tunables `run_finetuning.py --backend jax` sets on a CPU "
                             "(electra_tf/malloc_tunables.py; an ablation)")
    parser.add_argument("--vocab-file", default=os.path.join(REPO_ROOT, "pretrain_data", "vocab.txt"),
                        help="the BERT vocab (its size is the embedding's). "
                             "Default: pretrain_data/vocab.txt")
    parser.add_argument("--worker", choices=BACKENDS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    backends = [b for b in args.backends.split(",") if b]
    unknown = [b for b in backends if b not in BACKENDS]
    if unknown or not backends:
        parser.error(f"--backends takes {' and '.join(BACKENDS)}, got {args.backends!r}")
    args.backends = backends
    return args


def cpu_flags(path: str = precision.CPU_INFO) -> list:
    """The CPU's AVX-512 and AMX flags (`grep -o 'avx512[a-z_0-9]*\\|amx[a-z_0-9]*'`), read by
    `precision.read_cpu` (the reader `mixed_precision: auto` decides by)."""
    return precision.recorded_cpu_flags(precision.read_cpu(path)[1])


def load_average() -> list:
    """The 1, 5 and 15 minute load averages (`/proc/loadavg`'s first three fields)."""
    return list(os.getloadavg())


def _hparams(args: argparse.Namespace) -> dict:
    hparams = {"task_names": [TASK], "random_init": True, "model_size": args.size,
               "vocab_file": args.vocab_file, "max_seq_length": args.seq_length,
               "train_batch_size": args.batch, "mixed_precision": args.precision}
    if args.tiny:
        hparams.update(model_size="small", model_hparam_overrides=dict(TINY), embedding_size=32)
    return hparams


def _worker(args: argparse.Namespace) -> None:
    """Builds the model and step of `args.worker`, then answers "run" lines on stdin with one
    JSON line of {"wall": s, "cpu": s} for `args.steps` steps."""
    os.environ["KERAS_BACKEND"] = args.worker
    import keras
    import numpy as np

    from electra_tf.finetuning import portable_runner, runner
    from electra_tf.finetuning.config import PRECISIONS, FinetuningConfig
    from electra_tf.finetuning.model import FinetuningModel, summed_loss
    from electra_tf.finetuning.pretrained import load_pretrained

    if args.worker == "tensorflow":
        from electra_tf.training.tf.strategy import set_inter_op_threads

        set_inter_op_threads()  # as runner._run: one op at a time on a CPU-only machine
    if args.precision == "auto":  # as runner.run decides it
        args.precision = precision.resolve(
            "auto", precision.detect() if args.worker == "tensorflow"
            else precision.detect_keras_backend(args.worker), PRECISIONS[1:]).policy
    config = FinetuningConfig.create("bench", tempfile.mkdtemp(prefix="finetune_step_"),
                                     _hparams(args))
    encoder = dict(load_pretrained(config).encoder_config)
    if args.no_dropout:
        encoder.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    keras.mixed_precision.set_global_policy(args.precision)
    keras.utils.set_random_seed(0)
    model = FinetuningModel(encoder, [{"name": TASK, "family": "classification",
                                       "num_labels": NUM_LABELS}])
    optimizer = runner.make_optimizer(model, config, 1000)
    rng = np.random.default_rng(0)
    shape = (args.batch, args.seq_length)
    batch = {"input_ids": rng.integers(5, encoder["vocab_size"], shape).astype(np.int32),
             "input_mask": np.ones(shape, np.int32), "segment_ids": np.zeros(shape, np.int32),
             portable_runner.TASK_ID: np.zeros(args.batch, np.int32),
             f"{TASK}_label_ids": rng.integers(0, NUM_LABELS, args.batch).astype(np.int32)}
    if args.worker == "tensorflow":
        import tensorflow as tf

        from electra_tf.training.optimization import apply_gradients

        variables = model.trainable_variables
        tf_batch = {k: tf.constant(v) for k, v in batch.items()}

        @tf.function
        def step_fn(batch):  # runner.train's step_fn
            with tf.GradientTape() as tape:
                loss = summed_loss(model(batch, training=True), batch[portable_runner.TASK_ID],
                                   [TASK])
            apply_gradients(optimizer, tape.gradient(loss, variables), variables,
                            sum_repeated_rows=True)
            return loss

        def step():
            return float(step_fn(tf_batch))
    else:
        portable_runner._build(model, batch)
        steps = portable_runner._JaxSteps(model, optimizer, [TASK])

        def step():
            return float(steps.step(batch))

    start = time.perf_counter()
    step()
    compile_s = time.perf_counter() - start
    for _ in range(args.warmup):
        step()
    print(json.dumps({"ready": True, "first_step_s": compile_s, "precision": args.precision}),
          flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            break
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(args.steps):
            loss = step()
        print(json.dumps({"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu,
                          "loss": loss}), flush=True)


def worker_argv(argv: list) -> list:
    """The parent's arguments less `--backends` and its value (each worker times one)."""
    forwarded, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--backends":
            skip = True
        elif not arg.startswith("--backends="):
            forwarded.append(arg)
    return forwarded


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.worker:
        _worker(args)
        return {}
    forwarded = worker_argv(argv if argv is not None else sys.argv[1:])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [REPO_ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    # The JAX worker starts as `run_finetuning.py --backend jax` re-executes itself on a CPU.
    worker_env = {"tensorflow": env, "jax": env if args.default_malloc
                  else malloc_tunables.environ_for_jax(env) or env}
    result = {"args": {k: v for k, v in vars(args).items() if k != "worker"},
              "cpu_flags": cpu_flags(), "cpu_count": os.cpu_count(),
              "loadavg_before": load_average()}
    workers, first = {}, {}
    try:
        for backend in args.backends:  # one at a time: compiling does not overlap
            workers[backend] = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--worker", backend] + forwarded,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                text=True, env=worker_env[backend])
            ready = workers[backend].stdout.readline()
            if not ready:
                raise RuntimeError(f"the {backend} worker exited before its first step: rerun "
                                   f"with --worker {backend} to see its error")
            first[backend] = json.loads(ready)
        rounds = {b: [] for b in args.backends}
        for _ in range(args.rounds):
            for backend, worker in workers.items():
                worker.stdin.write("run\n")
                worker.stdin.flush()
                timing = json.loads(worker.stdout.readline())
                rounds[backend].append({"wall_ms": 1000 * timing["wall"] / args.steps,
                                        "cpu_ms": 1000 * timing["cpu"] / args.steps})
    finally:
        for worker in workers.values():
            worker.stdin.close()
            worker.wait()
    result["loadavg_after"] = load_average()
    result["backends"] = {
        b: {"precision": first[b]["precision"], "first_step_s": round(first[b]["first_step_s"], 2),
            "glibc_tunables": worker_env[b].get(malloc_tunables.GLIBC_TUNABLES_ENV),
            "rounds": [{k: round(v, 1) for k, v in r.items()} for r in rounds[b]],
            "median_wall_ms": round(statistics.median(r["wall_ms"] for r in rounds[b]), 1),
            "median_cpu_ms": round(statistics.median(r["cpu_ms"] for r in rounds[b]), 1)}
        for b in args.backends}
    if set(BACKENDS) <= set(args.backends):
        tf_, jax_ = result["backends"]["tensorflow"], result["backends"]["jax"]
        result["jax_over_tensorflow"] = {
            key: round(jax_[f"median_{key}_ms"] / tf_[f"median_{key}_ms"], 2)
            for key in ("wall", "cpu")}
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
