"""Tiny pretraining datasets and configs for the trainer, export, pipeline and CLI tests.

Not a test module: it writes a 100-token vocab and a few small TFRecord shards (random ids, the
official three features) in the layout `build_pretraining_dataset.py` produces
(`DATA_DIR/vocab.txt`, `DATA_DIR/pretrain_tfrecords/{pretrain_data,eval_data}.tfrecord-i-of-n` and
`manifest.json` with the fields the trainer checks), so each test runs in seconds.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from typing import Dict, List, Optional

import numpy as np

from electra_tf.data.records import tfrecord_io
from electra_tf.vocab import REQUIRED_TOKENS, file_sha256

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB_SIZE = 100
MAX_SEQ_LENGTH = 32
EXAMPLES_PER_SHARD = 40
# A model small enough for a step in milliseconds (and a quick trace); generator 1/4 width (16)
# as the official ratio.
TINY_HPARAMS = {
    "vocab_size": VOCAB_SIZE,
    "max_seq_length": MAX_SEQ_LENGTH,
    "train_batch_size": 8,
    "eval_batch_size": 8,
    "num_eval_steps": 2,
    "num_warmup_steps": 2,
    "embedding_size": 32,
    "model_hparam_overrides": {"hidden_size": 64, "num_hidden_layers": 2},
    "do_export": False,
    # Pinned: "auto" (the default) would give bf16 on a CI machine with AMX or AVX512_BF16 and
    # float32 elsewhere; tests compare runs and references in float32 on every machine.
    "mixed_precision": "float32",
}
NO_DROPOUT = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}


def vocab_tokens(num_words: int = VOCAB_SIZE - len(REQUIRED_TOKENS), prefix: str = "w") -> List[str]:
    """[PAD] [UNK] [CLS] [SEP] [MASK] then `num_words` word tokens `w0 w1 ...`."""
    return list(REQUIRED_TOKENS) + [f"{prefix}{i}" for i in range(num_words)]


def write_vocab(path: str, tokens: Optional[List[str]] = None) -> str:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(tokens or vocab_tokens()) + "\n")
    return path


def random_examples(num: int, max_seq_length: int, rng: np.random.Generator,
                    vocab_size: int = VOCAB_SIZE) -> List[Dict[str, List[int]]]:
    """`num` examples `[CLS] a.. [SEP] b.. [SEP]` of random lengths, zero-padded."""
    examples = []
    for _ in range(num):
        n = int(rng.integers(8, max_seq_length + 1))
        first = int(rng.integers(2, n - 3))
        body = rng.integers(len(REQUIRED_TOKENS), vocab_size, n).tolist()
        ids = [2] + body[1:first] + [3] + body[first + 1:n - 1] + [3]
        segment = [0] * (first + 1) + [1] * (n - first - 1)
        pad = max_seq_length - n
        examples.append({"input_ids": ids + [0] * pad, "input_mask": [1] * n + [0] * pad,
                         "segment_ids": segment + [0] * pad})
    return examples


def write_records(path: str, examples) -> int:
    import tensorflow as tf

    with tf.io.TFRecordWriter(path) as writer:
        for example in examples:
            writer.write(tfrecord_io.make_tf_example(example).SerializeToString())
    return os.path.getsize(path)


def write_dataset(data_dir: str, *, num_train_shards: int = 2, num_eval_shards: int = 1,
                  examples_per_shard: int = EXAMPLES_PER_SHARD, max_seq_length: int = MAX_SEQ_LENGTH,
                  seed: int = 0, manifest: bool = True, vocab: Optional[List[str]] = None) -> str:
    """Writes DATA_DIR/vocab.txt and DATA_DIR/pretrain_tfrecords/ (+ manifest.json). Returns the
    tfrecords directory."""
    vocab_path = write_vocab(os.path.join(data_dir, "vocab.txt"), vocab)
    out = os.path.join(data_dir, "pretrain_tfrecords")
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(seed)
    splits = {}
    for split, prefix, count in (("train", tfrecord_io.TRAIN_PREFIX, num_train_shards),
                                 ("eval", tfrecord_io.EVAL_PREFIX, num_eval_shards)):
        shards = []
        for i in range(count):
            name = tfrecord_io.shard_name(prefix, i, count)
            size = write_records(os.path.join(out, name),
                                 random_examples(examples_per_shard, max_seq_length, rng))
            shards.append({"file": name, "examples": examples_per_shard, "bytes": size})
        splits[split] = {"examples": examples_per_shard * count, "shards": shards}
    if manifest:
        write_manifest(out, vocab_path, max_seq_length, splits)
    return out


def write_manifest(out_dir: str, vocab_path: str, max_seq_length: int, splits: dict) -> str:
    """The fields of the builder's manifest.json that readers use."""
    num_tokens = sum(1 for line in open(vocab_path, encoding="utf-8") if line.strip())
    manifest = {
        "format_version": tfrecord_io.MANIFEST_FORMAT_VERSION,
        "features": {name: ["int64", max_seq_length] for name in tfrecord_io.FEATURE_NAMES},
        "max_seq_length": max_seq_length,
        "vocab": {"path": vocab_path, "sha256": file_sha256(vocab_path), "size": num_tokens},
        "do_lower_case": True,
        "strip_accents": True,
        "splits": splits,
    }
    path = os.path.join(out_dir, tfrecord_io.MANIFEST_NAME)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1)
    return path


