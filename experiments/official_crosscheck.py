"""Fidelity over time: google-research/electra's own pretraining beside electra-tf's, curve by curve.

The one-step parity tests (docs/parity.md) prove that a step equals the official step; they
cannot see dynamics. This script trains the official code (its `PretrainingModel`, input function
and `create_optimizer`, run under TF 2.21 `compat.v1` by `experiments/official_compat.py`) and
electra-tf's TensorFlow trainer on the same shards with the same config, for each learning-rate
setting and several seeds, and sets their discriminator loss, discriminator AUC and generator MLM
accuracy side by side. Both sides' metrics are computed by the same code
(`electra_tf.pretraining.metrics.PretrainingMetrics`, over each window of `--every` training
steps, with dropout on, as electra-tf's training scalars); the official side feeds it the
official `eval_fn_inputs` of every step.

    git clone https://github.com/google-research/electra ~/electra    # the official sources
    python experiments/official_crosscheck.py --official-dir ~/electra
    python experiments/official_crosscheck.py --help

Reading it: the spread between seeds of one implementation is the noise; a difference between the
implementations' means larger than that noise, persisting over steps, is a difference in
behaviour. Writes results.json, summary.md and curves.png to --output-dir. Re-running reuses
finished runs (one JSON each in --work-dir/runs).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import logging
import math
import os
import subprocess
import sys
import time
from typing import Dict, List

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(1, REPO_ROOT)

logger = logging.getLogger("electra_tf.experiment")

IMPLEMENTATIONS = ("official", "electra_tf")
# Diagnostic variants of electra-tf (not compared by default): "electra_tf_cpu_clip" clips by the
# norm the official code computes on CPU/GPU, where an embedding gradient's rows of a repeated
# token id count separately (`tf.clip_by_global_norm` of an IndexedSlices); electra-tf's default
# is the official TPU path's norm of the summed rows (docs/parity.md, item 32).
VARIANTS = ("electra_tf_cpu_clip",)
TAGS = ("disc_loss", "disc_auc", "disc_recall", "masked_lm_accuracy", "masked_lm_loss")


@dataclasses.dataclass(frozen=True)
class Model:
    """The encoder sizes both implementations train (official hparam names)."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    embedding_size: int
    max_seq_length: int
    train_batch_size: int


# Small enough for several thousand steps per run on a 2-core CPU in float32 (the official code
# runs float32 only). The generator is the official 1/4 width (16 hidden, 1 head).
MICRO = Model(hidden_size=64, num_hidden_layers=2, num_attention_heads=1, intermediate_size=256,
              embedding_size=64, max_seq_length=128, train_batch_size=32)

# The learning-rate settings compared: name -> (learning_rate, num_warmup_steps as a fraction of
# the run). "official" is the official recipe's peak rate with a 10% warmup; "hot" is ten times
# the rate with a 1% warmup, the regime of the collapse seen on a GPU (issue 44).
SETTINGS = {"official": (5e-4, 0.10), "hot": (5e-3, 0.01)}


def official_hparams(model: Model, vocab_size: int, learning_rate: float, warmup: int,
                     steps: int) -> dict:
    """The run's hparams in the official names (also valid electra-tf hparams)."""
    return {
        "model_size": "small",
        "model_hparam_overrides": {
            "hidden_size": model.hidden_size, "num_hidden_layers": model.num_hidden_layers,
            "num_attention_heads": model.num_attention_heads,
            "intermediate_size": model.intermediate_size},
        "embedding_size": model.embedding_size, "max_seq_length": model.max_seq_length,
        "train_batch_size": model.train_batch_size, "vocab_size": vocab_size,
        "learning_rate": learning_rate, "num_warmup_steps": warmup, "num_train_steps": steps,
    }


def _window_point(step: int, result: Dict[str, object]) -> dict:
    return {"step": step, **{tag: float(result[tag]) for tag in TAGS if tag in result}}


