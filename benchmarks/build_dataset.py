"""Benchmark: dataset-builder scaling to gigabytes, mixing at scale, the input pipeline at scale.

Sections (each can be chosen with --sections):

* `scaling`: corpora of K x the default corpus (--scales, default 1,8,32,100; 100x is ~1.15 GB),
  made from the real default text (every file's documents repeated K times, each copy in its own
  seeded order, under distinct names), each built with 1 and 2 processes (--processes) in a
  subprocess: wall time, tokens/s, and peak RSS (the largest process, and the sum over the build's
  processes, sampled from /proc every 0.2 s). The fixed start-up (TensorFlow, tokenizer, worker
  spawn) is measured by building a tiny corpus the same way; "amortised tokens/s" is
  tokens / (wall - start-up). Builds with 1 and 2 processes are checked byte-identical. With
  --tokenizers tensorflow,tokenizers each build is also run with the TensorFlow-free tokenizer
  (issue 48: no TensorFlow is loaded by such a build), checked byte-identical to the other.
* `mixing`: on the 1x corpus and at the largest scale, the training pipeline's batches (2,000 batches of 32, the
  trainer's seed 0) against random draws (`electra_tf.data.records.mixing`): source = which default-corpus
  source (austen, foldoc, lee, wiki) the example's file is a copy of; position = the example's
  place in corpus order. Examples are traced through a twin dataset: the same shard names and
  record counts, each record holding the example's corpus position (the pipeline's order depends
  only on names, counts and seed); the mapping from output records to (file, index) is recomputed
  from inputs.jsonl and the shuffle keys, and checked against the manifest's shard counts. Done
  for the default shard count and, with --mixing-shards, others (e.g. 1).
* `pipeline`: at the largest scale built into --pipeline-shards shards (default 1024): start-up
  (validate_dataset + make_dataset + first batch) and steady-state examples/s of the training
  input pipeline (batch 128), and the `skip_bad_records` planning time (validate_dataset with
  skip_bad_records, reading every record once).
* `hf`: the 1x builder against raw HF `tokenizers` BERT WordPiece encode_batch (all cores).

    python benchmarks/build_dataset.py                          # everything, ~1 h on 2 cores
    python benchmarks/build_dataset.py --scales 1,8 --sections scaling   # a quick look

Writes a table to stdout and JSON to --output (default benchmarks/results/build_dataset.json).
"""

import argparse
import hashlib
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

from electra_tf.data.text.corpus import (ReadStats, iter_line_batches,  # noqa: E402
                                         list_corpus_files)
from electra_tf.data.text.formats import (InputSettings, iter_document_lines,  # noqa: E402
                                          iter_documents)

SOURCES = ("austen", "foldoc", "lee", "wiki")  # the default corpus' file prefixes
_BUILD_DRIVER = """
import json, resource, sys, time
sys.path.insert(0, {root!r})
from electra_tf.data.build.build_config import BuildConfig
from electra_tf.data.build.builder import build_dataset
start = time.perf_counter()
manifest = build_dataset(BuildConfig(**json.loads(sys.argv[1])))
seconds = time.perf_counter() - start
print(json.dumps({{"seconds": seconds, "manifest": manifest,
    "main_maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "children_maxrss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}}))
"""


# ------------------------------------------------------------------------------------------------
# Corpora
# ------------------------------------------------------------------------------------------------
def read_documents(corpus_file):
    """A default-corpus file as a list of documents (each a list of lines)."""
    return list(iter_documents(iter_document_lines(corpus_file, InputSettings(), ReadStats())))


def make_scaled_corpus(base_dir, target, copies):
    """K copies of every base file, each copy's documents in their own seeded order."""
    os.makedirs(target)
    base = [(f.relpath, read_documents(f)) for f in list_corpus_files(base_dir)]
    for copy in range(copies):
        directory = os.path.join(target, f"copy{copy:03d}")
        os.makedirs(directory)
        for relpath, docs in base:
            order = list(range(len(docs)))
            if copy:
                random.Random(f"{copy}/{relpath}").shuffle(order)
            with open(os.path.join(directory, relpath.replace("/", "_")), "w",
                      encoding="utf-8") as out:
                out.write("\n\n".join("\n".join(docs[i]) for i in order) + "\n")
    return target


