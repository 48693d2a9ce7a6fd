"""Text (single sentences or pairs) to model inputs, in-graph, as BERT/ELECTRA fine-tuning does.

    single: [CLS] a [SEP]             segment_ids 0 ... 0
    pair:   [CLS] a [SEP] b [SEP]     segment_ids 0 for [CLS] a [SEP], 1 for b [SEP]

Pairs longer than `max_seq_length - 3` are truncated longest-first exactly as BERT's
`_truncate_seq_pair` (official `finetune/feature_spec`-era code): repeatedly drop the last token
of the longer sequence, of b when they are equal. That loop has a closed form, computed here on
whole batches: with m = max_seq_length - 3 and lengths (la, lb), la + lb > m,

    lb' = min(lb, max(m - la, m // 2)),    la' = m - lb'.

(If b is the longer it is cut to m - la, until that would make it shorter than a; past that both
end at the halves, b taking the floor because ties cut b.) Single sentences keep their first
max_seq_length - 2 tokens.

The same `TextEncoder` builds the training features and runs inside the exported SavedModel, so
served text is encoded exactly as training text was.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from electra_tf.data.text.tokenization import Tokenizer
from electra_tf.finetuning.portable_encoding import (  # noqa: F401 (re-exported)
    FEATURE_NAMES, PAIR_SPECIAL_TOKENS, SINGLE_SPECIAL_TOKENS, truncated_pair_lengths)


def truncate_seq_pair_reference(tokens_a: List, tokens_b: List, max_length: int) -> None:
    """BERT's `_truncate_seq_pair`, verbatim semantics (in place): the test reference."""
    while len(tokens_a) + len(tokens_b) > max_length:
        if len(tokens_a) > len(tokens_b):
            tokens_a.pop()
        else:
            tokens_b.pop()


def _keep_first(ragged: tf.RaggedTensor, lengths: tf.Tensor) -> tf.RaggedTensor:
    """The first lengths[i] items of each row of `ragged` [batch, (n)]."""
    lengths = tf.cast(lengths, ragged.row_splits.dtype)
    positions = tf.ragged.range(ragged.row_lengths())
    keep = positions < tf.expand_dims(lengths, 1)
    return tf.ragged.boolean_mask(ragged, keep)


class TextEncoder(tf.Module):
    """Raw text to `input_ids`, `input_mask`, `segment_ids` (int32), in one graph.

    Args:
        tokenizer: electra_tf.data.text.tokenization.Tokenizer (BERT FullTokenizer semantics).
        max_seq_length: int. Length budget including [CLS]/[SEP].
    """

    def __init__(self, tokenizer: Tokenizer, max_seq_length: int, name=None):
        super().__init__(name=name)
        if max_seq_length < PAIR_SPECIAL_TOKENS + 2:
            raise ValueError(f"max_seq_length must be >= {PAIR_SPECIAL_TOKENS + 2}, got {max_seq_length}")
        self.graph_tokenizer = tokenizer.graph_tokenizer()
        self.max_seq_length = max_seq_length
        self.cls_id = tokenizer.vocab.special.cls_id
        self.sep_id = tokenizer.vocab.special.sep_id

    def _pieces(self, text: tf.Tensor) -> tf.RaggedTensor:
        return tf.cast(self.graph_tokenizer.tokenize(text), tf.int32)

    def encode(self, text_a: tf.Tensor, text_b: Optional[tf.Tensor] = None,
               pad_to_max: bool = False) -> Dict[str, tf.Tensor]:
        """Encodes a batch.

        Args:
            text_a: tf.string [batch].
            text_b: tf.string [batch] or None (single-sentence task).
            pad_to_max: pad to max_seq_length (training features) instead of to the longest
                sequence of the batch (serving).

        Returns:
            dict of int32 [batch, seq_length]: input_ids, input_mask, segment_ids.
        """
        a = self._pieces(text_a)
        batch = a.nrows()
        cls = tf.RaggedTensor.from_tensor(tf.fill([batch, 1], self.cls_id))
        sep = tf.RaggedTensor.from_tensor(tf.fill([batch, 1], self.sep_id))
        if text_b is None:
            a = a[:, : self.max_seq_length - SINGLE_SPECIAL_TOKENS]
            ids = tf.concat([cls, a, sep], axis=1)
            segments = tf.zeros_like(ids)
        else:
            b = self._pieces(text_b)
            new_a, new_b = truncated_pair_lengths(
                a.row_lengths(), b.row_lengths(),
                tf.constant(self.max_seq_length - PAIR_SPECIAL_TOKENS, tf.int64))
            a = _keep_first(a, new_a)
            b = _keep_first(b, new_b)
            first = tf.concat([cls, a, sep], axis=1)
            second = tf.concat([b, sep], axis=1)
            ids = tf.concat([first, second], axis=1)
            segments = tf.concat([tf.zeros_like(first), tf.ones_like(second)], axis=1)
        shape = [None, self.max_seq_length] if pad_to_max else None
        return {
            "input_ids": ids.to_tensor(default_value=0, shape=shape),
            "input_mask": tf.ones_like(ids).to_tensor(default_value=0, shape=shape),
            "segment_ids": segments.to_tensor(default_value=0, shape=shape),
        }

    def encode_examples(self, texts_a: Sequence[str], texts_b: Optional[Sequence[str]] = None,
                        batch_size: int = 512) -> Dict[str, np.ndarray]:
        """Encodes many texts to numpy features padded to max_seq_length (training/eval data).

        Returns:
            dict of int32 numpy [n, max_seq_length].
        """
        fn = self._encode_single if texts_b is None else self._encode_pair
        out: Dict[str, List[np.ndarray]] = {k: [] for k in FEATURE_NAMES}
        for start in range(0, len(texts_a), batch_size):
            args = [tf.constant(list(texts_a[start:start + batch_size]), tf.string)]
            if texts_b is not None:
                args.append(tf.constant(list(texts_b[start:start + batch_size]), tf.string))
            features = fn(*args)
            for key in FEATURE_NAMES:
                out[key].append(features[key].numpy())
        if not out["input_ids"]:
            return {k: np.zeros([0, self.max_seq_length], np.int32) for k in FEATURE_NAMES}
        return {k: np.concatenate(v) for k, v in out.items()}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def _encode_single(self, text_a):
        return self.encode(text_a, pad_to_max=True)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string), tf.TensorSpec([None], tf.string)])
    def _encode_pair(self, text_a, text_b):
        return self.encode(text_a, text_b, pad_to_max=True)

