"""Size and latency of the exported discriminator: ONNX Runtime vs the TF SavedModel.

Builds an ELECTRA-small (or `--model-size`) discriminator with random weights (latency and size
do not depend on the values) and a vocabulary of `--vocab-size` made-up tokens in a temporary
directory, exports it as the SavedModel the trainer writes (`export/discriminator/0`) and as ONNX
(`electra-convert to-onnx`, default opset), then times one inference of batch `--batch` x
sequence `--seq-length` on the CPU:

- TensorFlow: the loaded SavedModel's `serving_default` signature, called in-process;
- ONNX Runtime: an `InferenceSession` (CPUExecutionProvider, all graph optimizations) with its
  default threads (intra-op = the cores, spinning while idle), with spinning off, and with one
  intra-op thread (spinning threads lose the most on a machine whose cores others use).

The two are timed in alternating rounds (`--rounds` x `--calls` each, after `--warmup` calls), so a
change in the machine's load hits both; the medians and 90th percentiles of all calls are printed
with the file sizes, the versions, the CPU's vector flags and the load average before and after,
as JSON (also to `--output`). Needs the [onnx] extra.

    python benchmarks/onnx_latency.py                       # ELECTRA-small, batch 1 x 128
    python benchmarks/onnx_latency.py --model-size base --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

from benchmarks.cli_types import positive_int  # noqa: E402
from electra_tf import precision  # noqa: E402


def cpu_flags(path: str = precision.CPU_INFO) -> str:
    """The AVX-512 / AMX flags of the CPU (`precision.recorded_cpu_flags`), else whether AVX2 and
    FMA are there."""
    flags = precision.read_cpu(path)[1]
    if flags is None:
        return "unknown"
    wide = precision.recorded_cpu_flags(flags)
    if wide:
        return " ".join(wide)
    base = {"avx2", "fma"} & flags
    return ("AVX2+FMA" if base == {"avx2", "fma"} else " ".join(sorted(base)) or "no AVX2") + \
        ", no AVX-512"


def dir_size(path: str) -> int:
    return sum(os.path.getsize(os.path.join(root, name))
               for root, _, names in os.walk(path) for name in names)


def build_export(work: str, model_size: str, vocab_size: int, seq_length: int,
                 num_layers: int = None):
    """(SavedModel dir, run dir) of a random-weight discriminator."""
    import tensorflow as tf

    from electra_tf.config import PretrainingConfig
    from electra_tf.training.pretrainer import ElectraPretrainer
    from electra_tf.training.tf import export as pretraining_export
    from electra_tf.vocab import REQUIRED_TOKENS, load_vocab

    vocab_path = os.path.join(work, "vocab.txt")
    with open(vocab_path, "w", encoding="utf-8") as f:
        tokens = list(REQUIRED_TOKENS)
        f.write("\n".join(tokens + [f"w{i}" for i in range(vocab_size - len(tokens))]) + "\n")
    vocab = load_vocab(vocab_path)
    hparams = {"model_size": model_size, "vocab_size": vocab.size, "max_seq_length": seq_length}
    if num_layers:
        hparams["model_hparam_overrides"] = {"num_hidden_layers": num_layers}
    config = PretrainingConfig.create("bench", work, hparams)
    tf.keras.utils.set_random_seed(0)
    model = ElectraPretrainer.from_pretraining_config(config, vocab.special)
    model.build_from_sequence_length()
    os.makedirs(config.model_dir)
    config.save(os.path.join(config.model_dir, "config.json"))
    shutil.copyfile(vocab_path, os.path.join(config.model_dir, "vocab.txt"))
    tf.train.Checkpoint(model=model).save(os.path.join(config.model_dir, "ckpt"))
    return pretraining_export.export_all(model, vocab, config)["discriminator"], config.model_dir


def load_average() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-size", choices=("small", "base", "large"), default="small",
                        help="ELECTRA size preset (default: %(default)s)")
    parser.add_argument("--vocab-size", type=positive_int, default=30522,
                        help="vocabulary size, BERT's uncased by default (default: %(default)s)")
    parser.add_argument("--num-layers", type=positive_int, default=None,
                        help="encoder layers instead of the preset's (a quicker check; default: "
                             "the preset's, 12 for small)")
    parser.add_argument("--batch", type=positive_int, default=1, help="batch size (default: %(default)s)")
    parser.add_argument("--seq-length", type=positive_int, default=128,
                        help="sequence length (default: %(default)s)")
    parser.add_argument("--warmup", type=positive_int, default=10,
                        help="untimed calls of each engine first (default: %(default)s)")
    parser.add_argument("--rounds", type=positive_int, default=5,
                        help="alternating rounds of the two engines (default: %(default)s)")
    parser.add_argument("--calls", type=positive_int, default=20,
                        help="timed calls per engine and round (default: %(default)s)")
    parser.add_argument("--output", default=None, help="also write the JSON result here")
    args = parser.parse_args(argv)

    import numpy as np
    import onnxruntime as ort
    import tensorflow as tf
    import tf2onnx

    from electra_tf.convert.onnx_export import DEFAULT_OPSET, export_onnx

    load_before = load_average()
    work = tempfile.mkdtemp(prefix="onnx_latency_")
    try:
        saved_model, run_dir = build_export(work, args.model_size, args.vocab_size, args.seq_length,
                                           args.num_layers)
        onnx_path = export_onnx(run_dir, os.path.join(work, "discriminator.onnx"))
        rng = np.random.default_rng(0)
        shape = (args.batch, args.seq_length)
        feeds = {"input_ids": rng.integers(5, args.vocab_size, shape).astype(np.int32),
                 "input_mask": np.ones(shape, np.int32), "segment_ids": np.zeros(shape, np.int32)}
        signature = tf.saved_model.load(saved_model).signatures["serving_default"]
        tf_feeds = {k: tf.constant(v) for k, v in feeds.items()}
        sessions = {"onnxruntime": ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])}
        no_spin = ort.SessionOptions()
        no_spin.add_session_config_entry("session.intra_op.allow_spinning", "0")
        sessions["onnxruntime_no_spinning"] = ort.InferenceSession(
            onnx_path, no_spin, providers=["CPUExecutionProvider"])
        one = ort.SessionOptions()
        one.intra_op_num_threads = 1
        sessions["onnxruntime_1_thread"] = ort.InferenceSession(
            onnx_path, one, providers=["CPUExecutionProvider"])

        def run_tf():
            return signature(**tf_feeds)["replaced_probs"].numpy()

        def ort_runner(session):
            return lambda: session.run(["replaced_probs"], feeds)[0]

        engines = {"tensorflow_saved_model": run_tf}
        engines.update({name: ort_runner(session) for name, session in sessions.items()})
        difference = max(float(np.max(np.abs(run_tf() - fn()))) for fn in engines.values())
        times = {name: [] for name in engines}
        for fn in engines.values():
            for _ in range(args.warmup):
                fn()
        for _ in range(args.rounds):
            for name, fn in engines.items():
                for _ in range(args.calls):
                    start = time.perf_counter()
                    fn()
                    times[name].append(time.perf_counter() - start)
        sizes = {name: os.path.getsize(onnx_path) for name in sessions}
        sizes["tensorflow_saved_model"] = dir_size(saved_model)
        result = {
            "model": f"ELECTRA-{args.model_size} discriminator, random weights, vocab {args.vocab_size}"
                     + (f", {args.num_layers} layers" if args.num_layers else ""),
            "batch": args.batch, "seq_length": args.seq_length, "opset": DEFAULT_OPSET,
            "calls_per_engine": args.rounds * args.calls,
            "max_abs_difference_replaced_probs": difference,
            "engines": {name: {"median_ms": 1000 * statistics.median(t),
                               "p90_ms": 1000 * float(np.percentile(t, 90)),
                               "size_mb": sizes[name] / 1e6}
                        for name, t in times.items()},
            "versions": {"tensorflow": tf.__version__, "onnxruntime": ort.__version__,
                         "tf2onnx": tf2onnx.__version__, "python": platform.python_version()},
            "cpu": {"flags": cpu_flags(), "cores": os.cpu_count()},
            "load_average_before": load_before, "load_average_after": load_average(),
            "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    text = json.dumps(result, indent=1)
    print(text)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    return result


if __name__ == "__main__":
    main()
