"""Memory left behind per pretraining run in one process, with and without graph_leaks.

Runs `electra_tf.training.tf.trainer.run` several times in one process (a sweep, a notebook, a test
suite do this), each a fresh run directory, and prints the resident set after each run once the
run's objects are dropped and collected. Two processes: one as the library runs, one where
`graph_leaks.custom_gradients_released` is replaced by a block that releases nothing, which is
how TensorFlow behaves on its own (tensorflow/tensorflow#97697).

    python benchmarks/graph_memory.py                      # ELECTRA-small, 4 runs per mode
    python benchmarks/graph_memory.py --model-size small --runs 6 --steps 2
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

from benchmarks.cli_types import positive_int  # noqa: E402


def resident_mib() -> float:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def measure(args) -> list:
    """The worker: `args.runs` runs in this process; returns the resident MiB after each."""
    import gc

    from electra_tf.config import PretrainingConfig
    from electra_tf.training.tf import graph_leaks
    from electra_tf.training.tf import trainer as trainer_lib

    if not args.release:
        graph_leaks.custom_gradients_released = contextlib.nullcontext
    sizes = []
    for i in range(args.runs):
        config = PretrainingConfig.create(f"run{i}", args.data_dir, {
            "model_size": args.model_size, "max_seq_length": 128, "vocab_size": 30522,
            "train_batch_size": args.batch, "num_train_steps": args.steps,
            "iterations_per_loop": args.steps, "save_checkpoints_steps": args.steps,
            "num_warmup_steps": 1, "do_eval": False, "do_export": False})
        trainer_lib.run(config)
        gc.collect()
        sizes.append(resident_mib())
        print(f"  run {i + 1}: {sizes[-1]:.0f} MiB", file=sys.stderr, flush=True)
    return sizes


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-size", default="small", choices=["small", "base", "large"],
                        help="model size of every run. Default: small")
    parser.add_argument("--runs", type=positive_int, default=4,
                        help="runs per process (per mode). Default: 4")
    parser.add_argument("--steps", type=positive_int, default=2,
                        help="training steps per run. Default: 2")
    parser.add_argument("--batch", type=positive_int, default=8, help="batch size. Default: 8")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--release", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--data-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(measure(args)))
        return 0

    from benchmarks.pretrain_step import write_dataset

    work = tempfile.mkdtemp(prefix="graph_memory_")
    try:
        write_dataset(work, num_shards=1, examples_per_shard=max(64, args.batch * args.steps))
        for release in (1, 0):
            label = "with graph_leaks" if release else "TensorFlow alone (nothing released)"
            print(f"{label}: {args.runs} runs of {args.model_size}, {args.steps} steps at batch "
                  f"{args.batch}", flush=True)
            shutil.rmtree(os.path.join(work, "models"), ignore_errors=True)
            out = subprocess.run(
                [sys.executable, os.path.abspath(__file__), "--worker", "--release", str(release),
                 "--data-dir", work, "--model-size", args.model_size, "--runs", str(args.runs),
                 "--steps", str(args.steps), "--batch", str(args.batch)],
                stdout=subprocess.PIPE, text=True, check=True, cwd=REPO_ROOT)
            sizes = json.loads(out.stdout.strip().splitlines()[-1])
            growth = (sizes[-1] - sizes[0]) / max(1, len(sizes) - 1)
            print(f"  after each run: {', '.join(f'{s:.0f}' for s in sizes)} MiB; "
                  f"{growth:.0f} MiB more per run after the first", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
