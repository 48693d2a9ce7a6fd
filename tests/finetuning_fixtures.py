"""Shared setup of the fine-tuning tests (not a test module).

- `write_vocab`: a small WordPiece vocab (the required tokens, words, punctuation).
- `tiny_pretrained(root, vocab_path)`: a pretraining model directory (`config.json`, `vocab.txt`,
  a checkpoint `ckpt-1`) of a tiny ELECTRA and its exported discriminator SavedModel: the
  starting points fine-tuning accepts.
- `corpus_tasks_dir`: the corpus-built tasks (`electra_tf.finetuning.corpus_tasks`) from the
  default corpus; tests that need them skip when the corpus has not been fetched.
- `TINY_MODEL`: random-init sizes for the learning tests.
"""

from __future__ import annotations

import os
import shutil
from typing import Iterable, Sequence

import pytest
import tensorflow as tf

from electra_tf.config import PretrainingConfig
from electra_tf.training.tf import export as pretraining_export
from electra_tf.training.pretrainer import ElectraPretrainer
from electra_tf.vocab import REQUIRED_TOKENS, load_vocab
from tests.pretraining_fixtures import REPO_ROOT  # noqa: F401  (re-exported to fine-tuning tests)

REAL_VOCAB = os.path.join(REPO_ROOT, "pretrain_data", "vocab.txt")
REAL_CORPUS = os.path.join(REPO_ROOT, "pretrain_data", "corpus")
FETCH_HINT = "run `python pretrain_data/fetch.py` to fetch the real BERT vocab and corpus"
PUNCTUATION = list("()[]{}.,;:!?-'\"")

# Random-init encoder sizes for the learning tests (fast on 2 CPU cores, with the real vocab).
TINY_MODEL = {"model_hparam_overrides": {"hidden_size": 64, "num_hidden_layers": 2,
                                         "num_attention_heads": 2, "intermediate_size": 128},
              "embedding_size": 32}


def write_vocab(path: str, words: Iterable[str]) -> str:
    """A vocab of the required tokens, punctuation and `words` (in that order, deduplicated)."""
    tokens = list(dict.fromkeys(list(REQUIRED_TOKENS) + PUNCTUATION + list(words)))
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(tokens) + "\n")
    return path


def tiny_pretrained(root: str, vocab_path: str, max_seq_length: int = 64, seed: int = 1,
                    name: str = "tiny") -> dict:
    """A tiny pretraining run directory DATA_DIR/models/<name> and its exported discriminator.

    Returns:
        {"root", "model_dir", "export", "checkpoint", "discriminator"}.
    """
    vocab = load_vocab(vocab_path)
    shutil.copyfile(vocab_path, os.path.join(root, "vocab.txt"))
    config = PretrainingConfig.create(name, root, {
        "vocab_size": vocab.size, "embedding_size": 16, "max_seq_length": max_seq_length,
        "model_hparam_overrides": {"hidden_size": 32, "num_hidden_layers": 2,
                                   "num_attention_heads": 2, "intermediate_size": 64}})
    tf.keras.utils.set_random_seed(seed)
    model = ElectraPretrainer.from_pretraining_config(config, vocab.special)
    model.build_from_sequence_length()
    os.makedirs(config.model_dir)
    config.save(os.path.join(config.model_dir, "config.json"))
    shutil.copyfile(vocab_path, os.path.join(config.model_dir, "vocab.txt"))
    checkpoint = tf.train.Checkpoint(model=model).save(os.path.join(config.model_dir, "ckpt"))
    exported = pretraining_export.export_all(model, vocab, config)["discriminator"]
    return {"root": root, "model_dir": config.model_dir, "export": exported,
            "checkpoint": checkpoint, "discriminator": model.discriminator}


def need_real_data() -> None:
    """Skips the calling test when the default corpus or the BERT vocab is missing."""
    if not os.path.isfile(REAL_VOCAB) or not os.path.isdir(REAL_CORPUS) or not os.listdir(REAL_CORPUS):
        pytest.skip(f"{REAL_CORPUS} or {REAL_VOCAB} is missing: {FETCH_HINT}")


def corpus_tasks_dir(output_dir: str, tasks: Sequence[str], num_train: int, num_dev: int,
                     max_words: int = 20, seed: int = 0) -> str:
    """Builds corpus tasks into output_dir (the `raw_data_dir`) and returns it."""
    from electra_tf.finetuning import corpus_tasks

    need_real_data()
    corpus_tasks.build(output_dir, REAL_CORPUS, num_train, num_dev, seed, tasks, max_words)
    return output_dir


def tokenizer_for(directory, words: Iterable[str], max_seq_length: int = 32):
    """(Tokenizer, TextEncoder) over a small vocab of `words` written into `directory`."""
    from electra_tf.data.text.tokenization import Tokenizer
    from electra_tf.finetuning.encoding import TextEncoder

    vocab = load_vocab(write_vocab(os.path.join(str(directory), "small_vocab.txt"), words))
    tokenizer = Tokenizer(vocab)
    return tokenizer, TextEncoder(tokenizer, max_seq_length)


def squad_file(path, qids: Sequence[str], answerable: bool = True, version: str = "2.0",
               context: str = "the cat sat on the mat", answer=("cat", 4)) -> str:
    """A SQuAD JSON file with one paragraph and a question per id."""
    import json

    qas = []
    for qid in qids:
        qa = {"id": qid, "question": "what sat", "is_impossible": not answerable,
              "answers": [{"text": answer[0], "answer_start": answer[1]}] if answerable else []}
        qas.append(qa)
    os.makedirs(os.path.dirname(str(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"version": version, "data": [{"title": "t", "paragraphs": [
            {"context": context, "qas": qas}]}]}, f)
    return str(path)
