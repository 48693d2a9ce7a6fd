"""Benchmark: the dataset build on Apache Beam's DirectRunner beside the local builder, 1x-32x.

For each corpus scale (--scales, default 1,32: copies of the default corpus made as in
`build_dataset.py`, from the real default text), builds the dataset in a fresh process with
each engine (--engines, default local:1 and beam:1):

* `local:N`: the local builder with N processes (`build_dataset`);
* `beam:N`: `build_dataset_beam` on the DirectRunner, N workers (1: in_memory; N > 1:
  multi_processing).

and reports wall time, tokens/s, "amortised" tokens/s (wall minus the engine's fixed start-up,
measured on a tiny corpus), and peak RSS of the build's process tree (sampled from /proc every
0.2 s). The shards of all engines are checked byte-identical at every scale.

Needs Apache Beam (pip install -e '.[beam]'):

    python benchmarks/build_dataset_beam.py                     # 1x and 32x, ~30 min on 2 cores
    python benchmarks/build_dataset_beam.py --scales 1          # a quick look

Writes a table to stdout and JSON to --output (default benchmarks/results/build_dataset_beam.json).
"""

import argparse
import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import build_dataset as local_bench  # noqa: E402  (corpora, RSS sampling, digests)

_BEAM_DRIVER = """
import json, resource, sys, time
sys.path.insert(0, {root!r})
config = json.loads(sys.argv[1])
args = config.pop("beam_args")
from electra_tf.data.build.build_config import BuildConfig
from electra_tf.data.build.beam_build import build_dataset_beam
start = time.perf_counter()
manifest = build_dataset_beam(BuildConfig(**config), "DirectRunner", args)
seconds = time.perf_counter() - start
print(json.dumps({{"seconds": seconds, "manifest": manifest,
    "main_maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "children_maxrss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}}))
"""


def parse_engine(text):
    kind, _, count = text.partition(":")
    if kind not in ("local", "beam") or not count.isdigit() or int(count) < 1:
        raise argparse.ArgumentTypeError(f"engine {text!r}: expected local:N or beam:N")
    return kind, int(count)


def build(engine, corpus, vocab_file, output_dir):
    kind, count = engine
    config = {"corpus_dir": corpus, "vocab_file": vocab_file, "output_dir": output_dir,
              "progress_interval": 1e9}
    if kind == "local":
        return local_bench.run_build(dict(config, num_processes=count))
    mode = ["--direct_num_workers", str(count), "--direct_running_mode",
            "in_memory" if count == 1 else "multi_processing"]
    return local_bench.run_build(dict(config, beam_args=mode), driver=_BEAM_DRIVER)


def bench(args, workdir):
    tiny = local_bench.make_tiny_corpus(args.corpus_dir, os.path.join(workdir, "tiny"))
    startup = {}
    for engine in args.engines:
        out = os.path.join(workdir, "tiny_out")
        startup[engine] = build(engine, tiny, args.vocab_file, out)["seconds"]
        shutil.rmtree(out)
        print(f"start-up of {engine[0]}:{engine[1]}: {startup[engine]:.1f} s", flush=True)
    rows = []
    for scale in args.scales:
        corpus = local_bench.make_scaled_corpus(args.corpus_dir,
                                                os.path.join(workdir, f"corpus_{scale}x"), scale)
        digests = set()
        for engine in args.engines:
            out = os.path.join(workdir, f"out_{scale}x")
            result = build(engine, corpus, args.vocab_file, out)
            m = result["manifest"]
            digests.add(local_bench.shard_digest(out, m))
            row = dict({"scale": scale, "engine": f"{engine[0]}:{engine[1]}"},
                       **local_bench.build_row(result, startup[engine],
                                               children_key="children_maxrss_mb"))
            rows.append(row)
            print(json.dumps(row), flush=True)
            shutil.rmtree(out)
        if len(digests) != 1:
            raise RuntimeError(f"{scale}x: the engines' shards differ")
        for row in rows:
            if row["scale"] == scale:
                row["shards_identical_across_engines"] = True
        shutil.rmtree(corpus)
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus-dir", default="pretrain_data/corpus", help="the 1x corpus")
    p.add_argument("--vocab-file", default="pretrain_data/vocab.txt")
    p.add_argument("--scales", default="1,32", help="corpus sizes, in copies of the 1x")
    p.add_argument("--engines", default="local:1,beam:1",
                   help="comma-separated local:N (processes) / beam:N (DirectRunner workers)")
    p.add_argument("--workdir", help="scratch directory (default: a temporary one; needs ~2x "
                   "the largest corpus)")
    p.add_argument("--output", default="benchmarks/results/build_dataset_beam.json")
    args = p.parse_args()
    args.scales = [int(s) for s in args.scales.split(",")]
    args.engines = [parse_engine(e) for e in args.engines.split(",")]
    env = local_bench.environment()
    from importlib import metadata
    env["apache-beam"] = metadata.version("apache-beam")
    print(json.dumps(env), flush=True)
    workdir = args.workdir or tempfile.mkdtemp(prefix="beam_bench_")
    os.makedirs(workdir, exist_ok=True)
    try:
        rows = bench(args, workdir)
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    env["loadavg_end"] = os.getloadavg()
    print(f"\n{'scale':>5} {'engine':>8} {'MB':>7} {'s':>7} {'tok/s':>9} {'amort.':>9} "
          f"{'RSS MB':>7}")
    for r in rows:
        print(f"{r['scale']:>5} {r['engine']:>8} {r['corpus_bytes'] / 1e6:7.0f} "
              f"{r['seconds']:7.1f} {r['tokens_per_second']:9.0f} "
              f"{r['amortised_tokens_per_second']:9.0f} {r['tree_peak_rss_mb']:7.0f}")
    os.makedirs(os.path.dirname(args.output) or ".", exist_ok=True)
    with open(args.output, "w") as f:
        json.dump({"environment": env, "rows": rows, "command": sys.argv}, f, indent=2)


if __name__ == "__main__":
    main()
