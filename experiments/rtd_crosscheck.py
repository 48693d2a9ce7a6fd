"""Is electra-tf's ELECTRA learning curve the objective's, or a bug? An independent cross-check.

Trains Hugging Face transformers' PyTorch ELECTRA (`benchmarks/torch_electra.py`: the same
objective wired on HF's model code) with the experiment's sizes, data, batch, learning-rate
schedule and precision, and compares its discriminator loss, discriminator AUC and generator MLM
accuracy, step by step, with the `electra` run of `experiments/electra_vs_mlm.py`. If the two
implementations learn alike, electra-tf's curve is what the objective does at this scale.

    python experiments/electra_vs_mlm.py                 # first: the experiment's electra run
    python experiments/electra_vs_mlm.py --help
    python experiments/rtd_crosscheck.py --steps 1000    # ~6 min on 2 cores

Needs torch and transformers (requirements-test.txt). Writes a JSON (--output) and prints a
table of both curves.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

logger = logging.getLogger("electra_tf.experiment")

TAGS = ("disc_loss", "disc_auc", "masked_lm_accuracy", "masked_lm_loss")


def auc(probs, labels) -> float:
    """Area under the ROC curve by ranks (ties averaged); nan without both classes."""
    import numpy as np

    positives = labels > 0.5
    n_pos, n_neg = int(positives.sum()), int((~positives).sum())
    if not n_pos or not n_neg:
        return float("nan")
    values, inverse, counts = np.unique(probs, return_inverse=True, return_counts=True)
    upper = np.cumsum(counts)
    ranks = (upper - (counts - 1) / 2.0)[inverse]  # 1-based ranks, ties averaged
    return float((ranks[positives].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def _trained_precision(config) -> str:
    """The policy electra-tf's run trained in (recorded in its config.json), for the peer to
    repeat; before that run exists, what "auto" gives on this machine."""
    from electra_tf import precision
    from electra_tf.config import PretrainingConfig

    path = os.path.join(config.model_dir, "config.json")
    if os.path.exists(path):
        return PretrainingConfig.load(path).resolved_mixed_precision or config.mixed_precision
    return precision.choose(config.mixed_precision).policy


def run(work_dir: str, steps: int, every: int, seed: int) -> dict:
    import numpy as np
    import torch

    from benchmarks.torch_electra import TorchElectra
    from electra_tf.config import PretrainingConfig
    from electra_tf.data.records import pipeline
    from electra_tf.config.model_config import get_bert_config, get_generator_config
    from electra_tf.vocab import load_vocab
    from experiments import electra_vs_mlm as experiment

    settings = experiment.FULL
    data_dir = os.path.join(work_dir, "data")
    budget = experiment.budget(settings)["steps"]["electra"]
    config = PretrainingConfig.create("electra", data_dir,
                                      experiment.pretraining_hparams(settings, budget))
    disc = get_bert_config(config)
    gen = get_generator_config(config, disc)
    sizes = lambda c: {k: getattr(c, k) for k in (  # noqa: E731
        "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")}
    vocab = load_vocab(config.vocab_file)
    policy = _trained_precision(config)
    peer = TorchElectra(sizes(disc), sizes(gen), vocab_size=config.vocab_size,
                        embedding_size=disc.embedding_size, special=vocab.special._asdict(),
                        max_predictions=config.max_predictions_per_seq,
                        learning_rate=config.learning_rate,
                        num_warmup_steps=config.num_warmup_steps,
                        num_train_steps=config.num_train_steps,
                        dtype="bfloat16" if policy == "mixed_bfloat16" else "float32",
                        mask_prob=config.mask_prob, disc_weight=config.disc_weight, seed=seed)
    dataset = pipeline.make_dataset(config.pretrain_tfrecords, batch_size=config.train_batch_size,
                                    max_seq_length=config.max_seq_length, is_training=True,
                                    seed=seed)
    curve, window, start = [], [], time.time()
    for step, batch in zip(range(1, steps + 1), dataset):
        out = peer.step({k: torch.from_numpy(v.numpy().astype(np.int64)) for k, v in batch.items()})
        window.append(out)
        if step % every == 0:
            probs = torch.cat([o["disc_probs"] for o in window]).numpy()
            labels = torch.cat([o["disc_labels"] for o in window]).numpy()
            point = {"step": step, "disc_auc": auc(probs, labels)}
            for key, tag in (("disc_loss", "disc_loss"), ("mlm_accuracy", "masked_lm_accuracy"),
                             ("mlm_loss", "masked_lm_loss")):
                point[tag] = float(np.mean([float(o[key]) for o in window]))
            curve.append(point)
            window = []
            logger.info("torch step %d: disc_loss %.4f disc_auc %.3f mlm_acc %.3f (%.0f s)", step,
                        point["disc_loss"], point["disc_auc"], point["masked_lm_accuracy"],
                        time.time() - start)
    ours = experiment.read_scalars(config.model_dir, TAGS)
    if not ours:
        raise SystemExit(f"no electra-tf curves in {config.model_dir}: run "
                         "experiments/electra_vs_mlm.py first")
    ours = {tag: dict((int(s), v) for s, v in series) for tag, series in ours.items()}
    return {"settings": {"model": sizes(disc), "generator": sizes(gen),
                         "batch": config.train_batch_size, "learning_rate": config.learning_rate,
                         "num_warmup_steps": config.num_warmup_steps,
                         "num_train_steps": config.num_train_steps,
                         "mixed_precision": policy, "seed": seed},
            "torch": curve,
            "electra_tf": [{"step": p["step"], **{t: ours.get(t, {}).get(p["step"]) for t in TAGS}}
                           for p in curve],
            "seconds": time.time() - start}


def table(result: dict) -> str:
    lines = ["| step | disc_loss tf / torch | disc_auc tf / torch | MLM acc tf / torch |",
             "|---:|---|---|---|"]

    def fmt(value, digits):
        return "—" if value is None else f"{value:.{digits}f}"

    for ours, theirs in zip(result["electra_tf"], result["torch"]):
        lines.append(f"| {theirs['step']} | {fmt(ours['disc_loss'], 3)} / {fmt(theirs['disc_loss'], 3)} "
                     f"| {fmt(ours['disc_auc'], 3)} / {fmt(theirs['disc_auc'], 3)} "
                     f"| {fmt(ours['masked_lm_accuracy'], 3)} / "
                     f"{fmt(theirs['masked_lm_accuracy'], 3)} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work-dir", default=os.path.join(REPO_ROOT, "pretrain_data", "experiments",
                                                           "electra_vs_mlm"),
                        help="work dir of experiments/electra_vs_mlm.py (its data and electra run)")
    parser.add_argument("--steps", type=int, default=1000, help="PyTorch training steps")
    parser.add_argument("--every", type=int, default=50,
                        help="steps per curve point (electra-tf logs every 50)")
    parser.add_argument("--seed", type=int, default=0, help="PyTorch and data-order seed")
    parser.add_argument("--output", default=os.path.join(REPO_ROOT, "docs", "experiments",
                                                         "electra_vs_mlm", "rtd_crosscheck.json"),
                        help="JSON with both curves")
    args = parser.parse_args(argv)
    if args.steps < args.every or args.every < 1:
        parser.error("--steps must be >= --every >= 1")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    result = run(args.work_dir, args.steps, args.every, args.seed)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w") as f:
        json.dump(result, f, indent=1)
    print(table(result))
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
