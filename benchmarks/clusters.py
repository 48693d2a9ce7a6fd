"""Benchmark: each XLA cluster of the transformer block (`electra_tf.modeling.xla_clusters`),
forward and backward, at ELECTRA-small's shapes.

The TensorFlow profiler shows the clusters' total time but not which cluster it goes to (a
cluster's run is one anonymous `CpuExecutable` event). This times each compiled function on its
own, in ONE process with the calls alternating (`benchmarks/alternating.py`), every call running
`--reps` clusters on distinct inputs, and prints milliseconds per cluster call (best call) and
what all layers of both encoders spend per training step. Dropout is on (rate 0.1, the hash
stream, the default), as in pretraining.

    python benchmarks/clusters.py                      # batch 32, float32
    python benchmarks/clusters.py --dtype bfloat16     # inputs and outputs in bf16 (mixed)

It is how the three backward-pass rewrites of issue 19's fourth run were found and checked: XLA's
CPU backend (TensorFlow 2.21) writes a reduction's operand to memory instead of fusing it into
the reduction, so the backward clusters that reduced products of their inputs made extra passes.
"""

from __future__ import annotations

import os
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

from benchmarks.alternating import (distinct_operands, product_parser,  # noqa: E402
                                    time_alternating)

# ELECTRA-small (official sizes): encoder -> (hidden, heads, FFN, layers).
ENCODERS = {"disc": (256, 4, 1024, 12), "gen": (64, 1, 256, 12)}
# cluster -> calls per layer (the bias + dropout + residual + LayerNorm cluster runs twice: after
# the attention output and after the FFN).
CLUSTERS = {"split_heads": 1, "attention_probs": 1, "bias_dropout_residual_norm": 2,
            "bias_gelu": 1}
PASSES = ("forward", "backward")
RATE = 0.1


def _cases(tf, clusters, batch, length, hidden, heads, ffn, dtype, reps, salt):
    """{(cluster, pass): function of one operand index} for one encoder's shapes."""
    rows, head_size = batch * length, hidden // heads
    static = {"rate": RATE, "kind": "hash"}
    noise = tf.constant([3, 7], tf.int32)

    def operands(shape, index, operand_dtype=dtype):
        return distinct_operands(shape, operand_dtype, reps, 16 * salt + index)

    qkv, heads_grad = operands([batch, length, 3 * hidden], 0), operands(
        [batch, heads, length, head_size], 1)
    qkv_bias = operands([3 * hidden], 2, tf.float32)[0]
    scores = operands([batch, heads, length, length], 3)
    mask_bias = tf.zeros([batch, 1, 1, length])
    forward_attention = [clusters._attention_forward(s, mask_bias, noise, **static) for s in scores]
    h, residual = operands([rows, hidden], 4), operands([rows, hidden], 5)
    bias, gamma, beta = (operands([hidden], 6 + i, tf.float32)[0] for i in range(3))
    normed = [clusters._bdrn_forward(h[i], bias, residual[i], gamma, beta, noise, epsilon=1e-12,
                                     **static) for i in range(reps)]
    inner, inner_grad = operands([rows, ffn], 9), operands([rows, ffn], 10)
    inner_bias = operands([ffn], 11, tf.float32)[0]
    scale = head_size ** -0.5
    return {
        ("split_heads", "forward"): lambda i: clusters._split_heads_forward(
            qkv[i], qkv_bias, heads=heads, scale=scale),
        ("split_heads", "backward"): lambda i: clusters._split_heads_backward(
            heads_grad[i], heads_grad[(i + 1) % reps], heads_grad[(i + 2) % reps],
            scale=scale),
        ("attention_probs", "forward"): lambda i: clusters._attention_forward(
            scores[i], mask_bias, noise, **static),
        ("attention_probs", "backward"): lambda i: clusters._attention_backward(
            scores[(i + 1) % reps], *forward_attention[i]),
        ("bias_dropout_residual_norm", "forward"): lambda i: clusters._bdrn_forward(
            h[i], bias, residual[i], gamma, beta, noise, epsilon=1e-12, **static),
        ("bias_dropout_residual_norm", "backward"): lambda i: clusters._bdrn_backward(
            residual[(i + 1) % reps], normed[i][1], normed[i][2], gamma, noise, dtype=dtype.name,
            **static),
        ("bias_gelu", "forward"): lambda i: clusters._bias_gelu_forward(inner[i], inner_bias),
        ("bias_gelu", "backward"): lambda i: clusters._bias_gelu_backward(
            inner_grad[i], inner[i], inner_bias),
    }


def main(argv=None):
    args = product_parser(__doc__, reps=4).parse_args(argv)

    import tensorflow as tf

    from electra_tf.modeling import xla_clusters

    dtype = tf.as_dtype(args.dtype)
    variants = {}
    for salt, (encoder, (hidden, heads, ffn, _)) in enumerate(ENCODERS.items()):
        cases = _cases(tf, xla_clusters, args.batch, args.seq_length, hidden, heads, ffn, dtype,
                       args.reps, salt)
        for key, call in cases.items():
            def run(call=call):  # one cluster call per distinct operand set
                return [tf.nest.flatten(call(i)) for i in range(args.reps)]
            variants[(encoder,) + key] = tf.function(run, autograph=False)

    times = time_alternating(variants, args.calls)

    print(f"tensorflow {tf.__version__}, {args.dtype}, batch {args.batch} x L "
          f"{args.seq_length}, dropout {RATE} (hash), load {os.getloadavg()[0]:.2f}")
    print(f"{'encoder':8s} {'cluster':28s} {'pass':9s} {'ms/call':>8s} {'ms/step':>8s}")
    total = 0.0
    for encoder, (_, _, _, layers) in ENCODERS.items():
        for cluster, per_layer in CLUSTERS.items():
            for step_pass in PASSES:
                best = min(times[(encoder, cluster, step_pass)]) / args.reps
                per_step = best * per_layer * layers
                total += per_step
                print(f"{encoder:8s} {cluster:28s} {step_pass:9s} {best * 1e3:8.3f} "
                      f"{per_step * 1e3:8.1f}")
    print(f"all block clusters: {total * 1e3:.1f} ms per training step (both encoders, "
          f"{sum(e[3] for e in ENCODERS.values())} layers; best calls)")


if __name__ == "__main__":
    main()
