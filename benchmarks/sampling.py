"""Benchmark: the generator's Gumbel-max sampling, one noise stream against the other.

Times `electra_tf.pretraining.sampling.sample_ids` (graph mode, float32 logits [batch, N, vocab],
per-example seeds) under each `kernel_settings.SAMPLING_RNG` choice in ONE process, calls alternating
(philox, hash, philox, hash, ...) so that load changes hit both alike, and prints the median and
minimum milliseconds per call. The training step's own A/B is `pretrain_step.py
--electra-tf-kernels xla/hash/philox,xla/hash/hash`; this isolates the sampler.

    python benchmarks/sampling.py                       # batch 32 and 128, ELECTRA-small shapes
    python benchmarks/sampling.py --batch 32 --calls 21
"""

from __future__ import annotations

import argparse
import os
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

from benchmarks.alternating import time_alternating  # noqa: E402
from benchmarks.cli_types import positive_int, positive_ints  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=positive_ints, default=[32, 128],
                        help="comma-separated batch sizes. Default: 32,128")
    parser.add_argument("--slots", type=positive_int, default=19,
                        help="masked slots per example N (ELECTRA-small at length 128: 19)")
    parser.add_argument("--vocab", type=positive_int, default=30522, help="vocab size. Default: 30522")
    parser.add_argument("--calls", type=positive_int, default=9,
                        help="timed calls per stream and batch size (after one untimed call). "
                             "Default: 9")
    args = parser.parse_args(argv)

    import tensorflow as tf

    from electra_tf.modeling import kernel_settings
    from electra_tf.pretraining import sampling, seeds

    print(f"tensorflow {tf.__version__}, load {os.getloadavg()[0]:.2f}")
    for batch in args.batch:
        logits = tf.random.stateless_normal([batch, args.slots, args.vocab], seed=[1, 2])
        example_seeds = seeds.example_seeds(tf.constant([1, 2], tf.int64), 0, batch,
                                            seeds.SAMPLING_SALT)
        functions = {}
        for rng in kernel_settings.SAMPLING_RNG_CHOICES:
            with kernel_settings.kernel_options(sampling_rng=rng):  # read when the function is traced
                functions[rng] = tf.function(lambda l, s: sampling.sample_ids(l, seeds=s))
                functions[rng](logits, example_seeds).numpy()
        calls = {rng: (lambda f=function: f(logits, example_seeds))
                 for rng, function in functions.items()}
        # warmup=0: each was called once above, under its own stream's option (read at tracing).
        times = time_alternating(calls, args.calls, warmup=0)
        for rng, seconds in times.items():
            values = sorted(1000 * t for t in seconds)
            print(f"batch {batch:4d}  {rng:7s} median {values[len(values) // 2]:7.1f} ms  "
                  f"min {values[0]:7.1f} ms")


if __name__ == "__main__":
    main()
