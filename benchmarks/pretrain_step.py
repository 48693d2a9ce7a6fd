"""Benchmark: the ELECTRA-small pretraining step, electra-tf vs the PyTorch peer vs naive Keras.

Measures, in one run and on the same machine, for ELECTRA-small (official sizes: discriminator
hidden 256 x 12 layers, 4 heads, FFN 1024, embeddings 128; generator 1/4 width: hidden 64, 1 head,
FFN 256; vocab 30522), seq 128, 19 masked slots per sequence (official
int((0.15 + 0.005) * 128)), at each batch size and precision:

  electra_tf   electra-tf's real training step: `Trainer` (the code `run_pretraining.py` runs) on
               TFRecord shards written into a temp dir by `tfrecord_io`, with its input pipeline,
               its compiled loop of `iterations_per_loop` steps, per-step metrics and optimizer.
               The Trainer's own threading default applies (inter_op_threads: 1 op at a time
               on a single-device CPU run); compare with TensorFlow's default through
               --electra-tf-hparams '{"inter_op_threads": 0}'.
  torch        Hugging Face transformers' PyTorch `ElectraForMaskedLM` + `ElectraForPreTraining`,
               wired with the same objective (dynamic masking of 15%, 85% [MASK] / 15% kept, MLM
               head at the masked positions only, Gumbel-max sampling, the whole embedding block
               shared as the official, loss MLM + 50 * RTD, AdamW with the official exclusions,
               global-norm clipping at 1), torch threads = cores, bf16 via `torch.autocast`.
  torch_compile  the same with the generator's and discriminator's forward passes (and so their
               backward passes) through `torch.compile` (TorchInductor: fused elementwise
               kernels, oneDNN/MKL matmuls); compilation falls in the first call.
  keras_naive  a straightforward Keras 3 step built from two keras-hub `ElectraBackbone`s and a
               tied `MaskedLMHead` (own embeddings per backbone), one `tf.function` per step,
               keras AdamW: what a Keras user would write first.

electra-tf's kernels (electra_tf.modeling.fused: op-by-op TensorFlow kernels or XLA-compiled
elementwise clusters; keras' Philox dropout draws or counter-based hash bits; per-example Philox
Gumbel noise or the hash fused with the sampling scores; the dense layers' input gradient as
TensorFlow's MatMul gradient or an einsum) can be compared A/B in one process with e.g.
--electra-tf-kernels tf/philox/philox,xla/hash/hash/matmul,xla/hash/hash/einsum: one traced
training loop per variant over the same model and input, windows alternating.

Each implementation x batch x dtype runs in its own subprocess (so peak RSS does not mix):
the first call (trace / graph build + 1 step) is timed separately, then `--warmup` windows, then
`--windows` timed windows of `--steps` steps each; throughput is the median window. The matmul
peak of the machine (float32 and bfloat16; TensorFlow/oneDNN and PyTorch, square and model
shapes, best median) is measured in its own subprocess in the same run, and model FLOPs
utilisation (MFU) is reported against it:

    FLOPs/step = 6 * tokens * (matmul weights + attention) + 6 * masked * MLM head
    (weights: per encoder, layers * (4 H^2 + 2 H I) + E H projection, + the RTD head H^2 + H;
     attention: layers * 2 * seq * H per token for QK^T and AV; MLM head: Hg E + E V per masked
     slot; embedding lookups are not FLOPs) = ~288 GFLOP per 32 sequences.

    python benchmarks/pretrain_step.py                                   # everything (~1 h)
    python benchmarks/pretrain_step.py --impl electra_tf,torch --batch 32 --dtype float32 \\
        --steps 3 --windows 2                                            # quick look

Writes a table to stdout, JSON to --output and a bar chart (PNG) to --chart.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

IMPLEMENTATIONS = ("electra_tf", "electra_tf_jax", "electra_tf_torch", "torch", "torch_compile",
                   "keras_naive")
# electra-tf on the other Keras backends: ElectraPretrainer.fit() under KERAS_BACKEND (issue 32).
KERAS_BACKEND_WORKERS = {"electra_tf_jax": "jax", "electra_tf_torch": "torch"}
PEERS = ("torch", "torch_compile")  # the rows electra-tf's target ratio is measured against
DTYPES = ("float32", "bfloat16")
IMPL_LABELS = {"electra_tf": "electra-tf", "electra_tf_jax": "electra-tf on JAX (fit)",
               "electra_tf_torch": "electra-tf on PyTorch (fit)",
               "torch": "HF transformers (PyTorch)",
               "torch_compile": "HF transformers + torch.compile",
               "keras_naive": "naive Keras 3 (keras-hub)"}

# ELECTRA-small, official sizes (configure_pretraining.py / training_utils.get_bert_config).
SEQ_LENGTH = 128
VOCAB_SIZE = 30522
EMBEDDING_SIZE = 128
DISCRIMINATOR = {"hidden_size": 256, "num_hidden_layers": 12, "num_attention_heads": 4,
                 "intermediate_size": 1024}
# generator_hidden_size = 0.25: hidden 64, heads max(1, 64 // 64), FFN 4 * 64.
GENERATOR = {"hidden_size": 64, "num_hidden_layers": 12, "num_attention_heads": 1,
             "intermediate_size": 256}
MASK_PROB = 0.15
MAX_PREDICTIONS = int((MASK_PROB + 0.005) * SEQ_LENGTH)  # official derivation: 19
DISC_WEIGHT = 50.0
LEARNING_RATE = 5e-4
NUM_WARMUP_STEPS = 10000  # official; the rate stays tiny, so no run diverges mid-benchmark
SPECIAL = {"pad_id": 0, "unk_id": 100, "cls_id": 101, "sep_id": 102, "mask_id": 103}  # BERT ids


# ------------------------------------------------------------------------------------------------
# FLOPs
# ------------------------------------------------------------------------------------------------
def _encoder_macs_per_token(hidden, layers, intermediate, seq_length=SEQ_LENGTH,
                            embedding_size=EMBEDDING_SIZE):
    weights = layers * (4 * hidden * hidden + 2 * hidden * intermediate)
    if embedding_size != hidden:
        weights += embedding_size * hidden  # embeddings_project
    attention = layers * 2 * seq_length * hidden  # QK^T and AV
    return weights, attention


def step_flops(batch_size, seq_length=SEQ_LENGTH, masked=MAX_PREDICTIONS):
    """Model FLOPs of one training step (forward + backward = 3x forward = 6 per MAC)."""
    d = DISCRIMINATOR
    g = GENERATOR
    dw, da = _encoder_macs_per_token(d["hidden_size"], d["num_hidden_layers"],
                                     d["intermediate_size"], seq_length)
    gw, ga = _encoder_macs_per_token(g["hidden_size"], g["num_hidden_layers"],
                                     g["intermediate_size"], seq_length)
    rtd_head = d["hidden_size"] * d["hidden_size"] + d["hidden_size"]
    mlm_head = g["hidden_size"] * EMBEDDING_SIZE + EMBEDDING_SIZE * VOCAB_SIZE
    tokens = batch_size * seq_length
    per_token = dw + da + gw + ga + rtd_head
    return 6 * tokens * per_token + 6 * batch_size * masked * mlm_head


# ------------------------------------------------------------------------------------------------
# Data
# ------------------------------------------------------------------------------------------------
def make_vocab_tokens(vocab_size=VOCAB_SIZE):
    from electra_tf.vocab import REQUIRED_TOKENS

    tokens = [f"[unused{i}]" for i in range(vocab_size)]
    for name, token in zip(("pad_id", "unk_id", "cls_id", "sep_id", "mask_id"), REQUIRED_TOKENS):
        tokens[SPECIAL[name]] = token
    return tokens


def random_segments(rng, num_examples, vocab_size=VOCAB_SIZE, seq_length=SEQ_LENGTH):
    """Full-length packed examples (as the builder writes for a real corpus): two segments."""
    low = 1000  # ordinary word-piece ids, no special tokens
    out = []
    for _ in range(num_examples):
        body = rng.integers(low, vocab_size, seq_length - 3).tolist()
        cut = int(rng.integers(8, seq_length - 11))
        out.append((body[:cut], body[cut:]))
    return out


def write_dataset(data_dir, num_shards=4, examples_per_shard=1024, seed=0,
                  vocab_size=VOCAB_SIZE, seq_length=SEQ_LENGTH):
    """vocab.txt + pretrain_tfrecords/{shards, manifest.json} in the builder's layout (written
    without TensorFlow: `record_framing.RecordWriter` writes what `tf.io.TFRecordWriter` does)."""
    import numpy as np

    from electra_tf.data.records import tfrecord_io
    from electra_tf.data.records.record_framing import RecordWriter
    from electra_tf.data.build.example_builder import PackedExample
    from electra_tf.vocab import file_sha256

    vocab_path = os.path.join(data_dir, "vocab.txt")
    tokens = make_vocab_tokens(vocab_size)
    with open(vocab_path, "w", encoding="utf-8") as f:
        f.write("\n".join(tokens) + "\n")
    out = os.path.join(data_dir, "pretrain_tfrecords")
    os.makedirs(out, exist_ok=True)
    serializer = tfrecord_io.ExampleSerializer(seq_length, SPECIAL["cls_id"], SPECIAL["sep_id"])
    rng = np.random.default_rng(seed)
    splits = {}
    for split, prefix, count in (("train", tfrecord_io.TRAIN_PREFIX, num_shards),
                                 ("eval", tfrecord_io.EVAL_PREFIX, 1)):
        shards = []
        for i in range(count):
            name = tfrecord_io.shard_name(prefix, i, count)
            path = os.path.join(out, name)
            examples = [PackedExample(a, b, 0) for a, b in
                        random_segments(rng, examples_per_shard, vocab_size, seq_length)]
            with RecordWriter(path) as writer:
                for record in serializer.serialize(examples):
                    writer.write(record)
            shards.append({"file": name, "examples": examples_per_shard,
                           "bytes": os.path.getsize(path)})
        splits[split] = {"examples": examples_per_shard * count, "shards": shards}
    manifest = {
        "format_version": tfrecord_io.MANIFEST_FORMAT_VERSION,
        "features": {n: ["int64", seq_length] for n in tfrecord_io.FEATURE_NAMES},
        "max_seq_length": seq_length,
        "vocab": {"path": vocab_path, "sha256": file_sha256(vocab_path), "size": len(tokens)},
        "do_lower_case": True, "strip_accents": True, "splits": splits,
        "note": "random ids written by benchmarks/pretrain_step.py",
    }
    with open(os.path.join(out, tfrecord_io.MANIFEST_NAME), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1)
    return data_dir


def numpy_batches(batch_size, count, seed=0, vocab_size=VOCAB_SIZE, seq_length=SEQ_LENGTH):
    """`count` batches of the same kind of examples, as numpy int arrays (for torch)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(count):
        ids = np.zeros([batch_size, seq_length], np.int64)
        segment = np.zeros([batch_size, seq_length], np.int64)
        for b, (first, second) in enumerate(random_segments(rng, batch_size, vocab_size,
                                                            seq_length)):
            row = [SPECIAL["cls_id"]] + first + [SPECIAL["sep_id"]] + second + [SPECIAL["sep_id"]]
            ids[b] = row
            segment[b, len(first) + 2:] = 1
        batches.append({"input_ids": ids, "input_mask": np.ones_like(ids), "segment_ids": segment})
    return batches


