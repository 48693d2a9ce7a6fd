"""Helpers for the conversion tests (not a test module).

- Random weights in Google's official layout (names and shapes of spec 5.9), written as a TF1
  checkpoint the way the official code writes them: `tf.compat.v1.get_variable`s in a `tf.Graph`
  saved by `tf.compat.v1.train.Saver`, with Adam slots and `global_step` like a training
  checkpoint.
- Real English text tokenised with the project tokenizer, against the real BERT vocab when it has
  been fetched (`pretrain_data/vocab.txt`), else against a vocab of the text's own words.
- A model directory laid out as the trainer writes it (config.json, vocab.txt, a
  `tf.train.Checkpoint(model=..., optimizer=...)` managed by a CheckpointManager).
- Forward passes of our model and of Hugging Face's, in eval mode.
"""

from __future__ import annotations

import os
import re
from typing import Dict, Optional

import numpy as np
import tensorflow as tf

from electra_tf.vocab import REQUIRED_TOKENS, load_vocab

from tests.pretraining_fixtures import REPO_ROOT
REAL_VOCAB = os.path.join(REPO_ROOT, "pretrain_data", "vocab.txt")

# Real text (Jane Austen, Sense and Sensibility, public domain), two segments per example.
SENTENCES = [
    ("The family of Dashwood had long been settled in Sussex.",
     "Their estate was large, and their residence was at Norland Park."),
    ("His attachment to them all increased.",
     "By a former marriage, Mr. Henry Dashwood had one son: by his present lady, three daughters."),
    ("The son, a steady respectable young man, was amply provided for.", None),
]
# Discriminator sizes scaled down from ELECTRA-Small (H 256, 12 layers, E 128): heads = H // 64 = 2
# and FFN = 4H follow from the official size rules, so only width, depth and E are overridden.
TINY = {"hidden_size": 128, "num_hidden_layers": 2, "embedding_size": 64}
# Random weight scales, near those of trained ELECTRA weights: kernels keep activations at unit
# scale (0.1 * sqrt(fan-in 128) ~ 1), and the word table and RTD output layer give logits of
# magnitude ~10, as trained models do. Larger weights amplify float32 rounding (the 1e-4 parity
# bound is absolute).
SCALE = 0.1
TABLE_SCALE = 0.5
OUTPUT_SCALE = 0.3


def text_words(texts) -> list:
    """Lowercased words and punctuation of plain ASCII text (what BERT's basic tokenizer gives)."""
    words = []
    for text in texts:
        words += re.findall(r"[a-z0-9]+|[^a-z0-9\s]", text.lower())
    return list(dict.fromkeys(words))


def write_text_vocab(path: str) -> str:
    """A vocab with the specials and every word of SENTENCES (so nothing becomes [UNK])."""
    texts = [t for pair in SENTENCES for t in pair if t]
    tokens = list(REQUIRED_TOKENS) + text_words(texts)
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(tokens) + "\n")
    return path


def text_vocab_path(tmp_dir: str, real: bool) -> str:
    """The real BERT vocab if asked for and fetched, else a vocab of the text's words."""
    if real and os.path.isfile(REAL_VOCAB):
        return REAL_VOCAB
    return write_text_vocab(os.path.join(tmp_dir, "text_vocab.txt"))


def encode_text(vocab_path: str, max_length: int = 40):
    """SENTENCES as [CLS] a [SEP] b [SEP] batches, zero-padded: (input_ids, input_mask, segment_ids)."""
    from electra_tf.data.text.tokenization import Tokenizer

    vocab = load_vocab(vocab_path)
    tokenizer = Tokenizer(vocab)
    special = vocab.special
    rows = []
    for first, second in SENTENCES:
        ids = [special.cls_id] + tokenizer.encode(first) + [special.sep_id]
        segments = [0] * len(ids)
        if second:
            more = tokenizer.encode(second) + [special.sep_id]
            ids += more
            segments += [1] * len(more)
        rows.append((ids[:max_length], segments[:max_length]))
    length = max(len(ids) for ids, _ in rows)
    input_ids = np.zeros([len(rows), length], np.int32)
    input_mask = np.zeros_like(input_ids)
    segment_ids = np.zeros_like(input_ids)
    for i, (ids, segments) in enumerate(rows):
        input_ids[i, :len(ids)] = ids
        input_mask[i, :len(ids)] = 1
        segment_ids[i, :len(ids)] = segments
    assert special.unk_id not in input_ids, "the test text should tokenise without [UNK]"
    return input_ids, input_mask, segment_ids


