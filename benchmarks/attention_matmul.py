"""Benchmark: the attention's batched matmuls, TensorFlow's kernel (oneDNN on CPU) against XLA's.

The six [L x hs] / [L x L] products of one attention layer's forward and backward pass (scores
Q K^T, context P V, and the four gradient products, two of which read a transposed operand) and,
for reference, one dense matmul of the same FLOP count, each timed in ONE process, calls
alternating between the variants so that load changes hit all alike. Each call runs `--reps`
products on distinct inputs (distinct so that no graph optimisation can merge them) and returns
every output. Prints milliseconds per product and GFLOP/s (best call).

It answers one question of issue 19: would moving the attention products into an XLA cluster
(compiled together with the softmax) make them faster than TensorFlow's batched matmul?

    python benchmarks/attention_matmul.py                    # ELECTRA-small discriminator shapes
    python benchmarks/attention_matmul.py --dtype bfloat16 --batch 128
"""

from __future__ import annotations

import os
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

from benchmarks.alternating import (distinct_operands, product_parser,  # noqa: E402
                                    time_alternating)
from benchmarks.cli_types import positive_int  # noqa: E402


# name -> (left operand shape key, right operand shape key, transpose_a, transpose_b)
PRODUCTS = {
    "scores Q K^T": ("lh", "lh", False, True),
    "context P V": ("ll", "lh", False, False),
    "dP = dC V^T": ("lh", "lh", False, True),
    "dV = P^T dC": ("ll", "lh", True, False),
    "dQ = dS K": ("ll", "lh", False, False),
    "dK = dS^T Q": ("ll", "lh", True, False),
}


def main(argv=None):
    parser = product_parser(__doc__, reps=16)
    parser.add_argument("--heads", type=positive_int, default=4,
                        help="attention heads (ELECTRA-small discriminator: 4). Default: 4")
    parser.add_argument("--head-size", type=positive_int, default=64, help="hs. Default: 64")
    args = parser.parse_args(argv)

    import tensorflow as tf

    b, h, length, hs = args.batch, args.heads, args.seq_length, args.head_size
    dtype = tf.as_dtype(args.dtype)
    shapes = {"lh": [b, h, length, hs], "ll": [b, h, length, length]}

    def operands(key, salt):
        return distinct_operands(shapes[key], dtype, args.reps, salt)

    flops = 2 * b * h * length * length * hs  # every product above
    # The dense reference: [b*L, hs*h] x [hs*h, n] with the same FLOP count (a projection-like
    # matmul as the block's dense layers run it).
    rows, inner = b * length, h * hs
    cols = max(1, flops // (2 * rows * inner))
    dense_operands = list(zip(distinct_operands([rows, inner], dtype, args.reps, 9),
                              distinct_operands([inner, cols], dtype, args.reps, 10)))
    dense_flops = 2 * rows * inner * cols

    variants = {}
    for index, (name, (left, right, ta, tb)) in enumerate(PRODUCTS.items()):
        xs, ys = operands(left, 2 * index), operands(right, 2 * index + 1)

        def run(xs=xs, ys=ys, ta=ta, tb=tb):
            return [tf.matmul(x, y, transpose_a=ta, transpose_b=tb) for x, y in zip(xs, ys)]

        variants[name] = (tf.function(run), flops)
        variants[name + " [XLA]"] = (tf.function(run, jit_compile=True), flops)

    def run_dense():
        return [tf.matmul(x, y) for x, y in dense_operands]

    variants["dense reference"] = (tf.function(run_dense), dense_flops)

    times = time_alternating({name: function for name, (function, _) in variants.items()},
                             args.calls)

    print(f"tensorflow {tf.__version__}, {args.dtype}, batch {b}, heads {h}, L {length}, hs {hs}, "
          f"dense reference [{rows} x {inner}] x [{inner} x {cols}], load {os.getloadavg()[0]:.2f}")
    print(f"{'product':24s} {'ms/product':>10s} {'GFLOP/s':>8s}")
    for name, (_, count) in variants.items():
        best = min(times[name]) / args.reps
        print(f"{name:24s} {best * 1e3:10.3f} {count / best / 1e9:8.1f}")


if __name__ == "__main__":
    main()