# ------------------------------------------------------------------------------------------------
# Workers (one per subprocess)
# ------------------------------------------------------------------------------------------------
def _timed_windows(run_window, steps, warmup, windows):
    return _interleaved_windows({"": run_window}, steps, warmup, windows)[""]


def _interleaved_windows(run_windows, steps, warmup, windows):
    """Times `windows` windows of `steps` steps of every variant, round-robin (A, B, A, B, ...),
    after `warmup` untimed rounds, so that load changes on a shared machine hit every variant
    alike. Returns {variant: [seconds per window]}."""
    times = {name: [] for name in run_windows}
    for w in range(warmup + windows):
        for name, run_window in run_windows.items():
            start = time.perf_counter()
            run_window(steps)
            elapsed = time.perf_counter() - start
            if w >= warmup:
                times[name].append(elapsed)
    return times


def parse_kernel_variant(spec):
    """"xla/hash/hash/einsum" -> {"kernels": "xla", "dropout_rng": "hash", "sampling_rng": "hash",
    "dense_grad": "einsum"} (electra_tf.modeling.fused); the parts after the second may be left
    out (the library defaults)."""
    from electra_tf.modeling import kernel_settings

    parts = spec.split("/")
    keys = ("kernels", "dropout_rng", "sampling_rng", "dense_grad")
    choices = (kernel_settings.KERNEL_CHOICES, kernel_settings.DROPOUT_RNG_CHOICES, kernel_settings.SAMPLING_RNG_CHOICES,
               kernel_settings.DENSE_GRAD_CHOICES)
    if not 2 <= len(parts) <= len(keys) or any(p not in c for p, c in zip(parts, choices)):
        raise argparse.ArgumentTypeError(
            f"kernel variant {spec!r}: expected KERNELS/DROPOUT_RNG[/SAMPLING_RNG[/DENSE_GRAD]] with "
            + ", ".join(f"{k.upper()} in {'|'.join(c)}" for k, c in zip(keys, choices))
            + ", e.g. xla/hash/hash/einsum")
    return dict(zip(keys, parts))