def make_tiny_corpus(base_dir, target):
    os.makedirs(target)
    first = list_corpus_files(base_dir)[0]
    docs = read_documents(first)[:3]
    with open(os.path.join(target, "tiny.txt"), "w", encoding="utf-8") as out:
        out.write("\n\n".join("\n".join(d) for d in docs) + "\n")
    return target


# ------------------------------------------------------------------------------------------------
# Builds in subprocesses, with RSS sampling
# ------------------------------------------------------------------------------------------------
def _tree_rss_mb(root_pid):
    """Sum of VmRSS over root_pid and its descendants (Linux /proc)."""
    parents = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    parents[int(name)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    tree, frontier = {root_pid}, [root_pid]
    while frontier:
        pid = frontier.pop()
        for child, parent in parents.items():
            if parent == pid and child not in tree:
                tree.add(child)
                frontier.append(child)
    total = 0
    for pid in tree:
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


def run_build(config, driver=_BUILD_DRIVER, python=sys.executable):
    """Runs build_dataset(config) (or another `driver`) in a fresh process; returns timing,
    manifest and RSS."""
    proc = subprocess.Popen([python, "-c", driver.format(root=REPO_ROOT), json.dumps(config)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = [0.0]

    def sample():
        while proc.poll() is None:
            peak[0] = max(peak[0], _tree_rss_mb(proc.pid))
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    load_before = os.getloadavg()[0]
    sampler.start()
    out, err = proc.communicate()
    sampler.join()
    if proc.returncode:
        raise RuntimeError(f"build failed:\n{err[-3000:]}")
    result = json.loads(out.strip().splitlines()[-1])
    result["tree_peak_rss_mb"] = peak[0]
    result["load_before"] = load_before
    result["load_after"] = os.getloadavg()[0]
    return result


def shard_digest(output_dir, manifest):
    digest = hashlib.sha256()
    for split in ("train", "eval"):
        for shard in manifest["splits"][split]["shards"]:
            with open(os.path.join(output_dir, shard["file"]), "rb") as f:
                for block in iter(lambda: f.read(1 << 24), b""):
                    digest.update(block)
    return digest.hexdigest()


def build_row(result, startup_seconds, children_key):
    """One result row of a timed build (shared with build_dataset_beam.py).

    Args:
        result: `run_build`'s result (its manifest, wall seconds, RSS and load figures).
        startup_seconds: the same engine's start-up, subtracted for the amortised rate.
        children_key: the row's name for the largest child process's peak RSS.
    """
    m = result["manifest"]
    tokens = m["counts"]["tokenized_tokens"]
    return {"corpus_bytes": m["counts"]["corpus_bytes"], "tokens": tokens,
            "examples": m["counts"]["examples"],
            "train_shards": len(m["splits"]["train"]["shards"]),
            "seconds": result["seconds"], "startup_seconds": startup_seconds,
            "tokens_per_second": tokens / result["seconds"],
            "amortised_tokens_per_second": tokens / max(result["seconds"] - startup_seconds, 1e-9),
            "main_maxrss_mb": result["main_maxrss_mb"],
            children_key: result["children_maxrss_mb"],
            "tree_peak_rss_mb": result["tree_peak_rss_mb"],
            "load": [result["load_before"], result["load_after"]]}


def bench_scaling(args, workdir, base_dir):
    rows = []
    tiny = make_tiny_corpus(base_dir, os.path.join(workdir, "tiny"))
    startup = {}
    runs = [(n, tokenizer) for n in args.processes for tokenizer in args.tokenizers]
    for n, tokenizer in runs:
        out = os.path.join(workdir, f"tiny_out_{n}")
        startup[n, tokenizer] = run_build({"corpus_dir": tiny, "vocab_file": args.vocab_file,
                                           "output_dir": out, "num_processes": n,
                                           "tokenizer": tokenizer,
                                           "progress_interval": 1e9})["seconds"]
        shutil.rmtree(out)
        print(f"start-up with {n} process(es), tokenizer {tokenizer}: "
              f"{startup[n, tokenizer]:.1f} s", flush=True)
    for scale in args.scales:
        corpus = make_scaled_corpus(base_dir, os.path.join(workdir, f"corpus_{scale}x"), scale)
        digests = {}
        for n, tokenizer in runs:
            out = os.path.join(workdir, f"out_{scale}x_{n}")
            if os.path.isdir(out):
                shutil.rmtree(out)
            result = run_build({"corpus_dir": corpus, "vocab_file": args.vocab_file,
                                "output_dir": out, "num_processes": n, "tokenizer": tokenizer,
                                "progress_interval": 1e9})
            m = result["manifest"]
            digests[n, tokenizer] = shard_digest(out, m)
            row = dict({"scale": scale, "processes": n, "tokenizer": tokenizer},
                       **build_row(result, startup[n, tokenizer],
                                   children_key="worker_maxrss_mb"),
                       shuffle_buckets=m["shuffle"]["buckets"], phase_seconds=m["phase_seconds"])
            rows.append(row)
            print(json.dumps(row), flush=True)
            if scale != max(args.scales) or tokenizer != args.tokenizers[-1]:
                shutil.rmtree(out)
        if len(set(digests.values())) != 1:
            raise RuntimeError(f"{scale}x: builds with {sorted(digests)} (processes, tokenizer) "
                               "differ")
        for row in rows:
            if row["scale"] == scale:
                row["shards_identical_across_processes"] = True
        if scale != max(args.scales):
            shutil.rmtree(corpus)
    return rows


# ------------------------------------------------------------------------------------------------
# Mixing at scale: a twin dataset of corpus positions
# ------------------------------------------------------------------------------------------------
def output_order(output_dir, manifest, split="train"):
    """Per output record (shards in order, records in order): (file index, index in file),
    recomputed from inputs.jsonl and the shuffle keys; checks the manifest's shard counts."""
    import numpy as np

    from electra_tf.data.build import shuffle

    inputs = [json.loads(line) for line in open(os.path.join(output_dir, "inputs.jsonl"))]
    seed = manifest["seed"]
    keys, files, indices = [], [], []
    for f, entry in enumerate(inputs):
        base = shuffle.key_base(seed, split, entry["file"])
        n = entry["examples"][split]
        keys += [shuffle.shuffle_key_from_base(base, i) for i in range(n)]
        files += [f] * n
        indices += range(n)
    keys = np.array(keys, dtype=np.uint64)
    order = np.argsort(keys, kind="stable")
    shards = manifest["splits"][split]["shards"]
    bounds = np.searchsorted(keys[order], np.array(
        [shuffle.shard_start(s, len(shards)) for s in range(1, len(shards))], dtype=np.uint64))
    counts = np.diff(np.concatenate([[0], bounds, [len(keys)]])).tolist()
    if counts != [s["examples"] for s in shards]:
        raise RuntimeError("recomputed shard counts differ from the manifest's")
    return inputs, np.array(files)[order], np.array(indices)[order]


def write_twin(output_dir, manifest, twin_dir, values):
    """Shards with the same names and record counts; record r holds values[r] as input_ids[1]."""
    import tensorflow as tf

    from electra_tf.data.build.example_builder import PackedExample
    from electra_tf.data.records.tfrecord_io import ExampleSerializer

    os.makedirs(twin_dir)
    serializer = ExampleSerializer(4, 0, 1)
    start = 0
    for shard in manifest["splits"]["train"]["shards"]:
        with tf.io.TFRecordWriter(os.path.join(twin_dir, shard["file"])) as writer:
            for i in range(start, start + shard["examples"], 4096):
                chunk = values[i:min(i + 4096, start + shard["examples"])]
                for record in serializer.serialize([PackedExample([int(v)], [], 0)
                                                    for v in chunk]):
                    writer.write(record)
        start += shard["examples"]


def bench_mixing(output_dir, manifest, workdir, num_batches, label):
    import numpy as np

    from electra_tf.data.records import mixing, pipeline

    inputs, files, indices = output_order(output_dir, manifest)
    counts = np.array([e["examples"]["train"] for e in inputs])
    first = np.concatenate([[0], np.cumsum(counts)[:-1]])
    positions = first[files] + indices  # corpus order: files by relpath, then index
    source_of_file = np.array([SOURCES.index(next(s for s in SOURCES
                                                  if os.path.basename(e["file"]).startswith(s)))
                               for e in inputs])
    twin = os.path.join(workdir, "twin")
    write_twin(output_dir, manifest, twin, np.arange(len(files)))  # record -> output rank
    start = time.perf_counter()
    dataset = pipeline.make_dataset(os.path.join(twin, "pretrain_data.tfrecord*"), batch_size=32,
                                    max_seq_length=4, is_training=True, seed=0)
    ranks = np.stack([b["input_ids"][:, 1].numpy() for b in dataset.take(num_batches)])
    read_seconds = time.perf_counter() - start
    shutil.rmtree(twin)
    stats = mixing.mixing_statistics(source_of_file[files[ranks]], positions[ranks],
                                     np.random.default_rng(0))
    stats.update(label=label, shards=len(manifest["splits"]["train"]["shards"]),
                 examples=int(len(files)), batches=num_batches, read_seconds=read_seconds,
                 source_shares=(np.bincount(source_of_file[files], minlength=len(SOURCES))
                                / len(files)).tolist())
    return stats


def check_twin_order(output_dir, manifest, workdir, num_batches=20):
    """On a small build: the twin's batches name exactly the records the real batches hold."""
    import numpy as np
    import tensorflow as tf

    from electra_tf.data.records import pipeline

    records = [r.numpy() for s in manifest["splits"]["train"]["shards"]
               for r in tf.data.TFRecordDataset(os.path.join(output_dir, s["file"]))]
    twin = os.path.join(workdir, "twin_check")
    write_twin(output_dir, manifest, twin, np.arange(len(records)))
    length = manifest["max_seq_length"]
    real = pipeline.make_dataset(os.path.join(output_dir, "pretrain_data.tfrecord*"),
                                 batch_size=32, max_seq_length=length, is_training=True, seed=0)
    fake = pipeline.make_dataset(os.path.join(twin, "pretrain_data.tfrecord*"), batch_size=32,
                                 max_seq_length=4, is_training=True, seed=0)
    from electra_tf.data.records.tfrecord_io import parse_example

    for a, b in zip(real.take(num_batches), fake.take(num_batches)):
        expected = parse_example(tf.constant([records[i] for i in b["input_ids"][:, 1].numpy()]),
                                 length)["input_ids"].numpy()
        if not np.array_equal(a["input_ids"].numpy(), expected):
            raise RuntimeError("the twin dataset's order differs from the real one's")
    shutil.rmtree(twin)
    return True


# ------------------------------------------------------------------------------------------------
# The input pipeline at scale
# ------------------------------------------------------------------------------------------------
def bench_pipeline(output_dir, manifest, vocab_file, steady_batches):
    from electra_tf.data.records import integrity, pipeline
    from electra_tf.vocab import load_vocab

    vocab = load_vocab(vocab_file)
    pattern = os.path.join(output_dir, "pretrain_data.tfrecord*")
    length = manifest["max_seq_length"]
    start = time.perf_counter()
    summary = integrity.validate_dataset(pattern, max_seq_length=length, vocab_sha256=vocab.sha256,
                                        vocab_size=vocab.size)
    validated = time.perf_counter()
    iterator = iter(pipeline.make_dataset(pattern, batch_size=128, max_seq_length=length,
                                          is_training=True, seed=0))
    next(iterator)
    first_batch = time.perf_counter()
    for _ in range(50):  # warm-up: fill the shuffle buffer and the prefetch
        next(iterator)
    steady_start = time.perf_counter()
    for _ in range(steady_batches):
        next(iterator)
    steady = time.perf_counter() - steady_start
    plan_start = time.perf_counter()
    planned = integrity.validate_dataset(pattern, max_seq_length=length,
                                        vocab_sha256=vocab.sha256, vocab_size=vocab.size,
                                        skip_bad_records=True)
    plan_seconds = time.perf_counter() - plan_start
    return {"shards": len(manifest["splits"]["train"]["shards"]),
            "examples": summary["num_examples"],
            "validate_seconds": validated - start, "first_batch_seconds": first_batch - start,
            "steady_examples_per_second": steady_batches * 128 / steady,
            "skip_bad_records_plan_seconds": plan_seconds,
            "planned_examples": planned["num_examples"],
            "dataset_bytes": sum(s["bytes"] for s in manifest["splits"]["train"]["shards"])}


# ------------------------------------------------------------------------------------------------
# HF reference (the builder's tokenizer speed against raw WordPiece)
# ------------------------------------------------------------------------------------------------
def bench_hf(vocab_file, corpus_dir, workdir):
    from tokenizers import BertWordPieceTokenizer

    lines = [line for f in list_corpus_files(corpus_dir)
             for batch in iter_line_batches(f.path, ReadStats()) for line in batch if line]
    tokenizer = BertWordPieceTokenizer(vocab_file, lowercase=True, clean_text=True,
                                       handle_chinese_chars=True)
    tokenizer.encode_batch(lines[:1000], add_special_tokens=False)  # warm-up
    start = time.perf_counter()
    tokens = 0
    for i in range(0, len(lines), 100000):  # large batches; HF parallelises within a batch
        tokens += sum(len(e.ids) for e in tokenizer.encode_batch(lines[i:i + 100000],
                                                                  add_special_tokens=False))
    seconds = time.perf_counter() - start
    builder = run_build({"corpus_dir": corpus_dir, "vocab_file": vocab_file,
                         "output_dir": os.path.join(workdir, "hf_builder_out"),
                         "progress_interval": 1e9})
    shutil.rmtree(os.path.join(workdir, "hf_builder_out"))
    return {"hf_tokens_per_second": tokens / seconds, "hf_threads": os.cpu_count(),
            "builder_tokens_per_second": builder["manifest"]["counts"]["tokenized_tokens"]
            / builder["seconds"]}


# ------------------------------------------------------------------------------------------------
def environment():
    from importlib import metadata

    from electra_tf import precision

    model, flags = precision.read_cpu()
    return {"cpu": model, "cpu_flags": precision.recorded_cpu_flags(flags),
            "cpu_count": os.cpu_count(), "python": platform.python_version(),
            "tensorflow": metadata.version("tensorflow"),
            "tensorflow-text": metadata.version("tensorflow-text"),
            "numpy": metadata.version("numpy"), "loadavg_start": os.getloadavg()}


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus-dir", default="pretrain_data/corpus", help="the 1x corpus")
    p.add_argument("--vocab-file", default="pretrain_data/vocab.txt")
    p.add_argument("--scales", default="1,8,32,100", help="corpus sizes, in copies of the 1x")
    p.add_argument("--processes", default="1,2", help="comma-separated process counts")
    p.add_argument("--tokenizers", default="tensorflow", help="the scaling section's "
                   "builds with each: comma-separated tensorflow, tokenizers (the builder's "
                   "--tokenizer)")
    p.add_argument("--sections", default="scaling,mixing,pipeline,hf")
    p.add_argument("--mixing-shards", default="1",
                   help="extra shard counts to build the largest corpus with for the mixing "
                        "check (the default shard count is always checked)")
    p.add_argument("--mixing-batches", type=int, default=2000)
    p.add_argument("--pipeline-shards", type=int, default=1024)
    p.add_argument("--steady-batches", type=int, default=300)
    p.add_argument("--workdir", help="scratch directory (default: a temporary one; needs ~3x "
                                     "the largest corpus)")
    p.add_argument("--output", default="benchmarks/results/build_dataset.json")
    args = p.parse_args()
    args.scales = [int(s) for s in args.scales.split(",")]
    args.processes = [int(n) for n in args.processes.split(",")]
    args.tokenizers = args.tokenizers.split(",")
    sections = set(args.sections.split(","))
    result = {"command": " ".join([os.path.basename(sys.executable)] + sys.argv),
              "environment": environment(), "scales": args.scales}
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)

    def save():
        result["environment"]["loadavg_end"] = os.getloadavg()
        with open(args.output, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)

    if args.workdir:
        os.makedirs(args.workdir, exist_ok=True)  # a scratch dir named on the command line may not exist yet
    with tempfile.TemporaryDirectory(dir=args.workdir) as workdir:
        base = os.path.abspath(args.corpus_dir)
        largest = max(args.scales)
        if "scaling" in sections:
            result["scaling"] = bench_scaling(args, workdir, base)
            save()
        corpus = os.path.join(workdir, f"corpus_{largest}x")
        if not os.path.isdir(corpus) and sections & {"mixing", "pipeline"}:
            make_scaled_corpus(base, corpus, largest)

        def build(label, **extra):
            out = os.path.join(workdir, f"out_{largest}x_{label}")
            if not os.path.isdir(out):
                run_build(dict({"corpus_dir": corpus, "vocab_file": args.vocab_file,
                                "output_dir": out, "progress_interval": 1e9}, **extra))
            return out, json.load(open(os.path.join(out, "manifest.json")))

        if "mixing" in sections:
            small_out = os.path.join(workdir, "out_check")
            run_build({"corpus_dir": base, "vocab_file": args.vocab_file, "output_dir": small_out,
                       "progress_interval": 1e9})
            small_manifest = json.load(open(os.path.join(small_out, "manifest.json")))
            result["twin_order_checked"] = check_twin_order(small_out, small_manifest, workdir)
            result["mixing"] = [bench_mixing(small_out, small_manifest, workdir,
                                             args.mixing_batches, "1x (default corpus), "
                                             f"{len(small_manifest['splits']['train']['shards'])}"
                                             " shards")]
            print(json.dumps(result["mixing"][0]), flush=True)
            shutil.rmtree(small_out)
            existing = os.path.join(workdir, f"out_{largest}x_{args.processes[0]}")
            for shards in [None] + [int(s) for s in args.mixing_shards.split(",") if s]:
                if shards is None and os.path.isdir(existing):
                    out, manifest = existing, json.load(open(os.path.join(existing,
                                                                          "manifest.json")))
                else:
                    out, manifest = build(f"shards{shards}", num_out_files=shards)
                stats = bench_mixing(out, manifest, workdir, args.mixing_batches,
                                     f"{largest}x, {len(manifest['splits']['train']['shards'])} "
                                     f"shards")
                result["mixing"].append(stats)
                print(json.dumps(stats), flush=True)
                if out != existing:
                    shutil.rmtree(out)
            save()
        if "pipeline" in sections:
            out, manifest = build(f"shards{args.pipeline_shards}", num_processes=2,
                                  num_out_files=args.pipeline_shards)
            result["pipeline"] = bench_pipeline(out, manifest, args.vocab_file,
                                                args.steady_batches)
            print(json.dumps(result["pipeline"]), flush=True)
            save()
        if "hf" in sections:
            result["hf"] = bench_hf(args.vocab_file, base, workdir)
            print(json.dumps(result["hf"]), flush=True)
            save()
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