def run_official(official_dir: str, data_dir: str, hparams: dict, seed: int, steps: int,
                 every: int, threads: int) -> List[dict]:
    """The official model's curve: PretrainingMetrics over each window of `every` steps."""
    from electra_tf.pretraining.metrics import PretrainingMetrics
    from experiments import official_compat

    metrics = PretrainingMetrics(electra_objective=True)
    curve: List[dict] = []
    start = time.time()

    def on_step(step: int, loss: float, outputs: Dict[str, object]) -> bool:
        if not math.isfinite(loss):
            raise RuntimeError(f"official run: non-finite loss at step {step}")
        metrics.update_state(outputs)
        if step % every == 0:
            curve.append(_window_point(step, metrics.result()))
            metrics.reset_state()
            logger.info("official step %d: %s (%.0f s)", step, _fmt(curve[-1]), time.time() - start)
        return False

    official_compat.train(official_dir, data_dir, hparams, seed, steps, on_step, threads)
    return curve


def run_electra_tf(data_dir: str, model_dir: str, hparams: dict, seed: int, every: int,
                   threads: int, cpu_clip: bool = False) -> List[dict]:
    """electra-tf's TensorFlow trainer on the same hparams; its per-loop training scalars.

    cpu_clip: clip by the official CPU/GPU norm (unsummed embedding rows) instead of the TPU
    path's (the `official_gpu_clip_norm` hparam; a diagnostic)."""
    import tensorflow as tf

    from electra_tf.config import PretrainingConfig
    from electra_tf.training.tf.trainer import Trainer
    from experiments.electra_vs_mlm import read_scalars

    if threads:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
    ours = dict(hparams, seed=seed, mixed_precision="float32", strategy="one_device",
                iterations_per_loop=every, save_checkpoints_steps=hparams["num_train_steps"],
                keep_checkpoint_max=1, do_eval=False, do_export=False,
                model_dir=model_dir, official_gpu_clip_norm=cpu_clip)
    config = PretrainingConfig.create(os.path.basename(model_dir), data_dir, ours)
    Trainer(config).train()
    series = read_scalars(model_dir, TAGS)
    steps = sorted({int(s) for values in series.values() for s, _ in values})
    table = {tag: dict((int(s), v) for s, v in values) for tag, values in series.items()}
    return [{"step": s, **{tag: table[tag][s] for tag in TAGS if s in table.get(tag, {})}}
            for s in steps]


def _fmt(point: dict) -> str:
    return ", ".join(f"{tag} {point[tag]:.4f}" for tag in TAGS if tag in point)


def dataset_shape(data_dir: str):
    """(vocab size, max_seq_length) of DATA_DIR: its vocab.txt lines and its manifest."""
    vocab = os.path.join(data_dir, "vocab.txt")
    manifest = os.path.join(data_dir, "pretrain_tfrecords", "manifest.json")
    for path in (vocab, manifest):
        if not os.path.exists(path):
            raise SystemExit(f"{path} not found: --data-dir needs vocab.txt and "
                             "pretrain_tfrecords/ from build_pretraining_dataset.py")
    with open(vocab, encoding="utf-8") as f:
        vocab_size = sum(1 for _ in f)
    with open(manifest, encoding="utf-8") as f:
        return vocab_size, int(json.load(f)["max_seq_length"])


def run_name(impl: str, setting: str, seed: int) -> str:
    return f"{impl}_{setting}_seed{seed}"