def worker_electra_tf(args):
    import electra_tf  # noqa: F401  (first: its oneDNN default is read when TensorFlow loads)
    import tensorflow as tf

    from electra_tf.config import PretrainingConfig
    from electra_tf.modeling import kernel_settings
    from electra_tf.training.tf import train_step
    from electra_tf.training.tf.trainer import Trainer

    model_dir = tempfile.mkdtemp(prefix="electra_tf_bench_model_")
    hparams = {
        "model_size": "small", "vocab_size": VOCAB_SIZE, "max_seq_length": SEQ_LENGTH,
        "train_batch_size": args.batch, "iterations_per_loop": args.steps,
        "mixed_precision": "float32" if args.dtype == "float32" else "mixed_bfloat16",
        "do_export": False, "num_train_steps": 10 ** 7, "save_checkpoints_steps": 10 ** 7,
        "num_warmup_steps": NUM_WARMUP_STEPS, "strategy": "one_device", "model_dir": model_dir,
    }
    hparams.update(json.loads(args.electra_tf_hparams or "{}"))
    # Kernel variants (A/B in this one process): each gets its own traced training loop over the
    # same model, optimizer and input iterator; their windows alternate. None = the defaults.
    variants = [v for v in (args.electra_tf_kernels or "").split(",") if v] or [None]
    try:
        config = PretrainingConfig.create("bench", args.data_dir, hparams)
        start = time.perf_counter()
        trainer = Trainer(config)
        build_seconds = time.perf_counter() - start
        iterator = trainer.train_iterator
        losses = {}
        first = {}
        run_windows = {}

        def make_run_window(name, loop):
            def run_window(num_steps):
                trainer.metrics.reset_state()
                done, history = loop(iterator, tf.constant(num_steps))
                losses[name].append(float(history["total_loss"][-1]))
                if int(done) != num_steps:
                    raise RuntimeError("non-finite loss in the benchmark run")
            return run_window

        for variant in variants:
            name = variant or (f"{kernel_settings.KERNELS}/{kernel_settings.DROPOUT_RNG}/{kernel_settings.SAMPLING_RNG}/"
                               f"{kernel_settings.DENSE_GRAD}")
            options = parse_kernel_variant(variant) if variant else {}
            losses[name] = []
            with kernel_settings.kernel_options(**options):
                # The loop Trainer.train() runs (one compiled call per `iterations_per_loop`
                # steps), called directly so that no checkpoint or summary write lands in a timed
                # window; traced (with these kernel options) by its first call.
                run_windows[name] = make_run_window(
                    name, train_step.make_train_loop(trainer._step_context()))
                start = time.perf_counter()
                run_windows[name](1)
                first[name] = time.perf_counter() - start
        load_start = os.getloadavg()
        times = _interleaved_windows(run_windows, args.steps, args.warmup, args.windows)
        load_end = os.getloadavg()
        profiles = {}
        if args.profile_dir:
            for name, run_window in run_windows.items():
                directory = os.path.join(args.profile_dir, f"{args.batch}_{args.dtype}_"
                                         + name.replace("/", "_"))
                tf.profiler.experimental.start(directory)
                run_window(args.steps)
                tf.profiler.experimental.stop()
                profiles[name] = dict(profile_summary(directory), steps=args.steps,
                                      load_average=os.getloadavg())
        import keras
        return {"build_seconds": build_seconds,
                "variants": {name: {"first_call_seconds": first[name],
                                    "window_seconds": times[name], "losses": losses[name],
                                    **({"profile": profiles[name]} if name in profiles else {})}
                             for name in run_windows},
                "load_average_windows": [load_start, load_end],
                "versions": {"tensorflow": tf.__version__, "keras": keras.__version__},
                "inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads(),
                "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads()}
    finally:
        shutil.rmtree(model_dir, ignore_errors=True)


def worker_torch(args):
    import torch
    import transformers

    from benchmarks.torch_electra import TorchElectra

    peer = TorchElectra(DISCRIMINATOR, GENERATOR, vocab_size=VOCAB_SIZE,
                        embedding_size=EMBEDDING_SIZE, special=SPECIAL,
                        max_predictions=MAX_PREDICTIONS, learning_rate=LEARNING_RATE,
                        num_warmup_steps=NUM_WARMUP_STEPS, dtype=args.dtype,
                        mask_prob=MASK_PROB, disc_weight=DISC_WEIGHT,
                        compile=args.worker == "torch_compile")
    batches = [{k: torch.from_numpy(v) for k, v in b.items()}
               for b in numpy_batches(args.batch, 8, seed=1)]
    counter = [0]
    losses = []

    def run_window(num_steps):
        for _ in range(num_steps):
            out = peer.step(batches[counter[0] % len(batches)])
            counter[0] += 1
        losses.append(float(out["loss"]))

    start = time.perf_counter()
    run_window(1)
    first = time.perf_counter() - start
    load_start = os.getloadavg()
    times = _timed_windows(run_window, args.steps, args.warmup, args.windows)
    return {"first_call_seconds": first, "window_seconds": times, "losses": losses,
            "load_average_windows": [load_start, os.getloadavg()],
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
            "torch_threads": torch.get_num_threads()}


def worker_electra_tf_backend(args):
    """electra-tf's `ElectraPretrainer.fit()` on JAX or PyTorch (KERAS_BACKEND set by `spawn`):
    the same model, objective and official AdamW, NumPy batches; each window is one `fit()`
    call of `steps` batches (JAX: the jitted step traced once, by the first call)."""
    import keras
    import numpy as np

    from electra_tf.config import PretrainingConfig
    from electra_tf.training.optimization import create_optimizer
    from electra_tf.training.pretrainer import ElectraPretrainer
    from electra_tf.vocab import SpecialTokens

    config = PretrainingConfig.create("bench", "unused", {
        "model_size": "small", "vocab_size": VOCAB_SIZE, "max_seq_length": SEQ_LENGTH,
        "train_batch_size": args.batch, "num_warmup_steps": NUM_WARMUP_STEPS,
        "mixed_precision": "float32" if args.dtype == "float32" else "mixed_bfloat16"})
    keras.mixed_precision.set_global_policy(config.mixed_precision)
    keras.utils.set_random_seed(0)
    start = time.perf_counter()
    model = ElectraPretrainer.from_pretraining_config(config, SpecialTokens(**SPECIAL))
    model.compile(optimizer=create_optimizer(config).optimizer)
    build_seconds = time.perf_counter() - start
    pool = numpy_batches(args.batch, 8, seed=1)
    data = {k: np.concatenate([b[k] for b in pool]).astype("int32") for k in pool[0]}
    counter = [0]
    losses = []

    def run_window(num_steps):
        rows = [(counter[0] + i) % len(pool) for i in range(num_steps)]
        counter[0] += num_steps
        window = {k: np.concatenate([v[r * args.batch:(r + 1) * args.batch] for r in rows])
                  for k, v in data.items()}
        history = model.fit(window, batch_size=args.batch, epochs=1, shuffle=False, verbose=0)
        losses.append(float(history.history["loss"][-1]))

    start = time.perf_counter()
    run_window(1)
    first = time.perf_counter() - start
    load_start = os.getloadavg()
    times = _timed_windows(run_window, args.steps, args.warmup, args.windows)
    versions = {"keras": keras.__version__, "backend": keras.backend.backend()}
    if versions["backend"] == "jax":
        import jax

        versions["jax"] = jax.__version__
    else:
        import torch

        versions["torch"] = torch.__version__
    return {"build_seconds": build_seconds, "first_call_seconds": first, "window_seconds": times,
            "losses": losses, "load_average_windows": [load_start, os.getloadavg()],
            "versions": versions}


def worker_keras_naive(args):
    import keras
    import keras_hub
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    if args.dtype == "bfloat16":
        keras.mixed_precision.set_global_policy("mixed_bfloat16")

    def backbone(sizes, name):
        return keras_hub.models.ElectraBackbone(
            vocab_size=VOCAB_SIZE, num_layers=sizes["num_hidden_layers"],
            num_heads=sizes["num_attention_heads"], hidden_dim=sizes["hidden_size"],
            embedding_dim=EMBEDDING_SIZE, intermediate_dim=sizes["intermediate_size"],
            dropout=0.1, max_sequence_length=512, name=name)

    generator = backbone(GENERATOR, "generator")
    discriminator = backbone(DISCRIMINATOR, "discriminator")
    mlm_head = keras_hub.layers.MaskedLMHead(
        vocabulary_size=VOCAB_SIZE, token_embedding=generator.token_embedding,
        intermediate_activation="gelu", name="mlm_head")
    rtd_dense = keras.layers.Dense(DISCRIMINATOR["hidden_size"], activation="gelu")
    rtd_out = keras.layers.Dense(1)
    mlm_head.build((None, None, GENERATOR["hidden_size"]))
    rtd_dense.build((None, None, DISCRIMINATOR["hidden_size"]))
    rtd_out.build((None, None, DISCRIMINATOR["hidden_size"]))
    variables = (generator.trainable_variables + discriminator.trainable_variables
                 + mlm_head.trainable_variables + rtd_dense.trainable_variables
                 + rtd_out.trainable_variables)
    schedule = lambda step: LEARNING_RATE * tf.minimum(1.0, tf.cast(step, tf.float32) / NUM_WARMUP_STEPS)  # noqa: E731
    optimizer = keras.optimizers.AdamW(learning_rate=LEARNING_RATE, weight_decay=0.01,
                                       epsilon=1e-6, global_clipnorm=1.0)
    optimizer.exclude_from_weight_decay(var_names=["gamma", "beta", "bias"])
    optimizer.build(variables)
    mask_id, cls_id, sep_id = SPECIAL["mask_id"], SPECIAL["cls_id"], SPECIAL["sep_id"]

    @tf.function
    def train_step(input_ids, input_mask, segment_ids):
        batch = tf.shape(input_ids)[0]
        candidates = (tf.cast(input_mask, tf.bool) & (input_ids != cls_id)
                      & (input_ids != sep_id))
        count = tf.clip_by_value(tf.round(tf.reduce_sum(tf.cast(input_mask, tf.float32), -1)
                                          * MASK_PROB), 1, MAX_PREDICTIONS)
        weights = tf.sequence_mask(tf.cast(count, tf.int32), MAX_PREDICTIONS, tf.float32)
        logits_c = tf.math.log(tf.cast(candidates, tf.float32))
        positions = tf.random.categorical(logits_c, MAX_PREDICTIONS, dtype=tf.int32)
        positions = positions * tf.cast(weights, tf.int32)
        labels = tf.gather(input_ids, positions, batch_dims=1)
        to_mask = (tf.random.uniform(tf.shape(positions)) < 0.85) & (weights > 0)
        rows = tf.broadcast_to(tf.range(batch)[:, None], tf.shape(positions))
        index = tf.stack([rows, positions], -1)
        masked = tf.tensor_scatter_nd_update(
            input_ids, tf.boolean_mask(index, to_mask),
            tf.fill([tf.reduce_sum(tf.cast(to_mask, tf.int32))], mask_id))
        with tf.GradientTape() as tape:
            hidden = generator({"token_ids": masked, "segment_ids": segment_ids,
                                "padding_mask": input_mask}, training=True)["sequence_output"]
            logits = tf.cast(mlm_head(hidden, mask_positions=positions), tf.float32)
            nll = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
            mlm_loss = tf.reduce_sum(nll * weights) / (tf.reduce_sum(weights) + 1e-6)
            u = tf.random.uniform(tf.shape(logits))
            sampled = tf.argmax(tf.stop_gradient(logits) - tf.math.log(-tf.math.log(u + 1e-9) + 1e-9),
                                -1, output_type=tf.int32)
            used = (weights > 0) & (positions > 0)
            fake = tf.tensor_scatter_nd_update(input_ids, tf.boolean_mask(index, used),
                                               tf.boolean_mask(sampled, used))
            is_fake = tf.cast(fake != input_ids, tf.float32)
            d_hidden = discriminator({"token_ids": fake, "segment_ids": segment_ids,
                                      "padding_mask": input_mask}, training=True)["sequence_output"]
            d_logits = tf.cast(tf.squeeze(rtd_out(rtd_dense(d_hidden)), -1), tf.float32)
            mask_f = tf.cast(input_mask, tf.float32)
            rtd = tf.nn.sigmoid_cross_entropy_with_logits(labels=is_fake, logits=d_logits)
            disc_loss = tf.reduce_sum(rtd * mask_f) / (tf.reduce_sum(mask_f) + 1e-6)
            loss = mlm_loss + DISC_WEIGHT * disc_loss
        grads = tape.gradient(loss, variables)
        optimizer.learning_rate.assign(schedule(optimizer.iterations))
        optimizer.apply(grads, variables)
        return loss

    batches = [{k: tf.constant(v, tf.int32) for k, v in b.items()}
               for b in numpy_batches(args.batch, 8, seed=1)]
    counter = [0]
    losses = []

    def run_window(num_steps):
        for _ in range(num_steps):
            b = batches[counter[0] % len(batches)]
            loss = train_step(b["input_ids"], b["input_mask"], b["segment_ids"])
            counter[0] += 1
        losses.append(float(loss))

    start = time.perf_counter()
    run_window(1)
    first = time.perf_counter() - start
    times = _timed_windows(run_window, args.steps, args.warmup, args.windows)
    return {"first_call_seconds": first, "window_seconds": times, "losses": losses,
            "versions": {"tensorflow": tf.__version__, "keras": keras.__version__,
                         "keras_hub": keras_hub.__version__}}


def peak_dtypes(run_dtypes, cpu_flags):
    """The dtypes whose matmul peak a run measures: its own, less bfloat16 on a CPU that
    emulates it (no peak to speak of: a 4096^3 product takes minutes there)."""
    from electra_tf import precision

    native, _ = precision.native_bf16(precision.DeviceFacts("cpu", "", cpu_flags))
    return [d for d in run_dtypes if d != "bfloat16" or native]


def worker_peak(args):
    """Best median GFLOP/s of large matmuls: TensorFlow (oneDNN) and PyTorch, f32 and bf16."""
    import numpy as np

    shapes = [(1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096),
              # the model's own big shapes at batch 128 (tokens x H x 4H and back)
              (16384, 256, 1024), (16384, 1024, 256), (1024, 16384, 256)]
    repeats = 5
    results = {}

    def median_gflops(fn, m, k, n):
        fn()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return 2.0 * m * k * n / statistics.median(times) / 1e9

    import electra_tf  # noqa: F401  (TensorFlow's kernels as electra-tf runs them: onednn.py)
    import tensorflow as tf

    dtypes = args.peak_dtypes.split(",")
    for dtype in dtypes:
        for m, k, n in shapes:
            a = tf.cast(tf.random.normal([m, k]), dtype)
            b = tf.cast(tf.random.normal([k, n]), dtype)
            matmul = tf.function(lambda: tf.matmul(a, b))
            results[f"tensorflow/{dtype}/{m}x{k}x{n}"] = median_gflops(
                lambda: matmul().numpy(), m, k, n)
    if "torch" in args.peak_frameworks:
        import torch

        torch.set_num_threads(os.cpu_count())
        for dtype in dtypes:
            torch_dtype = torch.float32 if dtype == "float32" else torch.bfloat16
            for m, k, n in shapes:
                a = torch.randn(m, k).to(torch_dtype)
                b = torch.randn(k, n).to(torch_dtype)
                results[f"torch/{dtype}/{m}x{k}x{n}"] = median_gflops(lambda: torch.mm(a, b), m, k, n)
    peak = {dtype: max(v for k, v in results.items() if f"/{dtype}/" in k) for dtype in dtypes}
    del np
    return {"peak_gflops": peak, "matmul_gflops": results}


WORKERS = {"electra_tf": worker_electra_tf, "electra_tf_jax": worker_electra_tf_backend,
           "electra_tf_torch": worker_electra_tf_backend,
           "torch": worker_torch, "torch_compile": worker_torch,
           "keras_naive": worker_keras_naive, "peak": worker_peak}


def run_worker(args):
    result = WORKERS[args.worker](args)
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    with open(args.result_file, "w", encoding="utf-8") as f:
        json.dump(result, f)


# ------------------------------------------------------------------------------------------------
# Driver
# ------------------------------------------------------------------------------------------------
# The CPU flags that decide kernels and precision here (recorded with every run).
RECORDED_CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16",
                      "amx_tile")


