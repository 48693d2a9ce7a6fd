"""learn_vocab: BERT / compact token layout, exact size, coverage, determinism, streaming."""

import os
import random

import numpy as np
import pytest

from electra_tf.data.text import vocab_learning
from electra_tf.data.text.tokenization import Tokenizer
from electra_tf.data.text.vocab_learning import (BERT_LAYOUT_MIN_VOCAB_SIZE, count_words,
                                                 learn_vocab, special_layout)

STEMS = ("the of and to in is was for that with as by on from at his which an are were it "
         "computer language program system data network memory function number value process "
         "language protocol machine software hardware user interface example standard").split()
EXTRAS = ["Café", "naïve", "RÉSUMÉ", "Straße", "中文", "ΟΔΟΣ", "İstanbul", "e-mail", "U.S.",
          "(see", "below)", "x86", "1984,", "don't"]


def write_corpus(directory, num_files=2, lines_per_file=400, seed=0):
    """Zipf-distributed words, some capitalised or inflected, accents, CJK, punctuation."""
    rng = random.Random(seed)
    weights = [1.0 / (rank + 1) for rank in range(len(STEMS))]
    paths = []
    for n in range(num_files):
        lines = []
        for _ in range(lines_per_file):
            words = []
            for _ in range(rng.randint(3, 14)):
                word = rng.choices(STEMS, weights)[0] + rng.choice(["", "", "", "s", "ing", "ed"])
                if rng.random() < 0.1:
                    word = word.capitalize()
                if rng.random() < 0.05:
                    word = rng.choice(EXTRAS)
                words.append(word)
            lines.append(" ".join(words) + rng.choice([".", "!", "?", ""]))
            if rng.random() < 0.1:
                lines.append("")
        path = os.path.join(directory, f"part{n}.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        paths.append(path)
    return paths


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(str(tmp_path_factory.mktemp("corpus")))


@pytest.fixture(scope="module")
def learned(corpus, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("vocab") / "vocab.txt")
    return learn_vocab(corpus, 1200, path)


def corpus_text(paths):
    lines = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            lines += [line.rstrip("\n") for line in f if line.strip()]
    return lines


def test_bert_layout_and_exact_size(learned):
    tokens = learned.tokens
    assert len(tokens) == 1200
    assert tokens[0] == "[PAD]"
    assert list(tokens[1:100]) == [f"[unused{i}]" for i in range(99)]
    assert tokens[100:104] == ("[UNK]", "[CLS]", "[SEP]", "[MASK]")
    assert tuple(learned.special) == (0, 100, 101, 102, 103)
    assert len(set(tokens)) == len(tokens)
    with open(learned.path, encoding="utf-8") as f:
        assert f.read().count("\n") == 1200


def test_compact_layout_below_bert_size(corpus, tmp_path):
    vocab = learn_vocab(corpus, 300, str(tmp_path / "small.txt"))
    assert vocab.size == 300 < BERT_LAYOUT_MIN_VOCAB_SIZE
    assert vocab.tokens[:5] == ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
    assert tuple(vocab.special) == (0, 1, 2, 3, 4)
    assert special_layout(BERT_LAYOUT_MIN_VOCAB_SIZE)[100:] == ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def test_learned_vocab_tokenizes_training_text(learned, corpus):
    lines = corpus_text(corpus)
    tok = Tokenizer(learned)
    ids, _ = tok.encode_batch(lines)
    assert np.count_nonzero(ids == learned.special.unk_id) / len(ids) < 0.001
    # Real subwords were learned, not just the alphabet: frequent words are single tokens and
    # words split into few pieces on average.
    for word in ["the", "of", "computer", "language", "."]:
        assert word in learned.tokens
    num_words = sum(len(line.split()) for line in lines)
    assert len(ids) < 2.0 * num_words


def test_normalisation_matches_tokenizer_settings(learned, corpus, tmp_path):
    # Lowercased and accent-stripped: no capitals or accents outside the special tokens.
    body = [t for t in learned.tokens if not t.startswith("[")]
    assert all(t == t.lower() for t in body)
    assert "é" not in "".join(body) and "i̇" not in body
    assert "naive" in body or "##e" in body
    # Continuations of punctuation / CJK can never match and are left out.
    assert "##." not in body and "##中" not in body and "中" in body
    cased = learn_vocab(corpus, 1200, str(tmp_path / "cased.txt"), do_lower_case=False)
    cased_body = [t for t in cased.tokens if not t.startswith("[")]
    assert "C" in cased_body and "é" in cased_body  # no lowercasing: no accent stripping (quirk)


def test_deterministic(corpus, learned, tmp_path):
    again = learn_vocab(corpus, 1200, str(tmp_path / "again.txt"))
    with open(learned.path, "rb") as a, open(again.path, "rb") as b:
        assert a.read() == b.read()
    assert again.sha256 == learned.sha256


def test_too_small_size_is_a_clear_error(corpus, tmp_path):
    out = tmp_path / "tiny.txt"
    with pytest.raises(ValueError, match=r"vocab size 20 is too small.*alphabet"):
        learn_vocab(corpus, 20, str(out))
    assert not out.exists() and os.listdir(tmp_path) == []
    for bad in (0, -5, True, 2.5):
        with pytest.raises(ValueError, match="positive integer"):
            learn_vocab(corpus, bad, str(out))


def test_empty_corpus_is_a_clear_error(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n  \n\x00\n", encoding="utf-8")
    with pytest.raises(ValueError, match="no words"):
        learn_vocab([str(empty)], 500, str(tmp_path / "v.txt"))


def test_written_atomically_replacing_existing_file(corpus, tmp_path):
    out = tmp_path / "vocab.txt"
    out.write_text("old\n", encoding="utf-8")
    vocab = learn_vocab(corpus, 300, str(out))
    assert vocab.size == 300 and out.read_text(encoding="utf-8").startswith("[PAD]\n")
    assert sorted(os.listdir(tmp_path)) == ["vocab.txt"]  # no temporary file left behind
    assert oct(os.stat(out).st_mode & 0o777) == "0o644"


def test_counting_is_independent_of_batching_and_bounded(corpus, monkeypatch):
    full = count_words(corpus)
    assert full["the"] > full["computer"] > 0 and "中" in full and "cafe" in full
    monkeypatch.setattr(vocab_learning, "BATCH_LINES", 7)
    assert count_words(corpus) == full
    # A line longer than the read chunk is read in pieces (bounded memory).
    monkeypatch.setattr(vocab_learning, "READ_CHUNK_CHARS", 64)
    chunked = count_words(corpus)
    assert abs(sum(chunked.values()) - sum(full.values())) < 0.05 * sum(full.values())
    # Overflowing the count table keeps the most frequent words.
    monkeypatch.setattr(vocab_learning, "MAX_DISTINCT_WORDS", 40)
    bounded = count_words(corpus)
    assert len(bounded) <= 40 + 7 * 15 and "the" in bounded  # cap + one batch of 7 lines


def test_undecodable_bytes_and_control_characters(tmp_path):
    path = tmp_path / "junk.txt"
    path.write_bytes(b"caf\xc3\xa9 \xff\xfe bad\x00word ok\r\n" * 30 + b"z" * 5000 + b"\n")
    vocab = learn_vocab([str(path)], 200, str(tmp_path / "v.txt"))
    body = "".join(t for t in vocab.tokens if not t.startswith("["))
    assert "\ufffd" not in body and "\x00" not in body and "\r" not in body
    assert "badword" in vocab.tokens or "##word" in vocab.tokens
