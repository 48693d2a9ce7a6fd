"""ELECTRA against MLM-only (and two-stage training) at equal pretraining FLOPs, on this CPU.

    python experiments/electra_vs_mlm.py            # full experiment, about 90 minutes
    python experiments/electra_vs_mlm.py --quick    # tiny end-to-end check, a few minutes

What it does (docs/experiments.md has the design and the results):

1. Data: the default corpus (fetched if needed) is built into pretraining TFRecords in the work
   dir; BBC News and Pang & Lee are fetched as fine-tuning tasks (electra_tf.sources.labelled).
2. Pretraining, the same discriminator size for every objective, the same global batch, and the
   same pretraining FLOPs (counted by `flops_per_sequence`):
   - `electra`: the official joint objective (generator 1/4 width, shared embeddings);
   - `mlm`: MLM only (`electra_objective: false`), BERT with dynamic masking and no NSP;
   - `two_stage`: the paper's two-stage baseline. Stage 1 trains a generator of the
     discriminator's size alone with MLM for n steps (an MLM-only run); stage 2 starts the
     discriminator from those weights, freezes the generator (its copy of the stage-1 weights,
     with its own embeddings) and trains only the discriminator with the RTD loss for n steps.
     n is chosen so that both stages together cost the budget. Stage 2 is the trainer's
     `two_stage_generator_dir` hparam (with `untied_generator_embeddings`, a full-size
     generator and `gen_weight: 0`).
   Checkpoints are kept along the way, for the downstream-accuracy-vs-FLOPs curves.
   `--objectives` adds issue 34's variants of the ELECTRA objective at the same budget:
   - `gdes`: gradient-disentangled embedding sharing (DeBERTaV3; `embedding_sharing: gdes`);
   - `decoupled`: the generator and the discriminator each with their own optimizer
     (`decoupled_optimizers`); `gdes_decoupled`: both (DeBERTaV3's RTD recipe);
   - `fast_electra`: Fast-ELECTRA. Stage 1 trains a generator of the official size alone with
     MLM (an MLM-only run of its sizes); stage 2 trains the discriminator beside it, frozen
     (`frozen_generator_dir`: forward pass only), sampling at a temperature that falls linearly
     from `fast_electra_temperature_start` to 1 over stage 2 (`temperature_start`). Both stages
     have the same number of steps and together cost the budget.
   - `electra_corrected` (issue 44): `electra` with Adam's bias correction
     (`adam_bias_correction`), so the step right after warmup is `learning_rate`, not ~2x it.
3. Fine-tuning (electra_tf.finetuning, official recipe with the small-model learning rate
   3e-4): every final model, and a randomly initialised encoder of the same size as the floor,
   on both tasks with several seeds (mean ± sample std); intermediate checkpoints on BBC News.
4. The learning probe (electra_tf.finetuning.probe, the `probe` hparam's classifier) on every
   kept checkpoint: a linear classifier on the frozen encoder's mean-pooled features of BBC News
   (1000 train / 212 dev articles), fit afresh per checkpoint. It runs after pretraining on the
   saved checkpoints (the same numbers the `probe` hparam logs during a run, without adding its
   time to the pretraining wall times).
5. Outputs in --output-dir: results.json, summary.md (tables), downstream_vs_flops.png,
   probe_vs_flops.png and pretraining_curves.png (total / MLM / discriminator loss,
   discriminator accuracy and AUC by step, read from the runs' TensorBoard events: the
   reference curves of a healthy run).

Re-running resumes: finished pretraining runs and fine-tuning results found in the work dir are
reused. `--overwrite` starts afresh (it only deletes a work dir this script created).
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import logging
import os
import shutil
import sys
import time
from typing import Dict, List, Optional

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

logger = logging.getLogger("electra_tf.experiment")

WORK_MARKER = "electra_vs_mlm.json"  # written into a work dir this script owns
VOCAB_SIZE = 30522  # the default data's BERT uncased vocab
TASKS = ("bbc_news", "pang_lee")
OBJECTIVES = ("electra", "mlm", "two_stage")  # the default comparison
# Issue 34's variants of the ELECTRA objective: extra hparams over the `electra` run's.
VARIANT_HPARAMS = {
    "gdes": {"embedding_sharing": "gdes"},
    "decoupled": {"decoupled_optimizers": True},
    "gdes_decoupled": {"embedding_sharing": "gdes", "decoupled_optimizers": True},
    # Issue 44: the official recipe with Adam's bias correction. Uncorrected Adam after this
    # run's 300-step warmup steps about 2x `learning_rate` (training/adam_warmup.py); this
    # variant steps 1x, so it separates the schedule from the objective at this budget.
    "electra_corrected": {"adam_bias_correction": True},
}
ALL_OBJECTIVES = OBJECTIVES + tuple(VARIANT_HPARAMS) + ("fast_electra",)
TWO_STAGE = ("two_stage", "fast_electra")  # objectives charged a stage-1 run


@dataclasses.dataclass(frozen=True)
class Settings:
    """One experiment scale (`FULL` or `QUICK`)."""

    name: str
    model: dict  # model_hparam_overrides of the discriminator (and of the MLM model)
    embedding_size: int  # = hidden_size, so two_stage can copy a generator into a discriminator
    max_seq_length: int
    train_batch_size: int
    electra_steps: int  # the budget is electra_steps * FLOPs of one ELECTRA step
    checkpoint_fractions: tuple  # of each run's steps; 1.0 is the final model
    learning_rate: float
    warmup_fraction: float
    mixed_precision: str
    seeds: int  # fine-tuning seeds per final model
    curve_seeds: int  # fine-tuning seeds per intermediate checkpoint
    curve_tasks: tuple
    finetune: dict  # per task: max_seq_length, num_train_epochs, max_train_examples
    finetune_learning_rate: float = 3e-4  # ELECTRA paper, Table 7: small models
    # Checkpoints the learning probe reads (fractions of each run's steps; step 0 is added).
    probe_fractions: tuple = (0.5, 1.0)
    probe_task: str = "bbc_news"
    # Fast-ELECTRA's T0 (the paper's curriculum starts above 1 and falls to 1).
    fast_electra_temperature_start: float = 2.0


# About 80-90 minutes on the 2-core CPU (TensorFlow running one op at a time, the trainer's CPU
# default). Precision "auto": bf16 on a CPU with AMX or AVX512_BF16, float32 elsewhere (docs/
# experiments.md's results were measured in bf16). Measured for this size (bf16, batch 32, seq 128) on a quiet machine: ELECTRA ~95-105
# sequences/s (~3 steps/s), MLM ~105; pretraining ~1 s per ELECTRA step of budget over the three
# objectives (~50 min), fine-tuning ~20 min (4 models x 2 tasks x 3 seeds, plus 3 objectives x 2
# checkpoints x 2 seeds on BBC News).
FULL = Settings(
    name="full",
    model={"hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 2,
           "intermediate_size": 512},
    embedding_size=128, max_seq_length=128, train_batch_size=32, electra_steps=3000,
    checkpoint_fractions=(1 / 3, 2 / 3, 1.0), learning_rate=5e-4, warmup_fraction=0.1,
    mixed_precision="auto", seeds=3, curve_seeds=2, curve_tasks=("bbc_news",),
    finetune={"bbc_news": {"max_seq_length": 128, "num_train_epochs": 3.0, "max_train_examples": None},
              "pang_lee": {"max_seq_length": 64, "num_train_epochs": 10.0, "max_train_examples": None}},
    probe_fractions=(0.2, 0.4, 0.6, 0.8, 1.0),
)
QUICK = Settings(
    name="quick",
    model={"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 1, "intermediate_size": 128},
    embedding_size=32, max_seq_length=32, train_batch_size=8, electra_steps=40,
    checkpoint_fractions=(0.5, 1.0), learning_rate=5e-4, warmup_fraction=0.1,
    mixed_precision="float32", seeds=2, curve_seeds=1, curve_tasks=("bbc_news",),
    finetune={"bbc_news": {"max_seq_length": 32, "num_train_epochs": 1.0, "max_train_examples": 256},
              "pang_lee": {"max_seq_length": 32, "num_train_epochs": 3.0, "max_train_examples": None}},
)


# ------------------------------------------------------------------------------------------------
# FLOPs
# ------------------------------------------------------------------------------------------------
def encoder_forward_flops(cfg, seq: int) -> float:
    """Forward FLOPs of one encoder on one sequence: 2 per multiply-add of every matmul
    (projection, Q/K/V/output, FFN, and the two attention products); lookups are not FLOPs."""
    h, i, layers, e = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.embedding_size
    project = 2 * seq * e * h if e != h else 0
    per_layer = 2 * seq * (4 * h * h + 2 * h * i) + 2 * 2 * seq * seq * h
    return float(project + layers * per_layer)


def mlm_head_forward_flops(hidden: int, embedding: int, vocab: int, predictions: int) -> float:
    """dense(hidden -> E) then the tied E x V output projection, at the masked positions only."""
    return float(2 * predictions * (hidden * embedding + embedding * vocab))


def disc_head_forward_flops(hidden: int, seq: int) -> float:
    return float(2 * seq * (hidden * hidden + hidden))


def flops_per_sequence(kind: str, disc, gen, seq: int, predictions: int, vocab: int) -> float:
    """Training FLOPs per sequence (backward = 2 x forward, so a trained part costs 3 x forward).

    The objective variants of issue 34 leave this count as it is: `embedding_sharing` "gdes" adds
    elementwise additions of the deltas to the embedding tables, `decoupled_optimizers` a
    second learning rate and clip and the temperature curriculum a division of the logits, no
    matmul. A frozen generator (`two_stage_generator_dir`, `frozen_generator_dir`) runs its
    forward pass only: no backward pass, no optimizer update.

    kind: "electra" (generator and discriminator trained), "mlm" (one model, MLM head),
    "two_stage_2" and "fast_electra" (frozen generator: forward only; discriminator trained;
    the two differ in the generator they are given: the discriminator's size, or the
    official generator's).
    """
    disc_part = encoder_forward_flops(disc, seq) + disc_head_forward_flops(disc.hidden_size, seq)
    if kind == "mlm":
        return 3 * (encoder_forward_flops(disc, seq)
                    + mlm_head_forward_flops(disc.hidden_size, disc.embedding_size, vocab, predictions))
    gen_part = encoder_forward_flops(gen, seq) + mlm_head_forward_flops(
        gen.hidden_size, gen.embedding_size, vocab, predictions)
    if kind == "electra":
        return 3 * gen_part + 3 * disc_part
    if kind in ("two_stage_2", "fast_electra"):
        return gen_part + 3 * disc_part
    raise ValueError(kind)


# ------------------------------------------------------------------------------------------------
# Pretraining
# ------------------------------------------------------------------------------------------------
def pretraining_hparams(settings: Settings, steps: int, **extra) -> dict:
    hparams = {
        "model_size": "small", "model_hparam_overrides": dict(settings.model),
        "embedding_size": settings.embedding_size, "max_seq_length": settings.max_seq_length,
        "train_batch_size": settings.train_batch_size, "learning_rate": settings.learning_rate,
        "num_train_steps": steps, "num_warmup_steps": max(1, int(settings.warmup_fraction * steps)),
        "mixed_precision": settings.mixed_precision, "keep_checkpoint_max": 0,
        "iterations_per_loop": min(50, steps), "save_checkpoints_steps": 10 ** 9,
        "do_eval": False, "do_export": False, "strategy": "one_device",
    }
    hparams.update(extra)
    return hparams


def checkpoint_steps(settings: Settings, steps: int) -> List[int]:
    return sorted({max(1, int(round(f * steps))) for f in settings.checkpoint_fractions})


def pretrain(data_dir: str, name: str, hparams: dict, stops: List[int]) -> dict:
    """Trains run `name` to each step in `stops` (a checkpoint at each), resuming if possible."""
    from electra_tf.config import PretrainingConfig
    from electra_tf.training.tf.trainer import Trainer

    config = PretrainingConfig.create(name, data_dir, hparams)
    trainer = Trainer(config)
    start, seconds, scalars = trainer.step, 0.0, {}
    for stop in stops:
        if trainer.step >= stop:
            continue
        t0 = time.time()
        scalars = trainer.train(stop_at_step=stop)
        seconds += time.time() - t0
        logger.info("%s: step %d (%.0f s so far in this session)", name, trainer.step, seconds)
    checkpoints = {step: os.path.join(config.model_dir, f"ckpt-{step}") for step in stops}
    missing = [p for p in checkpoints.values() if not os.path.exists(p + ".index")]
    if missing:
        raise RuntimeError(f"{name}: expected checkpoint {missing[0]} was not written")
    info_path = os.path.join(config.model_dir, "experiment_run.json")
    info = {}
    if os.path.exists(info_path):
        with open(info_path) as f:
            info = json.load(f)
    if trainer.step > start:
        info = {"seconds": info.get("seconds", 0.0) + seconds, "last_scalars": scalars,
                "examples_per_second": scalars.get("examples_per_second")}
        with open(info_path, "w") as f:
            json.dump(info, f, indent=1)
    return {"model_dir": config.model_dir, "checkpoints": checkpoints, **info}


# ------------------------------------------------------------------------------------------------
# Fine-tuning
# ------------------------------------------------------------------------------------------------
def subsample_tasks(raw_dir: str, out_dir: str, settings: Settings) -> str:
    """Copies the task TSVs, keeping at most max_train_examples training rows (quick mode)."""
    for task in TASKS:
        limit = settings.finetune[task]["max_train_examples"]
        target = os.path.join(out_dir, task)
        os.makedirs(target, exist_ok=True)
        for split in ("train", "dev", "test"):
            with open(os.path.join(raw_dir, task, f"{split}.tsv"), encoding="utf-8") as f:
                lines = f.readlines()
            if split == "train" and limit:
                lines = lines[:1 + limit]
            with open(os.path.join(target, f"{split}.tsv"), "w", encoding="utf-8") as f:
                f.writelines(lines)
    return out_dir


def finetune(work_dir: str, raw_dir: str, settings: Settings, label: str, task: str, seeds: int,
             init_checkpoint: Optional[str]) -> dict:
    """Fine-tunes one starting point on one task with `seeds` trials; returns the summary."""
    from electra_tf.finetuning import runner
    from electra_tf.finetuning.config import FinetuningConfig

    out = os.path.join(work_dir, "finetuning", f"{label}__{task}")
    results_json = os.path.join(out, "results.json")
    if os.path.exists(results_json):
        with open(results_json) as f:
            cached = json.load(f)
        # The runner rewrites results.json after every trial: reuse only a finished run (one
        # with more trials than asked is finished too: its summary covers all its trials).
        if len(cached.get("trials", [])) >= seeds:
            return cached
    task_settings = settings.finetune[task]
    hparams = {
        "task_names": [task], "raw_data_dir": raw_dir, "num_trials": seeds, "seed": 0,
        "learning_rate": settings.finetune_learning_rate,
        "max_seq_length": task_settings["max_seq_length"],
        "num_train_epochs": task_settings["num_train_epochs"], "do_export": False,
        "results_json": results_json, "results_txt": os.path.join(out, "results.txt"),
        "model_dir": os.path.join(out, "models"), "log_steps": 10 ** 6,
    }
    if init_checkpoint is None:
        vocab_file = os.path.join(work_dir, "data", "vocab.txt")
        with open(vocab_file, encoding="utf-8") as f:
            vocab_size = sum(1 for _ in f)
        hparams.update({"random_init": True, "model_hparam_overrides": dict(settings.model),
                        "embedding_size": settings.embedding_size, "vocab_size": vocab_size,
                        "vocab_file": vocab_file})
    else:
        hparams["init_checkpoint"] = init_checkpoint
    config = FinetuningConfig.create("experiment", work_dir, hparams)
    t0 = time.time()
    results = runner.run(config, overwrite=True)
    logger.info("fine-tuned %s on %s in %.0f s: %s", label, task, time.time() - t0,
                {s: round(v["accuracy"]["mean"], 4) for s, v in results["summary"][task].items()})
    return results


# ------------------------------------------------------------------------------------------------
# TensorBoard events and plots
# ------------------------------------------------------------------------------------------------
CURVE_TAGS = ("total_loss", "masked_lm_loss", "disc_loss", "disc_accuracy", "disc_auc")
COLORS = {"electra": "tab:blue", "mlm": "tab:orange", "two_stage": "tab:green", "gdes": "tab:red",
          "decoupled": "tab:purple", "gdes_decoupled": "tab:brown", "fast_electra": "tab:cyan"}


def read_scalars(model_dir: str, tags=CURVE_TAGS) -> Dict[str, List[List[float]]]:
    """{tag: [[step, value], ...]} from the training events in `model_dir` (not eval/)."""
    import tensorflow as tf

    out: Dict[str, Dict[int, float]] = {}
    for path in sorted(glob.glob(os.path.join(model_dir, "events.out.tfevents.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.tag in tags:
                    number = (float(tf.make_ndarray(value.tensor)) if value.HasField("tensor")
                              else float(value.simple_value))
                    out.setdefault(value.tag, {})[int(event.step)] = number
    return {tag: [[s, v] for s, v in sorted(series.items())] for tag, series in out.items()}


def _pyplot(path: str):
    """matplotlib.pyplot on the Agg backend, or None (a warning naming `path`) without it."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.warning("matplotlib is not installed: %s not written", path)
        return None
    return plt


def _save(plt, fig, path: str) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_pretraining_curves(curves: dict, path: str) -> Optional[str]:
    plt = _pyplot(path)
    if plt is None:
        return None
    fig, axes = plt.subplots(2, 3, figsize=(15, 7))
    titles = {"total_loss": "total loss (MLM + 50 x disc)", "masked_lm_loss": "MLM loss",
              "disc_loss": "discriminator loss", "disc_accuracy": "discriminator accuracy",
              "disc_auc": "discriminator AUC (training batches)"}
    axes.flat[-1].axis("off")
    for ax, tag in zip(axes.flat, CURVE_TAGS):
        for run, series in curves.items():
            if run == "mlm" and tag.startswith("disc"):
                continue  # no discriminator: its disc_loss is a constant 0
            if series.get(tag):
                steps, values = zip(*series[tag])
                ax.plot(steps, values, label=run, color=COLORS.get(run))
        ax.set_title(titles[tag])
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return _save(plt, fig, path)


def plot_downstream(points: List[dict], floors: Dict[str, dict], path: str) -> Optional[str]:
    if not points:
        return None  # no fine-tuned checkpoint of a curve task (--tasks, --curve-seeds 0)
    plt = _pyplot(path)
    if plt is None:
        return None
    tasks = sorted({p["task"] for p in points})
    fig, axes = plt.subplots(1, len(tasks), figsize=(6 * len(tasks), 4.2), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for objective in ALL_OBJECTIVES:
            rows = sorted((p for p in points if p["task"] == task and p["objective"] == objective),
                          key=lambda p: p["flops"])
            if rows:
                # Fine-tuning metrics are in percent (official units).
                ax.errorbar([r["flops"] / 1e12 for r in rows], [r["mean"] for r in rows],
                            yerr=[r["std"] for r in rows], marker="o", capsize=3,
                            label=objective, color=COLORS.get(objective))
        if task in floors:
            ax.axhline(floors[task]["mean"], color="grey", ls="--", label="random init")
        ax.set_title(f"{task}: dev accuracy vs pretraining compute")
        ax.set_xlabel("pretraining TFLOPs")
        ax.set_ylabel("dev accuracy (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return _save(plt, fig, path)


def plot_probe(probes: Dict[str, List[dict]], path: str) -> Optional[str]:
    """The learning probe's dev accuracy against pretraining FLOPs, one line per objective."""
    plt = _pyplot(path)
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for objective, rows in probes.items():
        if rows:
            ax.plot([r["flops"] / 1e12 for r in rows], [100 * r["dev_accuracy"] for r in rows],
                    marker="o", label=objective, color=COLORS.get(objective))
    ax.set_title("learning probe: linear classifier on frozen features, dev accuracy")
    ax.set_xlabel("pretraining TFLOPs")
    ax.set_ylabel("dev accuracy (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(plt, fig, path)


# ------------------------------------------------------------------------------------------------
# The experiment
# ------------------------------------------------------------------------------------------------
def prepare_data(work_dir: str, settings: Settings) -> Dict[str, str]:
    from electra_tf.data.build import build_config, builder
    from electra_tf.sources import labelled
    from electra_tf.sources.fetch import default_data_ready, fetch_default_data

    default_dir = os.path.join(REPO_ROOT, "pretrain_data")
    if not default_data_ready(default_dir):
        fetch_default_data(default_dir)
    data_dir = os.path.join(work_dir, "data")
    os.makedirs(data_dir, exist_ok=True)
    vocab = os.path.join(data_dir, "vocab.txt")
    if not os.path.exists(vocab):
        shutil.copyfile(os.path.join(default_dir, "vocab.txt"), vocab)
    records = os.path.join(data_dir, "pretrain_tfrecords")
    if not os.path.exists(os.path.join(records, "manifest.json")):
        builder.build_dataset(build_config.BuildConfig(
            corpus_dir=os.path.join(default_dir, "corpus"), vocab_file=vocab, output_dir=records,
            max_seq_length=settings.max_seq_length, command="experiments/electra_vs_mlm.py"))
    labelled.fetch_labelled_data(work_dir, TASKS)
    raw = os.path.join(work_dir, labelled.FINETUNING_DATA_DIR)
    if any(settings.finetune[t]["max_train_examples"] for t in TASKS):
        raw = subsample_tasks(raw, os.path.join(work_dir, "finetuning_data_subsampled"), settings)
    return {"data_dir": data_dir, "raw_dir": raw}


def budget(settings: Settings) -> dict:
    """Steps per objective for equal pretraining FLOPs.

    The two-stage objectives (`two_stage`, `fast_electra`) give both stages the same number of
    steps: the generator's pretraining is charged in full to the run that uses it.
    """
    from electra_tf.config import PretrainingConfig
    from electra_tf.config.model_config import get_bert_config, get_generator_config

    config = PretrainingConfig.create("flops", "unused", pretraining_hparams(settings, 1))
    disc = get_bert_config(config)
    gen = get_generator_config(config, disc)
    # two_stage: the generator has the discriminator's size. The official generator sizing
    # derives heads (hidden // 64) and FFN (4 * hidden), so the model must follow those rules.
    full_gen = get_generator_config(PretrainingConfig.create("flops", "unused", pretraining_hparams(
        settings, 1, untied_generator_embeddings=True, generator_hidden_size=1.0,
        generator_layers=1.0)), disc)
    if full_gen != disc:
        raise ValueError(f"two_stage needs a generator equal to the discriminator; the official "
                         f"sizing gives {full_gen} for {disc}: use num_attention_heads = "
                         "max(1, hidden_size // 64), intermediate_size = 4 * hidden_size and "
                         "embedding_size = hidden_size")
    seq, n_pred = settings.max_seq_length, config.max_predictions_per_seq
    per_seq = {
        "electra": flops_per_sequence("electra", disc, gen, seq, n_pred, VOCAB_SIZE),
        "mlm": flops_per_sequence("mlm", disc, None, seq, n_pred, VOCAB_SIZE),
        "two_stage_1": flops_per_sequence("mlm", disc, None, seq, n_pred, VOCAB_SIZE),
        "two_stage_2": flops_per_sequence("two_stage_2", disc, full_gen, seq, n_pred, VOCAB_SIZE),
        # Fast-ELECTRA: stage 1 trains the official-size generator alone (an MLM-only run of its
        # sizes, `fast_electra_stage1_hparams`), stage 2 the discriminator beside it, frozen.
        "fast_electra_1": flops_per_sequence("mlm", gen, None, seq, n_pred, VOCAB_SIZE),
        "fast_electra_2": flops_per_sequence("fast_electra", disc, gen, seq, n_pred, VOCAB_SIZE),
    }
    per_step = {k: v * settings.train_batch_size for k, v in per_seq.items()}
    total = settings.electra_steps * per_step["electra"]
    n = int(round(total / (per_step["two_stage_1"] + per_step["two_stage_2"])))
    fast = int(round(total / (per_step["fast_electra_1"] + per_step["fast_electra_2"])))
    return {
        "flops_per_step": per_step, "budget_flops": total,
        "steps": {"electra": settings.electra_steps, "mlm": int(round(total / per_step["mlm"])),
                  "two_stage_1": n, "two_stage_2": n,
                  "fast_electra_1": fast, "fast_electra_2": fast},
        "discriminator": disc.to_dict(), "generator": gen.to_dict(),
        "max_predictions_per_seq": n_pred,
    }


def fast_electra_stage1_hparams(settings: Settings, steps: int) -> dict:
    """Fast-ELECTRA's stage 1: an MLM-only run whose encoder has the sizes of the ELECTRA run's
    generator (heads and FFN derived as the official generator's), so stage 2 can take it as its
    `frozen_generator_dir` with the default generator fractions."""
    from electra_tf.config import PretrainingConfig
    from electra_tf.config.model_config import get_bert_config, get_generator_config

    config = PretrainingConfig.create("flops", "unused", pretraining_hparams(settings, 1))
    gen = get_generator_config(config, get_bert_config(config))
    sizes = {"hidden_size": gen.hidden_size, "num_hidden_layers": gen.num_hidden_layers,
             "num_attention_heads": gen.num_attention_heads,
             "intermediate_size": gen.intermediate_size}
    return pretraining_hparams(settings, steps, electra_objective=False,
                               model_hparam_overrides=sizes)


def probe_steps(settings: Settings, steps: int) -> List[int]:
    """The checkpoints the learning probe reads: step 0 and `probe_fractions` of `steps`."""
    return sorted({0} | {max(1, int(round(f * steps))) for f in settings.probe_fractions})


def kept_steps(settings: Settings, steps: int) -> List[int]:
    """The checkpoints a run keeps: the fine-tuned ones and the ones the probe reads."""
    return sorted((set(checkpoint_steps(settings, steps)) | set(probe_steps(settings, steps))) - {0})


def plan_steps(plan: dict, objective: str) -> tuple:
    """(stage-1 steps, stage-1 FLOPs per step, steps, FLOPs per step) of `objective`; the
    variants without a stage 1 cost what an ELECTRA step costs (`flops_per_sequence`)."""
    steps, per_step = plan["steps"], plan["flops_per_step"]
    if objective in TWO_STAGE:
        return (steps[f"{objective}_1"], per_step[f"{objective}_1"], steps[f"{objective}_2"],
                per_step[f"{objective}_2"])
    key = "electra" if objective in VARIANT_HPARAMS else objective
    return 0, 0.0, steps[key], per_step[key]


def pretrain_objective(settings: Settings, data_dir: str, plan: dict, objective: str,
                       runs: dict) -> None:
    """Pretrains `objective` (and its stage 1) into `runs`, resuming what exists."""
    stage1_steps, _, steps, _ = plan_steps(plan, objective)
    if objective == "mlm":
        hparams = pretraining_hparams(settings, steps, electra_objective=False)
    elif objective == "two_stage":
        runs["two_stage_1"] = pretrain(data_dir, "two_stage_1", pretraining_hparams(
            settings, stage1_steps, electra_objective=False), [stage1_steps])
        hparams = pretraining_hparams(
            settings, steps, untied_generator_embeddings=True, generator_hidden_size=1.0,
            generator_layers=1.0, gen_weight=0.0,
            two_stage_generator_dir=runs["two_stage_1"]["model_dir"])
    elif objective == "fast_electra":
        runs["fast_electra_1"] = pretrain(data_dir, "fast_electra_1", fast_electra_stage1_hparams(
            settings, stage1_steps), [stage1_steps])
        hparams = pretraining_hparams(
            settings, steps, gen_weight=0.0,
            frozen_generator_dir=runs["fast_electra_1"]["model_dir"],
            temperature_start=settings.fast_electra_temperature_start)
    else:
        hparams = pretraining_hparams(settings, steps, **VARIANT_HPARAMS.get(objective, {}))
    runs[objective] = pretrain(data_dir, objective, hparams, kept_steps(settings, steps))


def probe_curve(settings: Settings, run: dict, raw_dir: str, cache_path: str) -> List[dict]:
    """The learning probe on each kept checkpoint of `run` (and step 0): [{step, dev_accuracy,
    train_accuracy, seconds}], cached in `cache_path` (a rerun probes only what is new)."""
    from electra_tf.config import probe_settings
    from electra_tf.finetuning import probe
    from electra_tf.training import run_dir

    cached = {}
    if os.path.exists(cache_path):
        with open(cache_path, encoding="utf-8") as f:
            cached = {row["step"]: row for row in json.load(f)}
    model_dir = run["model_dir"]
    steps = probe_steps(settings, max(run["checkpoints"]))
    todo = [s for s in steps if s not in cached
            and os.path.exists(os.path.join(model_dir, f"ckpt-{s}.index"))]
    if todo:
        config = probe_settings.parse({"task_dir": os.path.join(raw_dir, settings.probe_task)})
        data = None
        for step in todo:
            loaded = run_dir.load_run(model_dir, checkpoint=os.path.join(model_dir, f"ckpt-{step}"))
            data = data or probe.encode_task(config, loaded.config, loaded.vocab)
            scalars = probe.Probe(config, data).run(step, loaded.model.discriminator)
            cached[step] = {"step": step, **{k.split("/", 1)[1]: v for k, v in scalars.items()}}
        with open(cache_path, "w", encoding="utf-8") as f:
            json.dump([cached[s] for s in sorted(cached)], f, indent=1)
    return [cached[s] for s in sorted(cached) if s in steps]


def run_experiment(settings: Settings, work_dir: str, output_dir: str,
                   objectives=OBJECTIVES, tasks=TASKS, paths: Optional[dict] = None) -> dict:
    start = time.time()
    paths = paths or prepare_data(work_dir, settings)
    data_dir, raw_dir = paths["data_dir"], paths["raw_dir"]
    own_vocab = os.path.join(work_dir, "data", "vocab.txt")  # random init's (`finetune`)
    if not os.path.exists(own_vocab):
        os.makedirs(os.path.dirname(own_vocab), exist_ok=True)
        shutil.copyfile(os.path.join(data_dir, "vocab.txt"), own_vocab)
    plan = budget(settings)
    logger.info("budget %.3g FLOPs; steps %s", plan["budget_flops"], plan["steps"])
    runs: Dict[str, dict] = {}
    for objective in objectives:
        pretrain_objective(settings, data_dir, plan, objective, runs)
    pretrain_seconds = time.time() - start

    def flops_at(objective: str, step: int) -> float:
        stage1_steps, stage1_per_step, _, per_step = plan_steps(plan, objective)
        return stage1_steps * stage1_per_step + step * per_step

    finals = {obj: runs[obj]["checkpoints"][max(runs[obj]["checkpoints"])] for obj in objectives}
    finetuning: Dict[str, Dict[str, dict]] = {}
    for label, init in list(finals.items()) + [("random", None)]:
        for task in tasks:
            result = finetune(work_dir, raw_dir, settings, label, task, settings.seeds, init)
            finetuning.setdefault(label, {})[task] = dict(result["summary"][task],
                                                          trials=len(result["trials"]))
    points = []
    for objective in objectives:
        fine_tuned = set(checkpoint_steps(settings, max(runs[objective]["checkpoints"])))
        for step, checkpoint in sorted(runs[objective]["checkpoints"].items()):
            for task in settings.curve_tasks:
                if step not in fine_tuned or task not in tasks:
                    continue
                if checkpoint == finals[objective]:
                    stat = finetuning[objective][task]["dev"]["accuracy"]
                elif settings.curve_seeds:
                    result = finetune(work_dir, raw_dir, settings, f"{objective}_step{step}", task,
                                      settings.curve_seeds, checkpoint)
                    stat = result["summary"][task]["dev"]["accuracy"]
                else:
                    continue
                points.append({"objective": objective, "step": step, "flops": flops_at(objective, step),
                               "task": task, "mean": stat["mean"], "std": stat["std"]})
    probes = {}
    for objective in objectives:
        rows = probe_curve(settings, runs[objective], raw_dir,
                           os.path.join(work_dir, f"probe_{objective}.json"))
        probes[objective] = [dict(row, flops=flops_at(objective, row["step"])) for row in rows]
    curves = {name: read_scalars(runs[name]["model_dir"]) for name in objectives}
    os.makedirs(output_dir, exist_ok=True)
    floors = {t: finetuning["random"][t]["dev"]["accuracy"] for t in settings.curve_tasks if t in tasks}
    images = {
        "downstream": plot_downstream(points, floors, os.path.join(output_dir, "downstream_vs_flops.png")),
        "probe": plot_probe(probes, os.path.join(output_dir, "probe_vs_flops.png")),
        "pretraining": plot_pretraining_curves(curves, os.path.join(output_dir, "pretraining_curves.png")),
    }
    results = {
        "settings": dataclasses.asdict(settings), "plan": plan, "objectives": list(objectives),
        "pretraining": {name: {k: v for k, v in run.items() if k != "checkpoints"} | {
            "checkpoints": {str(s): p for s, p in run["checkpoints"].items()}} for name, run in runs.items()},
        "finetuning": finetuning, "curve_points": points, "probe": probes, "reference_curves": curves,
        "images": images, "seconds": {"pretraining_this_session": pretrain_seconds,
                                      "total_this_session": time.time() - start},
    }
    with open(os.path.join(output_dir, "results.json"), "w") as f:
        json.dump(results, f, indent=1, sort_keys=True)
    with open(os.path.join(output_dir, "summary.md"), "w") as f:
        f.write(summary_markdown(results))
    return results


def _plan_key(name: str) -> str:
    """The plan's step / FLOPs key of a pretraining run."""
    if name in TWO_STAGE:
        return f"{name}_2"
    return "electra" if name in VARIANT_HPARAMS else name


def summary_markdown(results: dict) -> str:
    """The tables docs/experiments.md shows."""
    plan = results["plan"]
    lines = ["## Pretraining (equal FLOPs)", "",
             "| run | steps | FLOPs/step | total FLOPs | wall time (s) | ex/s |", "|---|---|---|---|---|---|"]
    order = [n for o in results.get("objectives", OBJECTIVES)
             for n in ((f"{o}_1", o) if o in TWO_STAGE else (o,))]
    for name in order:
        key = _plan_key(name)
        run = results["pretraining"][name]
        steps, per_step = plan["steps"][key], plan["flops_per_step"][key]
        seconds, rate = run.get("seconds"), run.get("examples_per_second")
        timing = (f"{seconds:.0f} | {rate:.1f}" if seconds is not None and rate is not None
                  else "- | -")
        lines.append(f"| {name} | {steps} | {per_step:.3g} | {steps * per_step:.3g} | {timing} |")
    lines += ["", "## Fine-tuning (mean ± sample std over seeds, %)", "",
              "| model | task | seeds | dev accuracy | test accuracy | dev macro F1 | test macro F1 | dev MCC | test MCC |",
              "|---|---|---|---|---|---|---|---|---|"]
    for model, tasks in results["finetuning"].items():
        for task, splits in tasks.items():
            def cell(split, metric):
                stat = splits.get(split, {}).get(metric)
                return f"{stat['mean']:.1f} ± {stat['std']:.1f}" if stat else "-"
            lines.append(f"| {model} | {task} | {splits.get('trials', '-')} | {cell('dev', 'accuracy')} | "
                         f"{cell('test', 'accuracy')} | {cell('dev', 'macro_f1')} | {cell('test', 'macro_f1')} | "
                         f"{cell('dev', 'mcc')} | {cell('test', 'mcc')} |")
    if results.get("curve_points"):
        lines += ["", "## Downstream dev accuracy vs pretraining FLOPs", "",
                  "| objective | step | FLOPs | task | dev accuracy |", "|---|---|---|---|---|"]
        for p in results["curve_points"]:
            lines.append(f"| {p['objective']} | {p['step']} | {p['flops']:.3g} | {p['task']} | "
                         f"{p['mean']:.1f} ± {p['std']:.1f} |")
    if results.get("probe"):
        lines += ["", "## Learning probe (dev accuracy %, linear classifier on frozen features)", "",
                  "| objective | step | FLOPs | dev accuracy | train accuracy |", "|---|---|---|---|---|"]
        for objective, rows in results["probe"].items():
            for row in rows:
                lines.append(f"| {objective} | {row['step']} | {row['flops']:.3g} | "
                             f"{100 * row['dev_accuracy']:.1f} | {100 * row['train_accuracy']:.1f} |")
    return "\n".join(lines) + "\n"


def _names(choices: tuple):
    """An argparse type: a comma-separated list of names out of `choices`, in their order."""
    def parse(text: str) -> tuple:
        names = [n.strip() for n in text.split(",") if n.strip()]
        unknown = [n for n in names if n not in choices]
        if unknown or not names:
            raise argparse.ArgumentTypeError(f"unknown name(s) {', '.join(unknown) or '(none)'}; "
                                             f"choose from {', '.join(choices)}")
        return tuple(n for n in choices if n in names)
    return parse


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny settings: end to end in minutes")
    parser.add_argument("--work-dir", default=None, help="data, models and fine-tuning runs (default: "
                        "pretrain_data/experiments/electra_vs_mlm[_quick], git-ignored)")
    parser.add_argument("--output-dir", default=None, help="results.json, summary.md, PNGs (default: "
                        "docs/experiments/electra_vs_mlm, or the work dir with --quick)")
    parser.add_argument("--electra-steps", type=int, default=None,
                        help="ELECTRA steps, which set the FLOPs budget of every objective")
    parser.add_argument("--seeds", type=int, default=None, help="fine-tuning seeds per final model")
    parser.add_argument("--objectives", type=_names(ALL_OBJECTIVES), default=OBJECTIVES,
                        help="comma-separated runs, each at the same FLOPs budget (default "
                        f"{','.join(OBJECTIVES)}; also: {', '.join(ALL_OBJECTIVES[len(OBJECTIVES):])}: "
                        "issue 34's variants, see above)")
    parser.add_argument("--tasks", type=_names(TASKS), default=TASKS,
                        help=f"comma-separated fine-tuning tasks (default {','.join(TASKS)})")
    parser.add_argument("--curve-seeds", type=int, default=None,
                        help="fine-tuning seeds per intermediate checkpoint (0: none; the learning "
                        "probe still reads every kept checkpoint)")
    parser.add_argument("--data-dir", default=None,
                        help="pretraining data dir (vocab.txt, pretrain_tfrecords/) to use instead "
                        "of building one in the work dir; needs --raw-dir")
    parser.add_argument("--raw-dir", default=None,
                        help="fine-tuning task dirs (<task>/{train,dev,test}.tsv) instead of "
                        "fetching them; needs --data-dir")
    parser.add_argument("--overwrite", action="store_true", help="delete the work dir first")
    args = parser.parse_args(argv)
    if (args.data_dir is None) != (args.raw_dir is None):
        parser.error("--data-dir and --raw-dir go together")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("electra_tf").setLevel(logging.INFO)
    settings = QUICK if args.quick else FULL
    overrides = {}
    if args.electra_steps:
        overrides["electra_steps"] = args.electra_steps
    if args.seeds:
        overrides["seeds"] = args.seeds
    if args.curve_seeds is not None:
        overrides["curve_seeds"] = args.curve_seeds
    settings = dataclasses.replace(settings, **overrides)
    suffix = "_quick" if args.quick else ""
    work_dir = args.work_dir or os.path.join(REPO_ROOT, "pretrain_data", "experiments", f"electra_vs_mlm{suffix}")
    output_dir = args.output_dir or (os.path.join(work_dir, "output") if args.quick else
                                     os.path.join(REPO_ROOT, "docs", "experiments", "electra_vs_mlm"))
    marker = os.path.join(work_dir, WORK_MARKER)
    identity = json.loads(json.dumps(dataclasses.asdict(settings) | {"settings": settings.name}))
    if args.overwrite and os.path.isdir(work_dir):
        if not os.path.exists(marker):
            print(f"electra_vs_mlm.py: error: refusing to delete {work_dir}: not a work dir of this "
                  "script", file=sys.stderr)
            return 2
        shutil.rmtree(work_dir)
    if os.path.exists(marker):
        with open(marker) as f:
            previous = json.load(f)
        if previous != identity:
            print(f"electra_vs_mlm.py: error: {work_dir} holds a run with other settings; use "
                  "--overwrite or another --work-dir", file=sys.stderr)
            return 2
    os.makedirs(work_dir, exist_ok=True)
    with open(marker, "w") as f:
        json.dump(identity, f, indent=1)
    paths = {"data_dir": args.data_dir, "raw_dir": args.raw_dir} if args.data_dir else None
    results = run_experiment(settings, work_dir, output_dir, args.objectives, args.tasks, paths)
    print(summary_markdown(results))
    print(f"outputs: {output_dir}  (total {results['seconds']['total_this_session']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