def one_run(args) -> int:
    """The `_run` subcommand: one (implementation, setting, seed), written to a JSON."""
    learning_rate, warmup_fraction = SETTINGS[args.setting]
    vocab_size, seq = dataset_shape(args.data_dir)
    hparams = official_hparams(dataclasses.replace(MICRO, max_seq_length=seq), vocab_size,
                               learning_rate,
                               max(1, int(round(warmup_fraction * args.steps))), args.steps)
    name = run_name(args.impl, args.setting, args.seed)
    start = time.time()
    if args.impl == "official":
        curve = run_official(args.official_dir, args.data_dir, hparams, args.seed, args.steps,
                             args.every, args.threads)
    else:
        curve = run_electra_tf(args.data_dir, os.path.join(args.work_dir, "models", name),
                               hparams, args.seed, args.every, args.threads,
                               cpu_clip=args.impl == "electra_tf_cpu_clip")
    record = {"implementation": args.impl, "setting": args.setting, "seed": args.seed,
              "hparams": hparams, "curve": curve, "seconds": time.time() - start}
    path = os.path.join(args.work_dir, "runs", name + ".json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(record, f, indent=1)
    os.replace(path + ".tmp", path)
    return 0


# ------------------------------------------------------------------------------------------------
# Summary
# ------------------------------------------------------------------------------------------------
def _mean_std(values: List[float]):
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return None, None
    mean = sum(values) / len(values)
    std = (math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
           if len(values) > 1 else 0.0)
    return mean, std


def aggregate(runs: List[dict]) -> Dict[str, Dict[str, Dict[str, list]]]:
    """{setting: {impl: {tag: [[step, mean, std, n], ...]}}} over seeds."""
    out: Dict[str, Dict[str, Dict[str, list]]] = {}
    for setting in sorted({r["setting"] for r in runs}):
        for impl in IMPLEMENTATIONS + VARIANTS:
            group = [r for r in runs if r["setting"] == setting and r["implementation"] == impl]
            if not group:
                continue
            steps = sorted({p["step"] for r in group for p in r["curve"]})
            series = {}
            for tag in TAGS:
                rows = []
                for step in steps:
                    values = [p.get(tag) for r in group for p in r["curve"] if p["step"] == step]
                    mean, std = _mean_std(values)
                    if mean is not None:
                        rows.append([step, mean, std, len([v for v in values if v is not None])])
                series[tag] = rows
            out.setdefault(setting, {})[impl] = series
    return out


def compare(aggregated: dict) -> Dict[str, Dict[str, Dict[str, dict]]]:
    """{setting: {impl: {tag: ...}}} for every implementation beside the official one, over the
    second half of the run (once the curves have moved): the mean difference impl - official, and
    the seed noise (the larger of the two implementations' mean across-seed standard deviations).
    """
    out: Dict[str, Dict[str, Dict[str, dict]]] = {}
    for setting, impls in aggregated.items():
        if "official" not in impls:
            continue
        for impl in [i for i in impls if i != "official"]:
            for tag in TAGS:
                ours = {row[0]: row for row in impls[impl].get(tag, [])}
                theirs = {row[0]: row for row in impls["official"].get(tag, [])}
                steps = sorted(set(ours) & set(theirs))
                late = steps[len(steps) // 2:]
                if not late:
                    continue
                mean = lambda rows, i: sum(rows[s][i] for s in late) / len(late)  # noqa: E731
                out.setdefault(setting, {}).setdefault(impl, {})[tag] = {
                    "steps": [late[0], late[-1]],
                    "minus_official": mean(ours, 1) - mean(theirs, 1),
                    "seed_std": max(mean(ours, 2), mean(theirs, 2)),
                    "late_mean": mean(ours, 1), "official_late_mean": mean(theirs, 1),
                    "seeds": [int(theirs[late[-1]][3]), int(ours[late[-1]][3])]}
    return out


def summary_markdown(result: dict) -> str:
    lines = ["# Official ELECTRA against electra-tf, curve by curve", "",
             f"Model: {json.dumps(result['model'])}; vocab {result['vocab_size']}; "
             f"{result['steps']} steps; seeds {result['seeds']} where run; float32; metrics over windows of "
             f"{result['every']} training steps (dropout on). Means over the second half of the "
             "run; seed std: the larger implementation's mean across-seed standard deviation.", ""]
    for setting, impls in result["comparison"].items():
        lr, warm = SETTINGS[setting]
        for impl, tags in impls.items():
            n_official, n_impl = next(iter(tags.values()))["seeds"]
            lines += [f"## {setting} (learning_rate {lr:g}, warmup {warm:.0%} of the steps): "
                      f"{impl} against official", "",
                      f"Seeds: official {n_official}, {impl} {n_impl}.", "",
                      f"| metric | official | {impl} | difference | seed std |",
                      "|---|---:|---:|---:|---:|"]
            for tag, c in tags.items():
                lines.append(f"| {tag} | {c['official_late_mean']:.4f} | {c['late_mean']:.4f} | "
                             f"{c['minus_official']:+.4f} | {c['seed_std']:.4f} |")
            lines.append("")
    return "\n".join(lines)


def plot(aggregated: dict, path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tags = ("disc_auc", "disc_loss", "masked_lm_accuracy")
    settings = sorted(aggregated)
    fig, axes = plt.subplots(len(settings), len(tags), figsize=(5 * len(tags), 3.6 * len(settings)),
                             squeeze=False)
    colours = {"official": "tab:orange", "electra_tf": "tab:blue",
               "electra_tf_cpu_clip": "tab:green"}
    for row, setting in enumerate(settings):
        for col, tag in enumerate(tags):
            ax = axes[row][col]
            for impl, series in aggregated[setting].items():
                rows = series.get(tag, [])
                if not rows:
                    continue
                steps = [r[0] for r in rows]
                mean = [r[1] for r in rows]
                std = [r[2] for r in rows]
                ax.plot(steps, mean, color=colours[impl], label=f"{impl} (n={rows[0][3]})")
                ax.fill_between(steps, [m - s for m, s in zip(mean, std)],
                                [m + s for m, s in zip(mean, std)], color=colours[impl], alpha=0.2)
            lr, warm = SETTINGS[setting]
            ax.set_title(f"{setting} (lr {lr:g}, warmup {warm:.0%}): {tag}")
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------------------------
# The conductor
# ------------------------------------------------------------------------------------------------
def prepare_data(data_dir: str, vocab_size: int) -> None:
    """The default corpus built with a WordPiece vocab learned on it (`--learn-vocab`), unless
    `data_dir` already holds vocab.txt and pretrain_tfrecords/ (any dataset works)."""
    if os.path.exists(os.path.join(data_dir, "pretrain_tfrecords", "manifest.json")):
        return
    from electra_tf.data.build import build_config, builder
    from electra_tf.sources.fetch import default_data_ready, fetch_default_data

    default_dir = os.path.join(REPO_ROOT, "pretrain_data")
    if not default_data_ready(default_dir):
        fetch_default_data(default_dir)
    builder.build_dataset(build_config.BuildConfig(
        corpus_dir=os.path.join(default_dir, "corpus"), learn_vocab=vocab_size,
        output_dir=os.path.join(data_dir, "pretrain_tfrecords"),
        command="experiments/official_crosscheck.py"))


def _launch(args, impl: str, setting: str, seed: int, threads: int) -> str:
    name = run_name(impl, setting, seed)
    log = os.path.join(args.work_dir, "logs", name + ".log")
    os.makedirs(os.path.dirname(log), exist_ok=True)
    command = [sys.executable, os.path.abspath(__file__), "_run", "--impl", impl,
               "--setting", setting, "--seed", str(seed), "--steps", str(args.steps),
               "--every", str(args.every), "--threads", str(threads),
               "--work-dir", args.work_dir, "--data-dir", args.data_dir]
    if impl == "official":
        command += ["--official-dir", args.official_dir]
    with open(log, "w") as f:
        code = subprocess.call(command, stdout=f, stderr=subprocess.STDOUT)
    if code:
        raise RuntimeError(f"{name} failed (exit {code}); see {log}")
    return name


def conduct(args) -> int:
    if "official" in args.implementations and not args.summarize_only:
        from experiments.official_compat import check_official_dir

        args.official_dir = check_official_dir(args.official_dir or "")
    if not args.summarize_only:
        prepare_data(args.data_dir, args.vocab_size)
    # Seed-major: the first runs to finish show every setting on both implementations.
    todo = [(impl, setting, seed) for seed in args.seeds for setting in args.settings
            for impl in args.implementations
            if not os.path.exists(os.path.join(args.work_dir, "runs",
                                               run_name(impl, setting, seed) + ".json"))]
    if args.summarize_only:
        todo = []
    threads = max(1, (os.cpu_count() or 2) // args.jobs)
    logger.info("%d run(s) to do, %d at a time, %d thread(s) each", len(todo), args.jobs, threads)
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        for done in pool.map(lambda job: _launch(args, *job, threads), todo):
            logger.info("finished %s", done)
    runs = []
    for setting in args.settings:
        for seed in args.seeds:
            for impl in args.implementations:
                path = os.path.join(args.work_dir, "runs", run_name(impl, setting, seed) + ".json")
                if args.summarize_only and not os.path.exists(path):
                    continue
                with open(path) as f:
                    runs.append(json.load(f))
    if not runs:
        raise SystemExit(f"no finished runs in {os.path.join(args.work_dir, 'runs')}")
    aggregated = aggregate(runs)
    vocab_size, seq = dataset_shape(args.data_dir)
    result = {"model": dataclasses.asdict(dataclasses.replace(MICRO, max_seq_length=seq)),
              "vocab_size": vocab_size, "steps": args.steps,
              "every": args.every, "seeds": args.seeds,
              "settings": {s: {"learning_rate": SETTINGS[s][0], "warmup_fraction": SETTINGS[s][1]}
                           for s in args.settings},
              "curves": aggregated, "comparison": compare(aggregated),
              "runs": [{k: r[k] for k in ("implementation", "setting", "seed", "seconds")}
                       for r in runs]}
    os.makedirs(args.output_dir, exist_ok=True)
    with open(os.path.join(args.output_dir, "results.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(args.output_dir, "summary.md"), "w") as f:
        f.write(summary_markdown(result) + "\n")
    plot(aggregated, os.path.join(args.output_dir, "curves.png"))
    print(summary_markdown(result))
    print(f"wrote {args.output_dir}")
    return 0


def _csv(kind):
    return lambda text: [kind(x) for x in text.split(",") if x]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", nargs="?", default="all", choices=("all", "_run"),
                        help="all (default): every run, then the summary; _run: one run (internal)")
    parser.add_argument("--official-dir", default=os.environ.get("ELECTRA_OFFICIAL_DIR"),
                        help="a google-research/electra checkout (default $ELECTRA_OFFICIAL_DIR)")
    parser.add_argument("--work-dir", default=os.path.join(REPO_ROOT, "pretrain_data", "experiments",
                                                           "official_crosscheck"),
                        help="runs, logs and model dirs (reused on a rerun)")
    parser.add_argument("--data-dir", default=None,
                        help="DATA_DIR with vocab.txt and pretrain_tfrecords/ (default WORK_DIR/"
                             "data: the default corpus with a learned vocab, built if missing)")
    parser.add_argument("--vocab-size", type=int, default=8192,
                        help="WordPiece vocab learned for the default data (a smaller vocab keeps "
                             "the MLM head from dominating a tiny model's step)")
    parser.add_argument("--output-dir", default=os.path.join(REPO_ROOT, "docs", "experiments",
                                                             "official_crosscheck"))
    parser.add_argument("--settings", type=_csv(str), default=list(SETTINGS),
                        help=f"comma-separated, of {', '.join(SETTINGS)}")
    parser.add_argument("--implementations", type=_csv(str), default=list(IMPLEMENTATIONS),
                        help=f"comma-separated, of {', '.join(IMPLEMENTATIONS + VARIANTS)}")
    parser.add_argument("--seeds", type=_csv(int), default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=2000, help="training steps per run")
    parser.add_argument("--every", type=int, default=100, help="steps per curve point")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time")
    parser.add_argument("--summarize-only", action="store_true",
                        help="run nothing: summarise the finished runs of the given settings, "
                             "seeds and implementations found in WORK_DIR/runs")
    # _run only:
    parser.add_argument("--impl", choices=IMPLEMENTATIONS + VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--setting", choices=tuple(SETTINGS), help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.work_dir = os.path.abspath(args.work_dir)
    args.data_dir = os.path.abspath(args.data_dir or os.path.join(args.work_dir, "data"))
    for name in args.settings:
        if name not in SETTINGS:
            parser.error(f"--settings: unknown setting {name!r}; choose from {', '.join(SETTINGS)}")
    for name in args.implementations:
        if name not in IMPLEMENTATIONS + VARIANTS:
            parser.error(f"--implementations: unknown {name!r}; choose from "
                         f"{', '.join(IMPLEMENTATIONS + VARIANTS)}")
    if args.steps < args.every or args.every < 1:
        parser.error("--steps must be >= --every >= 1")
    if args.jobs < 1:
        parser.error("--jobs must be >= 1")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    if args.command == "_run":
        return one_run(args)
    return conduct(args)


if __name__ == "__main__":
    sys.exit(main())