# --- Official-layout random weights ---------------------------------------------------------------
def _encoder_weights(rng, scope, hidden, layers, embedding, own_embeddings, vocab_size, positions=512):
    def n(*shape):
        return rng.normal(0.0, SCALE, size=shape).astype(np.float32)

    w = {}
    if own_embeddings:
        w[f"{scope}/embeddings/word_embeddings"] = rng.normal(0.0, TABLE_SCALE, (vocab_size, embedding)).astype(np.float32)
        w[f"{scope}/embeddings/token_type_embeddings"] = n(2, embedding)
        w[f"{scope}/embeddings/position_embeddings"] = n(positions, embedding)
        w[f"{scope}/embeddings/LayerNorm/gamma"] = 1 + n(embedding)
        w[f"{scope}/embeddings/LayerNorm/beta"] = n(embedding)
    if embedding != hidden:
        w[f"{scope}/embeddings_project/kernel"] = n(embedding, hidden)
        w[f"{scope}/embeddings_project/bias"] = n(hidden)
    inter = 4 * hidden
    for i in range(layers):
        p = f"{scope}/encoder/layer_{i}/"
        for name in ("query", "key", "value"):
            w[p + f"attention/self/{name}/kernel"] = n(hidden, hidden)
            w[p + f"attention/self/{name}/bias"] = n(hidden)
        w[p + "attention/output/dense/kernel"] = n(hidden, hidden)
        w[p + "attention/output/dense/bias"] = n(hidden)
        w[p + "attention/output/LayerNorm/gamma"] = 1 + n(hidden)
        w[p + "attention/output/LayerNorm/beta"] = n(hidden)
        w[p + "intermediate/dense/kernel"] = n(hidden, inter)
        w[p + "intermediate/dense/bias"] = n(inter)
        w[p + "output/dense/kernel"] = n(inter, hidden)
        w[p + "output/dense/bias"] = n(hidden)
        w[p + "output/LayerNorm/gamma"] = 1 + n(hidden)
        w[p + "output/LayerNorm/beta"] = n(hidden)
    return w


def official_weights(vocab_size: int, generator_hidden: Optional[int], seed: int = 0,
                     hidden: int = TINY["hidden_size"], layers: int = TINY["num_hidden_layers"],
                     embedding: int = TINY["embedding_size"], generator_layers: Optional[int] = None,
                     discriminator_head: bool = True) -> Dict[str, np.ndarray]:
    """Random weights under the official names (spec 5.9); generator_hidden None = discriminator only."""
    rng = np.random.default_rng(seed)
    w = _encoder_weights(rng, "electra", hidden, layers, embedding, True, vocab_size)
    if generator_hidden is not None:
        w.update(_encoder_weights(rng, "generator", generator_hidden, generator_layers or layers,
                                  embedding, False, vocab_size))
        w["generator_predictions/dense/kernel"] = rng.normal(0, SCALE, (generator_hidden, embedding)).astype(np.float32)
        w["generator_predictions/dense/bias"] = rng.normal(0, SCALE, embedding).astype(np.float32)
        w["generator_predictions/LayerNorm/gamma"] = (1 + rng.normal(0, SCALE, embedding)).astype(np.float32)
        w["generator_predictions/LayerNorm/beta"] = rng.normal(0, SCALE, embedding).astype(np.float32)
        w["generator_predictions/output_bias"] = rng.normal(0, 1.0, vocab_size).astype(np.float32)
    if discriminator_head:
        w["discriminator_predictions/dense/kernel"] = rng.normal(0, SCALE, (hidden, hidden)).astype(np.float32)
        w["discriminator_predictions/dense/bias"] = rng.normal(0, SCALE, hidden).astype(np.float32)
        w["discriminator_predictions/dense_1/kernel"] = rng.normal(0, OUTPUT_SCALE, (hidden, 1)).astype(np.float32)
        w["discriminator_predictions/dense_1/bias"] = rng.normal(0, 1.0, 1).astype(np.float32)
    return w


def write_google_checkpoint(prefix: str, weights: Dict[str, np.ndarray], global_step: int = 0,
                            adam_slots: bool = True) -> str:
    """Writes weights as the official TF1 code does: get_variable in a Graph + v1 Saver.

    Adds `global_step` and, like a training checkpoint, `<var>/adam_m` and `<var>/adam_v` slots
    (random values, so loading one by mistake would show).
    """
    os.makedirs(os.path.dirname(prefix), exist_ok=True)
    graph = tf.Graph()
    with graph.as_default():
        variables = []
        for name, value in weights.items():
            variables.append(tf.compat.v1.get_variable(
                name, shape=value.shape, dtype=tf.float32,
                initializer=tf.compat.v1.constant_initializer(value)))
            if adam_slots:
                for slot in ("adam_m", "adam_v"):
                    variables.append(tf.compat.v1.get_variable(
                        f"{name}/{slot}", shape=value.shape, dtype=tf.float32,
                        initializer=tf.compat.v1.constant_initializer(np.full(value.shape, 7.0, np.float32))))
        step = tf.compat.v1.get_variable("global_step", shape=[], dtype=tf.int64,
                                         initializer=tf.compat.v1.constant_initializer(global_step))
        saver = tf.compat.v1.train.Saver(variables + [step])
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            return saver.save(session, prefix, write_meta_graph=False)


# --- Forward passes ----------------------------------------------------------------------------
def ours_discriminator(model, input_ids, input_mask, segment_ids):
    """(sequence_output [B, L, H], discriminator logits [B, L]) of our pretrainer, eval mode."""
    inputs = {"input_ids": tf.constant(input_ids), "input_mask": tf.constant(input_mask),
              "segment_ids": tf.constant(segment_ids)}
    hidden = model.discriminator(inputs, training=False)["sequence_output"]
    return hidden.numpy(), model.discriminator_head(hidden).numpy()