def machine_info():
    from electra_tf import onednn, precision

    cpu, flags = precision.read_cpu()
    flags = flags or frozenset()
    auto = precision.resolve("auto", precision.DeviceFacts("cpu", cpu, flags))
    mem_gb = None
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            mem_gb = int(f.readline().split()[1]) / 2 ** 20
    except (OSError, ValueError, IndexError):
        pass
    return {"nproc": os.cpu_count(), "cpu": cpu, "memory_gib": mem_gb,
            "amx": any(f.startswith("amx") for f in flags),
            "avx512": any(f.startswith("avx512") for f in flags),
            "cpu_flags": [f for f in RECORDED_CPU_FLAGS if f in flags],
            "auto_precision": {"policy": auto.policy, "reason": auto.reason},
            # What electra-tf's TensorFlow workers run with (electra_tf/onednn.py).
            "tf_enable_onednn_opts": os.environ.get(
                onednn.ENV, "1" if onednn.wanted(flags) else "TensorFlow's default"),
            "python": platform.python_version(), "platform": platform.platform(),
            "load_average_start": os.getloadavg()}


def spawn(worker, args, extra, timeout):
    fd, result_file = tempfile.mkstemp(suffix=".json", prefix="pretrain_step_")
    os.close(fd)
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", worker,
           "--result-file", result_file, "--data-dir", args.data_dir or "",
           "--steps", str(args.steps), "--warmup", str(args.warmup),
           "--windows", str(args.windows), "--peak-frameworks", args.peak_frameworks] + extra
    if args.electra_tf_hparams:
        cmd += ["--electra-tf-hparams", args.electra_tf_hparams]
    if args.electra_tf_kernels:
        cmd += ["--electra-tf-kernels", args.electra_tf_kernels]
    if args.profile_dir:
        cmd += ["--profile-dir", args.profile_dir]
    env = dict(os.environ)
    if worker in KERAS_BACKEND_WORKERS:
        env["KERAS_BACKEND"] = KERAS_BACKEND_WORKERS[worker]
    start = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout, env=env)
    wall = time.perf_counter() - start
    try:
        if proc.returncode != 0:
            tail = "\n".join(proc.stdout.strip().splitlines()[-15:])
            return {"error": f"exit {proc.returncode}: {tail}", "wall_seconds": wall}
        with open(result_file, encoding="utf-8") as f:
            result = json.load(f)
        result["wall_seconds"] = wall
        return result
    finally:
        os.remove(result_file)


