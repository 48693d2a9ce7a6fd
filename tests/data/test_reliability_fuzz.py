"""Fuzzing the builder's text path with hypothesis: random bytes and random unicode (every
category, combining marks, RTL, emoji, control characters, lone surrogates, very long tokens)
through the tokenizer, the sentence packer and both feature encoders. No crash, and every example
is well formed: [CLS] first, one [SEP] per segment ending each, segment ids 0 then 1, the mask a
prefix of ones, zero padding, the fixed length, and ids inside the vocab."""

import functools
import random

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from electra_tf.data.build.example_builder import ExampleBuilder, example_features
from electra_tf.data.records.tfrecord_io import ExampleSerializer, parse_example
from electra_tf.data.text.tokenization import Tokenizer
from electra_tf.vocab import load_vocab
from tests import pretraining_fixtures as fx

MAX_SEQ_LENGTH = 24
FUZZ = settings(max_examples=60, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# Tokens with non-ASCII, RTL and emoji pieces and continuations, so WordPiece does real work.
EXTRA_TOKENS = ["a", "b", "ab", "##a", "##b", "##c", "é", "ש", "##ל", "ום", "😀", "中", "##x",
                "the", "##s", "ﷺ", "ـ", "."]


@functools.lru_cache(maxsize=None)
def _tokenizer():
    import tempfile
    path = tempfile.NamedTemporaryFile(suffix="vocab.txt", delete=False).name
    fx.write_vocab(path, fx.vocab_tokens(20) + EXTRA_TOKENS)
    return Tokenizer(load_vocab(path))


ANY_CHAR = st.characters(codec=None)  # every category, surrogates included
LONG_TOKEN = st.builds(lambda c, n: c * n, st.sampled_from(["a", "é", "😀", "ש", "\u0301", "ab"]),
                       st.integers(100, 3000))
LINE = st.one_of(
    st.text(ANY_CHAR, max_size=80),
    st.text(st.sampled_from("ab é ש ל ום 😀 中 \u0301\u0308\u200f\u202e\u200d\t\x00\x07\r\ufeff."),
            max_size=80),
    LONG_TOKEN,
    st.binary(max_size=80),
)
DOCUMENTS = st.lists(st.lists(LINE, min_size=1, max_size=6), min_size=1, max_size=4)


def _check(features, vocab):
    special = vocab.special
    ids = np.asarray(features["input_ids"])
    mask = np.asarray(features["input_mask"])
    segments = np.asarray(features["segment_ids"])
    assert ids.shape == mask.shape == segments.shape == (MAX_SEQ_LENGTH,)
    n = int(mask.sum())
    assert mask[:n].all() and not mask[n:].any()
    assert (ids[n:] == 0).all() and (segments[n:] == 0).all()
    assert ids[0] == special.cls_id
    assert ((ids >= 0) & (ids < vocab.size)).all()
    seps = np.flatnonzero(ids[:n] == special.sep_id)
    assert 1 <= len(seps) <= 2 and seps[-1] == n - 1
    assert seps[0] >= 2  # segment A is never empty
    assert (segments[:seps[0] + 1] == 0).all()
    assert (segments[seps[0] + 1:n] == 1).all()
    if len(seps) == 2:
        assert seps[1] - seps[0] >= 2  # segment B never empty
    assert not np.isin(ids[1:n], [special.cls_id, special.pad_id, special.mask_id]).any()


@FUZZ
@given(documents=DOCUMENTS, seed=st.integers(0, 2**31 - 1))
def test_random_text_packs_into_well_formed_examples(documents, seed):
    tokenizer = _tokenizer()
    vocab = tokenizer.vocab
    lines = [line for doc in documents for line in doc]
    ids, splits = tokenizer.encode_batch(lines)
    assert ids.dtype == np.int32
    assert ((ids >= 0) & (ids < vocab.size)).all()
    assert len(splits) == len(lines) + 1 and splits[-1] == len(ids)
    special = vocab.special
    assert not np.isin(ids, [special.cls_id, special.sep_id, special.pad_id, special.mask_id]).any()

    builder = ExampleBuilder(MAX_SEQ_LENGTH, random.Random(seed))
    examples, k = [], 0
    for doc in documents:
        for _ in doc:
            sentence = ids[splits[k]:splits[k + 1]].tolist()
            k += 1
            if sentence:
                example = builder.add_sentence(sentence)
                if example is not None:
                    examples.append(example)
        example = builder.end_document()
        if example is not None:
            examples.append(example)
    if not examples:
        return
    serialized = ExampleSerializer(MAX_SEQ_LENGTH, special.cls_id, special.sep_id).serialize(examples)
    parsed = parse_example(tf.constant(serialized), MAX_SEQ_LENGTH)
    for i, example in enumerate(examples):
        features = example_features(example, MAX_SEQ_LENGTH, special.cls_id, special.sep_id)
        _check(features, vocab)
        for name in features:  # the fast encoder writes the same features
            np.testing.assert_array_equal(parsed[name][i].numpy(), features[name])