def ours_generator_logits(model, input_ids, input_mask, segment_ids):
    """Generator MLM logits [B, L, V] at every position, eval mode."""
    from electra_tf.pretraining.encoder_interface import word_embedding_table

    inputs = {"input_ids": tf.constant(input_ids), "input_mask": tf.constant(input_mask),
              "segment_ids": tf.constant(segment_ids)}
    encoder = model.mlm_encoder
    hidden = encoder(inputs, training=False)["sequence_output"]
    return model.generator_head(hidden, word_embedding_table(encoder)).numpy()


def torch_inputs(input_ids, input_mask, segment_ids):
    import torch

    return {"input_ids": torch.tensor(input_ids, dtype=torch.long),
            "attention_mask": torch.tensor(input_mask, dtype=torch.long),
            "token_type_ids": torch.tensor(segment_ids, dtype=torch.long)}


def hf_discriminator(model, input_ids, input_mask, segment_ids):
    """(last hidden state, logits) of a transformers ElectraForPreTraining, as numpy."""
    import torch

    model.eval()
    with torch.no_grad():
        out = model(**torch_inputs(input_ids, input_mask, segment_ids), output_hidden_states=True)
    return out.hidden_states[-1].numpy(), out.logits.numpy()


def hf_generator_logits(model, input_ids, input_mask, segment_ids):
    import torch

    model.eval()
    with torch.no_grad():
        return model(**torch_inputs(input_ids, input_mask, segment_ids)).logits.numpy()


def hf_config(vocab_size: int, hidden: int, layers: int, embedding: int):
    """A transformers ElectraConfig built locally with the official derived sizes (no hub)."""
    from transformers import ElectraConfig

    return ElectraConfig(vocab_size=vocab_size, embedding_size=embedding, hidden_size=hidden,
                         num_hidden_layers=layers, num_attention_heads=max(1, hidden // 64),
                         intermediate_size=4 * hidden, hidden_act="gelu", layer_norm_eps=1e-12,
                         max_position_embeddings=512, type_vocab_size=2)


def max_abs_diff(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


# --- A model directory as the trainer writes it -----------------------------------------------------
def random_like(shapes: Dict[str, tuple], seed: int) -> Dict[str, np.ndarray]:
    """Random official-layout weights for the given {name: shape} (LayerNorm gammas near 1)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in shapes.items():
        if name.endswith("word_embeddings"):
            out[name] = rng.normal(0.0, TABLE_SCALE, shape)
        elif name.endswith("/gamma"):
            out[name] = 1.0 + rng.normal(0.0, SCALE, shape)
        elif name.endswith("dense_1/kernel"):
            out[name] = rng.normal(0.0, OUTPUT_SCALE, shape)
        else:
            out[name] = rng.normal(0.0, SCALE, shape)
    return {k: v.astype(np.float32) for k, v in out.items()}


def make_model_dir(root: str, hparams: dict, vocab_path: str, seed: int = 0, step: int = 1000,
                   model_name: str = "run"):
    """Writes DATA_DIR/models/NAME like the trainer: config.json, vocab.txt and a checkpoint of
    `tf.train.Checkpoint(model=..., optimizer=...)` saved by a CheckpointManager at `step`.

    Returns:
        (model_dir, model, official weights dict of the saved model).
    """
    import shutil

    import keras

    from electra_tf.config import PretrainingConfig
    from electra_tf.convert import names
    from electra_tf.training import optimization
    from electra_tf.training.pretrainer import ElectraPretrainer

    data_dir = os.path.join(root, "data")
    config = PretrainingConfig.create(model_name, data_dir, hparams)
    os.makedirs(config.model_dir, exist_ok=True)
    vocab = load_vocab(vocab_path)
    keras.utils.set_random_seed(seed)
    model = ElectraPretrainer.from_pretraining_config(config, vocab.special)
    model.build_from_sequence_length()
    weights = random_like(names.official_shapes(model), seed)
    names.assign_official_weights(model, weights)
    optimizer, _ = optimization.create_optimizer(config, config.optimizer)
    optimizer.build(model.trainable_variables)
    optimizer.iterations.assign(step)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
    tf.train.CheckpointManager(checkpoint, config.model_dir, max_to_keep=5,
                               step_counter=optimizer.iterations).save(checkpoint_number=step)
    config.save(os.path.join(config.model_dir, "config.json"))
    shutil.copyfile(vocab_path, os.path.join(config.model_dir, "vocab.txt"))
    return config.model_dir, model, weights


def tiny_hparams(vocab_size: int, **extra) -> dict:
    """Hparams of a model with the TINY sizes (and the given generator settings)."""
    hparams = {"vocab_size": vocab_size, "embedding_size": TINY["embedding_size"],
               "model_hparam_overrides": {"hidden_size": TINY["hidden_size"],
                                          "num_hidden_layers": TINY["num_hidden_layers"]}}
    hparams.update(extra)
    return hparams


def vocab_size_of(path: str) -> int:
    return load_vocab(path).size