# Groups of the profile summary: (group, predicate on (op type, op name)), first match wins.
PROFILE_GROUPS = (
    ("XLA clusters (elementwise, fused)", lambda t, n: t == "XLA cluster"),
    ("matmuls (oneDNN)", lambda t, n: "MatMul" in t or t in ("Einsum", "_MklEinsum")),
    ("dropout random numbers (Philox)", lambda t, n: t.startswith("StatelessRandom")
     and ("layer_" in n or "embeddings" in n)),
    ("masking + Gumbel sampling (per-example Philox)", lambda t, n: "/map/" in n
     or "masking" in n or "sampling" in n or t.startswith("StatelessRandom")),
    ("gradient sums (AddN: residual branches, shared embeddings)", lambda t, n: t == "AddN"),
    ("GELU", lambda t, n: "gelu" in n.lower() or t in ("Erf", "Erfc")),
    ("softmax", lambda t, n: "Softmax" in t),
    ("bias adds / bias gradients", lambda t, n: t in ("BiasAdd", "BiasAddGrad", "_MklBiasAdd")),
    ("optimizer + clipping", lambda t, n: t.startswith("ResourceApply") or "clip" in n
     or "optimizer" in n.lower() or "adam" in n.lower()),
    ("casts", lambda t, n: t == "Cast"),
    ("transposes", lambda t, n: "Transpose" in t),
    ("metrics + losses", lambda t, n: "metric" in n.lower() or "loss" in n.lower()),
    ("other elementwise (LayerNorm, residual adds, dropout masks, ...)", lambda t, n: True),
)


