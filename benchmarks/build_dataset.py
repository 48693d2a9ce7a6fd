"""Benchmark: dataset-builder throughput vs raw HF `tokenizers` BERT WordPiece encoding.

Measures, in one run and on the same text:
  * the full builder (`build_dataset`: read, tokenise, pack, serialise, write shards + manifest)
    with 1 and 2 processes, wall clock of the whole call (worker start-up included);
  * HF `tokenizers`' BertWordPieceTokenizer.encode_batch over the same non-blank lines, with its
    default parallelism (all cores), as the reference for "how fast can WordPiece go here".
Throughput is content tokens per second (the builder's tokenised tokens; HF without specials).
Target: builder >= 0.5x the HF number.

    python benchmarks/build_dataset.py                      # default corpus (pretrain_data/)
    python benchmarks/build_dataset.py --scale 8             # 8 copies of it (~92 MB)
    python benchmarks/build_dataset.py --synthetic-mb 20     # generated corpus, if none fetched

Writes a table to stdout and JSON to --output (default benchmarks/results/build_dataset.json).
"""

import argparse
import json
import os
import platform
import random
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from electra_tf.data.builder import BuildConfig, build_dataset  # noqa: E402
from electra_tf.data.corpus import ReadStats, iter_line_batches, list_corpus_files  # noqa: E402


def make_synthetic_corpus(directory, vocab_file, megabytes, num_files=8, seed=0):
    """Sentences of random whole words from the vocab, blank lines between documents."""
    words = [t for t in open(vocab_file, encoding="utf-8").read().split("\n")
             if t.isalpha() and t.isascii() and len(t) > 1]
    rng = random.Random(seed)
    per_file = megabytes * 2 ** 20 // num_files
    for f in range(num_files):
        with open(os.path.join(directory, f"synthetic_{f:03d}.txt"), "w", encoding="utf-8") as out:
            written = 0
            while written < per_file:
                doc = "\n".join(
                    " ".join(rng.choices(words, k=rng.randint(5, 30))).capitalize() + "."
                    for _ in range(rng.randint(3, 30)))
                out.write(doc + "\n\n")
                written += len(doc) + 2


def replicate_corpus(corpus_dir, target, copies):
    os.makedirs(target)
    for f in list_corpus_files(corpus_dir):
        for k in range(copies):
            name = f"copy{k}_" + f.relpath.replace("/", "_")
            os.symlink(os.path.abspath(f.path), os.path.join(target, name))
    return target


def read_lines(corpus_dir):
    lines = []
    for f in list_corpus_files(corpus_dir):
        for batch in iter_line_batches(f.path, ReadStats()):
            lines += [line for line in batch if line]
    return lines


def bench_hf(vocab_file, lines, do_lower_case=True):
    from tokenizers import BertWordPieceTokenizer

    tokenizer = BertWordPieceTokenizer(vocab_file, lowercase=do_lower_case, clean_text=True,
                                       handle_chinese_chars=True)
    tokenizer.encode_batch(lines[:1000], add_special_tokens=False)  # warm-up
    start = time.perf_counter()
    tokens = 0
    for i in range(0, len(lines), 100000):  # large batches; HF parallelises within a batch
        tokens += sum(len(e.ids) for e in tokenizer.encode_batch(lines[i:i + 100000],
                                                                  add_special_tokens=False))
    seconds = time.perf_counter() - start
    return {"method": "hf_tokenizers_encode_batch", "processes": os.cpu_count(),
            "seconds": seconds, "tokens": tokens, "tokens_per_second": tokens / seconds}


def bench_builder(corpus_dir, vocab_file, processes, max_seq_length, workdir):
    out = os.path.join(workdir, f"out_{processes}")
    start = time.perf_counter()
    manifest = build_dataset(BuildConfig(corpus_dir=corpus_dir, vocab_file=vocab_file,
                                         output_dir=out, max_seq_length=max_seq_length,
                                         num_processes=processes, overwrite=True,
                                         progress_interval=1e9))
    seconds = time.perf_counter() - start
    tokens = manifest["counts"]["tokenized_tokens"]
    return {"method": "build_dataset", "processes": processes, "seconds": seconds,
            "tokens": tokens, "tokens_per_second": tokens / seconds,
            "examples": manifest["counts"]["examples"]}


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus-dir", default="pretrain_data/corpus")
    p.add_argument("--vocab-file", default="pretrain_data/vocab.txt")
    p.add_argument("--synthetic-mb", type=int, default=0,
                   help="benchmark a generated corpus of this size instead of --corpus-dir")
    p.add_argument("--scale", type=int, default=1,
                   help="use K copies of every corpus file (under distinct names), so worker "
                        "start-up is amortised as on a larger corpus")
    p.add_argument("--processes", default="1,2", help="comma-separated process counts")
    p.add_argument("--max-seq-length", type=int, default=128)
    p.add_argument("--output", default="benchmarks/results/build_dataset.json")
    args = p.parse_args()

    import tensorflow as tf  # noqa: F401 -- imported up front so N=1 does not pay for it

    with tempfile.TemporaryDirectory() as workdir:
        corpus_dir = args.corpus_dir
        if args.synthetic_mb:
            corpus_dir = os.path.join(workdir, "corpus")
            os.makedirs(corpus_dir)
            make_synthetic_corpus(corpus_dir, args.vocab_file, args.synthetic_mb)
        if args.scale > 1:
            corpus_dir = replicate_corpus(corpus_dir, os.path.join(workdir, "scaled"), args.scale)
        lines = read_lines(corpus_dir)
        corpus_bytes = sum(f.size for f in list_corpus_files(corpus_dir))
        hf = bench_hf(args.vocab_file, lines)
        rows = [bench_builder(corpus_dir, args.vocab_file, int(n), args.max_seq_length, workdir)
                for n in args.processes.split(",")]
    for row in rows:
        row["ratio_to_hf"] = row["tokens_per_second"] / hf["tokens_per_second"]
    rows.append(hf)

    print(f"corpus: {corpus_dir} ({corpus_bytes / 1e6:.1f} MB, {len(lines)} non-blank lines), "
          f"{os.cpu_count()} cores")
    print(f"{'method':<28}{'procs':>6}{'seconds':>10}{'tokens':>12}{'tokens/s':>12}{'vs HF':>8}")
    for row in rows:
        ratio = f"{row['ratio_to_hf']:.2f}x" if "ratio_to_hf" in row else "1.00x"
        print(f"{row['method']:<28}{row['processes']:>6}{row['seconds']:>10.2f}{row['tokens']:>12}"
              f"{row['tokens_per_second']:>12.0f}{ratio:>8}")
    result = {"corpus_dir": corpus_dir, "synthetic_mb": args.synthetic_mb, "scale": args.scale,
              "corpus_bytes": corpus_bytes, "lines": len(lines), "cpu_count": os.cpu_count(),
              "python": platform.python_version(), "max_seq_length": args.max_seq_length,
              "command": " ".join([os.path.basename(sys.executable)] + sys.argv), "rows": rows}
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