def write_labelled_tasks(raw_dir: str) -> str:
    """Small bbc_news (3 labels) and pang_lee (2) task dirs of random fixture-vocab words, as
    `python -m electra_tf.commands.fetch_labelled` writes them (train 24 / dev 6 / test 6 rows)."""
    from electra_tf.sources.labelled import LabelledExample, write_tsv

    rng = np.random.default_rng(0)
    for task, labels in (("bbc_news", ["business", "sport", "tech"]), ("pang_lee", ["0", "1"])):
        os.makedirs(os.path.join(raw_dir, task))
        for split, count in (("train", 24), ("dev", 6), ("test", 6)):
            rows = [LabelledExample(" ".join(f"w{rng.integers(0, 60)}" for _ in range(8)),
                                    labels[i % len(labels)], f"{split}:{i}") for i in range(count)]
            write_tsv(os.path.join(raw_dir, task, f"{split}.tsv"), rows)
    return raw_dir


def tiny_hparams(**overrides) -> dict:
    hparams = json.loads(json.dumps(TINY_HPARAMS))
    for key, value in overrides.items():
        if key == "model_hparam_overrides":
            hparams[key] = dict(hparams[key], **value)
        else:
            hparams[key] = value
    return hparams


def tiny_config(data_dir: str, model_name: str = "tiny", **overrides):
    from electra_tf.config import PretrainingConfig

    return PretrainingConfig.create(model_name, data_dir, tiny_hparams(**overrides))


def layer_weights(layer) -> List[np.ndarray]:
    """Copies of `layer`'s weights (the values now, whatever training does next)."""
    return [w.copy() for w in layer.get_weights()]


def assert_same_weights(a: List[np.ndarray], b: List[np.ndarray]) -> None:
    """`a` and `b` are the same non-empty list of arrays, bit for bit."""
    assert len(a) == len(b) and a
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


def free_ports(count: int) -> List[int]:
    """Ports free on 127.0.0.1 right now (held open together so they are distinct)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


# Set by tests/conftest.py for the session: a directory under pytest's basetemp that children
# use as TMPDIR. Many children are SIGKILLed on purpose, and TensorFlow removes its autograph
# files (`__autograph_generated_file*.py`) only at a normal exit; in /tmp they would pile up by
# the hundred per run, while pytest prunes its basetemp (the last 3 runs are kept).
CHILD_TMPDIR: Optional[str] = None


def subprocess_env(**extra) -> dict:
    """Environment for a child Python: the repo importable, TF quiet, no hub access, temp files
    under the session's `CHILD_TMPDIR`."""
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["HF_HUB_OFFLINE"] = "1"
    env.pop("TF_CONFIG", None)
    if CHILD_TMPDIR:
        env["TMPDIR"] = CHILD_TMPDIR
    env.update(extra)
    return env


def run_pretraining_command(data_dir: str, model_name: str, hparams: dict, *flags) -> List[str]:
    return [sys.executable, os.path.join(REPO_ROOT, "run_pretraining.py"), "--data-dir", data_dir,
            "--model-name", model_name, "--hparams", json.dumps(hparams), *flags]


# The line run_pretraining.py prints at the end: the step and a sha256 of all weights.
FINAL_LINE = re.compile(r"final: step (\d+), checkpoint \S+, weights sha256 ([0-9a-f]{64})")


def final_fingerprint(log: str):
    """(step, weights sha256) of the last final line in a run's log; fails the test without one."""
    found = FINAL_LINE.findall(log)
    assert found, f"no final line:\n{log[-3000:]}"
    return int(found[-1][0]), found[-1][1]


def latest_step(model_dir: str) -> Optional[int]:
    """The step of the checkpoint `model_dir`'s state file names, or None."""
    import tensorflow as tf

    path = tf.train.latest_checkpoint(model_dir) if os.path.isdir(model_dir) else None
    return None if path is None else int(path.rsplit("-", 1)[1])


def start_workers(data_dir: str, model_name: str, hparams: dict, count: int = 2, outputs=None):
    """`count` run_pretraining.py workers of one MultiWorkerMirroredStrategy cluster on free
    127.0.0.1 ports (TF_CONFIG per worker); stderr is merged into each Popen's stdout, a pipe or,
    given `outputs` (one open file per worker), that file (readable while the worker runs)."""
    cluster = {"worker": [f"127.0.0.1:{p}" for p in free_ports(count)]}
    procs = []
    for index in range(count):
        env = subprocess_env(TF_CONFIG=json.dumps(
            {"cluster": cluster, "task": {"type": "worker", "index": index}}))
        procs.append(subprocess.Popen(
            run_pretraining_command(data_dir, model_name, hparams), env=env,
            stdout=subprocess.PIPE if outputs is None else outputs[index],
            stderr=subprocess.STDOUT, text=True, cwd=REPO_ROOT))
    return procs


def run_workers_to_end(data_dir: str, model_name: str, hparams: dict, timeout: float,
                       count: int = 2):
    """Starts `count` workers (`start_workers`) and waits for all; returns (procs, logs)."""
    procs = start_workers(data_dir, model_name, hparams, count)
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return procs, logs


def read_scalars(model_dir: str, tags) -> Dict[str, Dict[int, float]]:
    """{tag: {step: value}} from every TensorBoard event file in `model_dir`, oldest file first, so
    the last write of a step (a restarted run's) wins. A file cut short by SIGKILL is read up to
    the cut."""
    import glob

    import tensorflow as tf

    scalars = {tag: {} for tag in tags}
    for path in sorted(glob.glob(os.path.join(model_dir, "events.out.tfevents.*")),
                       key=os.path.getmtime):
        try:
            for event in tf.compat.v1.train.summary_iterator(path):
                for value in event.summary.value:
                    if value.tag in scalars:
                        scalars[value.tag][event.step] = float(tf.make_ndarray(value.tensor))
        except tf.errors.DataLossError:
            pass  # the record being written when the process was killed
    return scalars