def profile_summary(profile_dir):
    """Op time (ms, summed over the run) per group and per op type from a TensorFlow profiler
    trace (the .xplane.pb files under `profile_dir`). With one inter-op thread (the trainer's
    CPU default) the ops run one at a time, so the op times add up to the compute time."""
    import glob
    from collections import Counter

    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    groups, types, fusions = Counter(), Counter(), Counter()
    for path in glob.glob(os.path.join(profile_dir, "**", "*.xplane.pb"), recursive=True):
        space = xplane_pb2.XSpace()
        with open(path, "rb") as f:
            space.ParseFromString(f.read())
        for plane in space.planes:
            for line in plane.lines:
                if not line.name.startswith("tf_Compute"):
                    continue
                for event in line.events:
                    meta = plane.event_metadata[event.metadata_id]
                    if meta.name == "CpuExecutable::ExecuteAsyncOnStream":
                        name, op_type = "", "XLA cluster"  # one compiled cluster's run
                    elif meta.name.endswith("_fusion") or meta.name.startswith("fusion"):
                        fusions[meta.name] += event.duration_ps / 1e9  # inside a cluster
                        continue
                    elif ":" not in meta.name or "::" in meta.name:
                        continue  # executor / threadpool bookkeeping, not an op
                    else:
                        name, op_type = meta.name.rsplit(":", 1)
                    ms = event.duration_ps / 1e9
                    types[op_type] += ms
                    group = next(g for g, match in PROFILE_GROUPS if match(op_type, name))
                    groups[group] += ms
    return {"groups": dict(groups.most_common()), "op_types": dict(types.most_common(30)),
            "xla_fusions": dict(fusions.most_common(15))}


def print_profile(summary, steps):
    total = sum(summary["groups"].values()) or 1.0
    print(f"{'where (op time per step)':<66}{'ms':>9}{'share':>8}")
    for group, ms in summary["groups"].items():
        print(f"{group:<66}{ms / steps:>9.1f}{100 * ms / total:>7.0f}%")
    print(f"{'total op time':<66}{total / steps:>9.1f}")
    print("top op types (ms per step): " + ", ".join(
        f"{t} {ms / steps:.1f}" for t, ms in list(summary["op_types"].items())[:15]))
    if summary.get("xla_fusions"):
        print("top XLA fusions (ms per step): " + ", ".join(
            f"{t} {ms / steps:.1f}" for t, ms in summary["xla_fusions"].items()))


def merge_rounds(results):
    """One result from several subprocess runs of a configuration (`--rounds`): windows
    concatenated, first call and load of the first round, the largest peak RSS."""
    good = [r for r in results if "error" not in r]
    if not good:
        return results[0]
    merged = dict(good[0])
    merged["rounds"] = len(good)
    merged["peak_rss_mb"] = max(r["peak_rss_mb"] for r in good)
    merged["load_average_windows"] = [r.get("load_average_windows") for r in good]
    if "variants" in merged:
        merged["variants"] = {
            name: dict(v, window_seconds=[t for r in good for t in r["variants"][name]
                                          ["window_seconds"]],
                       losses=[x for r in good for x in r["variants"][name]["losses"]])
            for name, v in good[0]["variants"].items()}
    else:
        merged["window_seconds"] = [t for r in good for t in r["window_seconds"]]
        merged["losses"] = [x for r in good for x in r["losses"]]
    return merged


def summarize(impl, batch, dtype, result, peak):
    """Table rows of one configuration's result: one row, or one per electra-tf kernel variant."""
    if "variants" in result:
        shared = {k: v for k, v in result.items() if k != "variants"}
        return [row for name, variant in result["variants"].items()
                for row in summarize(impl, batch, dtype, dict(shared, variant=name, **variant),
                                     peak)]
    row = {"implementation": impl, "batch_size": batch, "dtype": dtype}
    row.update(result)
    if "error" in result:
        return [row]
    median = statistics.median(result["window_seconds"])
    steps = result.get("steps")
    row["median_window_seconds"] = median
    row["step_seconds"] = median / steps
    row["sequences_per_second"] = batch * steps / median
    row["tokens_per_second"] = batch * SEQ_LENGTH * steps / median
    row["spread"] = (max(result["window_seconds"]) - min(result["window_seconds"])) / median
    flops = step_flops(batch)
    row["model_gflops_per_step"] = flops / 1e9
    row["achieved_gflops"] = flops / row["step_seconds"] / 1e9
    if peak and dtype in peak:
        row["mfu"] = row["achieved_gflops"] / peak[dtype]
    return [row]


def row_label(row):
    label = IMPL_LABELS[row["implementation"]]
    return f"{label} {row['variant']}" if row.get("variant") else label


