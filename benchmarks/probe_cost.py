"""What the learning probe (`probe` hparam) adds to a pretraining run's time.

Runs the same ELECTRA-small pretraining twice in one process, without and with the probe on a
classification task directory, and prints: the wall time of each run (set-up, training, the
probe's task encoding and probes included), the seconds of each probe, the training seconds per
step, and the overhead the probe adds at its documented defaults (every 1000 steps, at most
1000 train / 500 dev examples):

    overhead = probe seconds / (every_n_steps x seconds per step)

measured here at a short cadence (`--every`) so both runs fit in minutes; the end-to-end
difference of the two runs is printed beside the probes' own seconds as a check.

    python benchmarks/probe_cost.py --task-dir DIR          # DIR: e.g. finetuning_data/bbc_news
    python benchmarks/probe_cost.py --task-dir DIR --steps 40 --every 20 --batch-size 32
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

from benchmarks.cli_types import positive_int  # noqa: E402

DOCUMENTED_EVERY = 1000


def run_once(args, model_dir: str, probe: dict = None) -> dict:
    from electra_tf.config import PretrainingConfig
    from electra_tf.finetuning import probe as probe_lib
    from electra_tf.training.tf import trainer

    hparams = {"num_train_steps": args.steps, "num_warmup_steps": 10,
               "train_batch_size": args.batch_size, "iterations_per_loop": args.every,
               "save_checkpoints_steps": args.steps, "do_export": False, "model_dir": model_dir}
    if probe is not None:
        hparams["probe"] = probe
    config = PretrainingConfig.create("probe_cost", args.data_dir, hparams)
    start = time.time()
    results = trainer.run(config, observers=probe_lib.for_run)
    return {"seconds": time.time() - start, "probe": results.get("probe", []),
            "examples_per_second": results["train"]["examples_per_second"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=os.path.join(REPO_ROOT, "pretrain_data"))
    parser.add_argument("--task-dir", required=True, help="a classification task directory")
    parser.add_argument("--steps", type=positive_int, default=40)
    parser.add_argument("--every", type=positive_int, default=20,
                        help="probe cadence (and steps per loop) of the measured runs")
    parser.add_argument("--batch-size", type=positive_int, default=32)
    args = parser.parse_args()
    from electra_tf import console

    console.setup()
    work = tempfile.mkdtemp(prefix="probe_cost_")
    try:
        without = run_once(args, os.path.join(work, "without"))
        with_probe = run_once(args, os.path.join(work, "with"),
                              {"task_dir": args.task_dir, "every_n_steps": args.every})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    probes = [p["seconds"] for p in with_probe["probe"]]
    # The last loop's training rate (compilation excluded) gives the steady step time.
    step_seconds = args.batch_size / without["examples_per_second"]
    report = {
        "settings": vars(args), "run_seconds_without": round(without["seconds"], 1),
        "run_seconds_with": round(with_probe["seconds"], 1),
        "difference_seconds": round(with_probe["seconds"] - without["seconds"], 1),
        "probe_seconds": [round(s, 2) for s in probes],
        "probe_dev_accuracy": [round(p["dev_accuracy"], 4) for p in with_probe["probe"]],
        "seconds_per_step": round(step_seconds, 3),
        "overhead_at_documented_every_n_steps": round(
            max(probes[1:] or probes) / (DOCUMENTED_EVERY * step_seconds), 4),
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
