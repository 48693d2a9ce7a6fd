"""Benchmark: a dense layer's input gradient dy @ W^T, TensorFlow's MatMul gradient vs an einsum.

For each dense product of the ELECTRA-small transformer block (discriminator and generator:
QKV, attention output, FFN in, FFN out; rows = batch x seq tokens), times in ONE process, calls
alternating so that load changes hit all variants alike:

  dx matmul   tf.matmul(dy, W, transpose_b=True)   what TensorFlow's MatMul gradient runs
  dx einsum   tf.einsum("ij,kj->ik", dy, W)        `kernel_settings.DENSE_GRAD = "einsum"` (the default)
  dW          tf.matmul(x, dy, transpose_a=True)   the kernel gradient (the same either way)
  forward     tf.matmul(x, W)                      the forward product, for reference

Each call runs `--reps` products on distinct inputs (so no graph optimisation can merge them).
Prints milliseconds per product and GFLOP/s (best call), and per layer kind the time the einsum
saves per training step (both encoders, all layers). It answers one question of issue 19: is
the transposed-operand MatMul that TensorFlow's gradient uses slower than the same product as
an einsum, on the CPU at hand?

    python benchmarks/dense_grad.py                       # float32, batch 32
    python benchmarks/dense_grad.py --dtype bfloat16 --batch 128
"""

from __future__ import annotations

import os
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

from benchmarks.alternating import (distinct_operands, product_parser,  # noqa: E402
                                    time_alternating)

# ELECTRA-small (official sizes): name -> (in, out, layers) per dense product of one block.
# Discriminator hidden 256, FFN 1024, 12 layers; generator hidden 64, FFN 256, 12 layers.
LAYERS = {
    "disc QKV": (256, 768, 12),
    "disc attention output": (256, 256, 12),
    "disc FFN in": (256, 1024, 12),
    "disc FFN out": (1024, 256, 12),
    "gen QKV": (64, 192, 12),
    "gen attention output": (64, 64, 12),
    "gen FFN in": (64, 256, 12),
    "gen FFN out": (256, 64, 12),
}
FORMS = ("dx matmul", "dx einsum", "dW", "forward")


def main(argv=None):
    args = product_parser(__doc__, reps=4).parse_args(argv)

    import tensorflow as tf

    rows = args.batch * args.seq_length
    dtype = tf.as_dtype(args.dtype)

    def operands(shape, salt):
        return distinct_operands(shape, dtype, args.reps, salt)

    variants = {}
    for index, (name, (fan_in, fan_out, _)) in enumerate(LAYERS.items()):
        xs = operands([rows, fan_in], 3 * index)
        kernels = operands([fan_in, fan_out], 3 * index + 1)
        dys = operands([rows, fan_out], 3 * index + 2)
        products = {  # default arguments bind this layer's operands (not the loop's last)
            "dx matmul": lambda dys=dys, ws=kernels: [tf.matmul(d, w, transpose_b=True)
                                                      for d, w in zip(dys, ws)],
            "dx einsum": lambda dys=dys, ws=kernels: [tf.einsum("ij,kj->ik", d, w)
                                                      for d, w in zip(dys, ws)],
            "dW": lambda xs=xs, dys=dys: [tf.matmul(x, d, transpose_a=True)
                                          for x, d in zip(xs, dys)],
            "forward": lambda xs=xs, ws=kernels: [tf.matmul(x, w) for x, w in zip(xs, ws)],
        }
        for form, run in products.items():
            variants[(name, form)] = tf.function(run)

    times = time_alternating(variants, args.calls)

    print(f"tensorflow {tf.__version__}, {args.dtype}, rows {rows} (batch {args.batch} x L "
          f"{args.seq_length}), load {os.getloadavg()[0]:.2f}")
    print(f"{'layer':24s} {'product':10s} {'ms/product':>10s} {'GFLOP/s':>8s}")
    saved = 0.0
    for name, (fan_in, fan_out, layers) in LAYERS.items():
        flops = 2 * rows * fan_in * fan_out
        best = {}
        for form in FORMS:
            best[form] = min(times[(name, form)]) / args.reps
            print(f"{name:24s} {form:10s} {best[form] * 1e3:10.3f} "
                  f"{flops / best[form] / 1e9:8.1f}")
        saved += layers * (best["dx matmul"] - best["dx einsum"])
    print(f"dx einsum saves {saved * 1e3:.1f} ms per training step (all layers of both encoders; "
          f"negative: slower)")


if __name__ == "__main__":
    main()