def print_table(rows, peak):
    header = (f"{'implementation':<32}{'batch':>6}{'dtype':>10}{'seq/s':>9}{'tok/s':>9}"
              f"{'s/step':>8}{'GFLOP/s':>9}{'MFU':>7}{'1st call s':>11}{'peak RSS MB':>12}"
              f"  windows (s)")
    print(header)
    print("-" * len(header))
    for r in rows:
        label = row_label(r)
        if "error" in r:
            print(f"{label:<32}{r['batch_size']:>6}{r['dtype']:>10}  ERROR: {r['error'][:200]}")
            continue
        mfu = f"{100 * r['mfu']:.0f}%" if "mfu" in r else "-"
        windows = ", ".join(f"{t:.1f}" for t in r["window_seconds"])
        print(f"{label:<32}{r['batch_size']:>6}{r['dtype']:>10}{r['sequences_per_second']:>9.2f}"
              f"{r['tokens_per_second']:>9.0f}{r['step_seconds']:>8.2f}{r['achieved_gflops']:>9.0f}"
              f"{mfu:>7}{r['first_call_seconds']:>11.1f}{r['peak_rss_mb']:>12.0f}  {windows}")
    if peak:
        print(f"matmul peak: {_peak_text(peak)}; FLOPs per step of 32 sequences: "
              f"{step_flops(32) / 1e9:.1f} GFLOP")


def _peak_text(peak):
    return ", ".join(f"{dtype} {peak[dtype]:.0f} GFLOP/s" if dtype in peak
                     else f"{dtype} not measured (emulated on this CPU)" for dtype in DTYPES)


def ratios(rows):
    """Each electra-tf row's seq/s and peak RSS relative to every other implementation, per
    batch/dtype (keys "[variant vs ]other/batch/dtype")."""
    good = [r for r in rows if "error" not in r]
    out = {}
    for r in good:
        if r["implementation"] != "electra_tf":
            continue
        for o in good:
            if o["implementation"] == "electra_tf" or (o["batch_size"], o["dtype"]) != \
                    (r["batch_size"], r["dtype"]):
                continue
            prefix = f"{r['variant']} vs " if r.get("variant") else ""
            out[f"{prefix}{o['implementation']}/{r['batch_size']}/{r['dtype']}"] = {
                "speedup": r["sequences_per_second"] / o["sequences_per_second"],
                "rss_ratio": r["peak_rss_mb"] / o["peak_rss_mb"]}
    return out


def draw_chart(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    good = [r for r in rows if "error" not in r]
    groups = sorted({(r["batch_size"], r["dtype"]) for r in good},
                    key=lambda g: (g[1] != "float32", g[0]))
    labels = list(dict.fromkeys(row_label(r) for r in good))
    fig, ax = plt.subplots(figsize=(8, 4.2))
    width = 0.8 / max(1, len(labels))
    for j, label in enumerate(labels):
        values = []
        for batch, dtype in groups:
            match = [r for r in good if row_label(r) == label and r["batch_size"] == batch
                     and r["dtype"] == dtype]
            values.append(match[0]["sequences_per_second"] if match else 0.0)
        xs = [i + (j - (len(labels) - 1) / 2) * width for i in range(len(groups))]
        bars = ax.bar(xs, values, width, label=label)
        for bar, value in zip(bars, values):
            if value:
                ax.annotate(f"{value:.1f}", (bar.get_x() + bar.get_width() / 2, value),
                            ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([f"batch {b}\n{'mixed bf16' if d == 'bfloat16' else d}" for b, d in groups])
    ax.set_ylabel("sequences / s (seq 128)")
    ax.set_title(f"ELECTRA-small pretraining step, {os.cpu_count()} CPU cores")
    ax.legend(fontsize=7)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _csv(value, allowed, cast=str):
    items = [cast(v.strip()) for v in value.split(",") if v.strip()]
    if allowed is not None:
        bad = [v for v in items if v not in allowed]
        if bad:
            raise argparse.ArgumentTypeError(f"{bad[0]!r} is not one of {', '.join(allowed)}")
    return items


def build_parser():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--impl", default=",".join(IMPLEMENTATIONS),
                        type=lambda v: _csv(v, IMPLEMENTATIONS),
                        help="comma-separated implementations to run: electra_tf (the project's "
                             "Trainer), torch (HF transformers peer, eager), torch_compile (the "
                             "same with torch.compile), keras_naive (keras-hub backbones). "
                             "Default: all")
    parser.add_argument("--batch", default="32,128", type=lambda v: _csv(v, None, int),
                        help="comma-separated batch sizes (sequences of 128 tokens). Default: 32,128")
    parser.add_argument("--dtype", default="float32,bfloat16", type=lambda v: _csv(v, DTYPES),
                        help="comma-separated precisions: float32 and/or bfloat16 (Keras "
                             "mixed_bfloat16 / torch.autocast bf16). Default: both")
    parser.add_argument("--steps", type=int, default=4,
                        help="training steps per timed window (electra-tf: iterations_per_loop, "
                             "one compiled call per window). Default: 4")
    parser.add_argument("--windows", type=int, default=3,
                        help="timed windows per configuration; the median is reported. Default: 3")
    parser.add_argument("--warmup", type=int, default=3,
                        help="untimed windows after the first call (which is timed separately: "
                             "tracing / graph building + 1 step). PyTorch's step at batch 128 "
                             "keeps speeding up over its first ~8 steps (one warm-up window of 2 "
                             "steps overstated electra-tf's lead by 10%% on a Xeon). Default: 3")
    parser.add_argument("--no-peak", action="store_true",
                        help="skip the matmul-peak measurement (no MFU column)")
    parser.add_argument("--peak-frameworks", default="tensorflow,torch",
                        help="frameworks whose matmul speed defines the peak (comma-separated, "
                             "tensorflow always included). Default: tensorflow,torch")
    parser.add_argument("--output", default=os.path.join(REPO_ROOT, "benchmarks", "results",
                                                         "pretrain_step.json"),
                        help="JSON results file. Default: benchmarks/results/pretrain_step.json")
    parser.add_argument("--chart", default=os.path.join(REPO_ROOT, "docs", "img", "pretrain_step.png"),
                        help="PNG bar chart of seq/s per implementation, batch and dtype ('' to "
                             "skip). Default: docs/img/pretrain_step.png")
    parser.add_argument("--data-dir", default=None,
                        help="reuse TFRecords + vocab written by an earlier run (default: write "
                             "4 x 1024 random full-length examples into a temp dir)")
    parser.add_argument("--profile-dir", default=None,
                        help="electra_tf only: after the timed windows, record one more window "
                             "per kernel variant with the TensorFlow profiler into this "
                             "directory, and print where the op time goes (grouped)")
    parser.add_argument("--electra-tf-kernels", default=None,
                        help="comma-separated kernel variants "
                             "KERNELS/DROPOUT_RNG[/SAMPLING_RNG[/DENSE_GRAD]] of the electra_tf "
                             "step (electra_tf.modeling.fused: KERNELS tf|xla, DROPOUT_RNG "
                             "philox|hash, SAMPLING_RNG philox|hash, DENSE_GRAD matmul|einsum; "
                             "parts left out: the library's defaults), e.g. "
                             "'xla/hash/hash/matmul,xla/hash/hash/einsum': each is traced as its own "
                             "training loop in the one electra_tf process and their windows "
                             "alternate (an A/B in one process). Default: the library defaults")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run every configuration's subprocesses this many times, alternating "
                             "the order of the implementations, and pool their windows (the "
                             "median is over all). Default: 1")
    parser.add_argument("--electra-tf-hparams", default=None,
                        help="JSON hparam overrides for the electra_tf Trainer (e.g. "
                             "'{\"jit_compile\": true}' or '{\"inter_op_threads\": 0}')")
    parser.add_argument("--timeout", type=int, default=3600,
                        help="seconds before a configuration's subprocess is abandoned")
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--peak-dtypes", default=",".join(DTYPES), help=argparse.SUPPRESS)
    parser.add_argument("--result-file", help=argparse.SUPPRESS)
    parser.add_argument("--batch-size", dest="batch_one", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--dtype-one", help=argparse.SUPPRESS)
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.worker:
        args.batch = args.batch_one
        args.dtype = args.dtype_one
        run_worker(args)
        return 0

    started = time.time()
    temp_dir = None
    if args.data_dir is None and "electra_tf" in args.impl:
        temp_dir = tempfile.mkdtemp(prefix="pretrain_step_data_")
        args.data_dir = write_dataset(temp_dir)
    info = machine_info()
    print(f"machine: {info['nproc']} cores, {info['cpu']}, {info['memory_gib']:.1f} GiB, "
          f"load {info['load_average_start'][0]:.2f}; flags {' '.join(info['cpu_flags'])}; "
          f"TF_ENABLE_ONEDNN_OPTS {info['tf_enable_onednn_opts']}; auto precision "
          f"{info['auto_precision']['policy']}", flush=True)
    try:
        peak = None
        peak_result = None
        if not args.no_peak:
            dtypes = peak_dtypes(args.dtype, frozenset(info["cpu_flags"]))
            peak_result = (spawn("peak", args, ["--peak-dtypes", ",".join(dtypes)], args.timeout)
                           if dtypes else {"peak_gflops": {}, "matmul_gflops": {}})
            if "error" in peak_result:
                print("matmul peak failed:", peak_result["error"], flush=True)
            else:
                peak = peak_result["peak_gflops"]
                print(f"matmul peak: {_peak_text(peak)}", flush=True)
        rows = []
        for batch in args.batch:
            for dtype in args.dtype:
                runs = {impl: [] for impl in args.impl}
                for round_index in range(args.rounds):
                    # Later rounds run the implementations in reverse order, so that none always
                    # runs first (or last) when the machine's load drifts.
                    order = args.impl if round_index % 2 == 0 else args.impl[::-1]
                    for impl in order:
                        print(f"running {impl} batch {batch} {dtype} (round {round_index + 1}, "
                              f"load {os.getloadavg()[0]:.2f}) ...", flush=True)
                        result = spawn(impl, args, ["--batch-size", str(batch),
                                                    "--dtype-one", dtype], args.timeout)
                        result["steps"] = args.steps
                        runs[impl].append(result)
                        for row in summarize(impl, batch, dtype, result, peak):
                            if "error" in row:
                                print(f"  ERROR {row['error']}", flush=True)
                                continue
                            print(f"  {row.get('variant') or ''} "
                                  f"{row['sequences_per_second']:.2f} seq/s, first call "
                                  f"{row['first_call_seconds']:.1f} s, peak RSS "
                                  f"{row['peak_rss_mb']:.0f} MB, windows "
                                  f"{[round(t, 2) for t in row['window_seconds']]}", flush=True)
                for impl in args.impl:
                    rows.extend(summarize(impl, batch, dtype, merge_rounds(runs[impl]), peak))
        for row in rows:
            if row.get("profile"):
                print(f"\nprofile: {row_label(row)}, batch {row['batch_size']} {row['dtype']} "
                      f"(load {row['profile']['load_average'][0]:.1f})")
                print_profile(row["profile"], row["profile"]["steps"])
        print()
        print_table(rows, peak)
        print(f"cpu: {info['cpu']}; flags {' '.join(info['cpu_flags']) or '-'}; "
              f"TF_ENABLE_ONEDNN_OPTS {info['tf_enable_onednn_opts']}; auto precision "
              f"{info['auto_precision']['policy']} ({info['auto_precision']['reason']})")
        compare = ratios(rows)
        for key, value in sorted(compare.items()):
            print(f"electra-tf vs {key}: {value['speedup']:.2f}x seq/s, "
                  f"{value['rss_ratio']:.2f}x peak RSS")
        versions = {}
        for r in rows:
            versions.update(r.get("versions", {}))
        report = {
            "command": " ".join([os.path.relpath(sys.argv[0], REPO_ROOT)] + sys.argv[1:]),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
            "elapsed_seconds": time.time() - started,
            "machine": dict(info, load_average_end=os.getloadavg()),
            "versions": dict(versions, python=platform.python_version()),
            "model": {"discriminator": DISCRIMINATOR, "generator": GENERATOR,
                      "vocab_size": VOCAB_SIZE, "embedding_size": EMBEDDING_SIZE,
                      "seq_length": SEQ_LENGTH, "masked_per_sequence": MAX_PREDICTIONS},
            "flops_formula": ("6 * tokens * (matmul weights + attention) + 6 * masked * "
                              "(Hg*E + E*V); per 32 sequences: "
                              f"{step_flops(32) / 1e9:.1f} GFLOP"),
            "matmul_peak": peak_result,
            "results": rows,
            "electra_tf_vs": compare,
        }
        os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
        with open(args.output, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)
        print(f"wrote {args.output}")
        if args.chart:
            draw_chart(rows, args.chart)
            print(f"wrote {args.chart}")
    finally:
        if temp_dir:
            shutil.rmtree(temp_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
