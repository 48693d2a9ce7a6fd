"""Text (single sentences or pairs) to model inputs without TensorFlow (fine-tuning on JAX).

The numpy twin of `encoding.TextEncoder.encode_examples`: the same layout ([CLS] a [SEP] /
[CLS] a [SEP] b [SEP], segment ids 0 then 1), the same truncation (BERT's `_truncate_seq_pair`
in closed form, `truncated_pair_lengths`) and, through `data.portable_tokenization`'s
`PortableTokenizer`, the same ids as the in-graph tokenizer (that module names the one class of
input where they differ). Nothing here imports TensorFlow (`backend_tokenizer` does, lazily,
on the TensorFlow backend only).
"""

from __future__ import annotations

from typing import Dict, Optional, Sequence

import numpy as np

from electra_tf.data.text.portable_tokenization import PortableTokenizer

# [CLS] a [SEP] and [CLS] a [SEP] b [SEP]: special tokens per sequence.
SINGLE_SPECIAL_TOKENS = 2
PAIR_SPECIAL_TOKENS = 3
FEATURE_NAMES = ("input_ids", "input_mask", "segment_ids")


def backend_tokenizer(vocab, do_lower_case: bool, strip_accents: bool):
    """The fine-tuning run's tokenizer: the in-graph `data.tokenization.Tokenizer` on the
    TensorFlow backend (the exported SavedModels run it), `PortableTokenizer` elsewhere (the
    same ids, `encode_batch` alike, no TensorFlow).

    Args:
        vocab: electra_tf.vocab.Vocab.
        do_lower_case, strip_accents: bool. BERT's normalisation.
    """
    # lazy: the numpy encoder above needs no Keras
    import keras

    if keras.backend.backend() == "tensorflow":
        # lazy: TensorFlow is optional here (JAX and PyTorch runs tokenize without it)
        from electra_tf.data.text.tokenization import Tokenizer

        return Tokenizer(vocab, do_lower_case=do_lower_case, strip_accents=strip_accents)
    return PortableTokenizer(vocab, do_lower_case=do_lower_case, strip_accents=strip_accents)


def truncated_pair_lengths(len_a, len_b, budget):
    """Closed form of `_truncate_seq_pair` on lengths (elementwise; see `encoding.py`).

    Args:
        len_a, len_b: int [batch] numpy arrays, or tf.Tensors (then computed in TensorFlow).
        budget: int. max_seq_length - 3.

    Returns:
        (new_len_a, new_len_b), int [batch].
    """
    if isinstance(len_a, (np.ndarray, np.generic, int)) and isinstance(
            len_b, (np.ndarray, np.generic, int)):
        minimum, maximum, where = np.minimum, np.maximum, np.where
    else:
        import tensorflow as tf

        minimum, maximum, where = tf.minimum, tf.maximum, tf.where
    over = len_a + len_b > budget
    cut_b = minimum(len_b, maximum(budget - len_a, budget // 2))
    new_b = where(over, cut_b, len_b)
    new_a = where(over, budget - new_b, len_a)
    return new_a, new_b


class PortableTextEncoder:
    """Raw text to `input_ids`, `input_mask`, `segment_ids` (int32 numpy), padded to
    max_seq_length, as `encoding.TextEncoder.encode_examples`.

    Args:
        tokenizer: data.portable_tokenization.PortableTokenizer (or anything with
            `encode_batch(texts) -> (ids, row_splits)` and `vocab`).
        max_seq_length: int. Length budget including [CLS]/[SEP].
    """

    def __init__(self, tokenizer, max_seq_length: int):
        if max_seq_length < PAIR_SPECIAL_TOKENS + 2:
            raise ValueError(f"max_seq_length must be >= {PAIR_SPECIAL_TOKENS + 2}, got {max_seq_length}")
        self.tokenizer = tokenizer
        self.max_seq_length = max_seq_length
        self.cls_id = tokenizer.vocab.special.cls_id
        self.sep_id = tokenizer.vocab.special.sep_id

    def _pieces(self, texts: Sequence[str]):
        ids, splits = self.tokenizer.encode_batch(list(texts))
        return ids.astype(np.int32), splits[:-1], np.diff(splits)

    def encode_examples(self, texts_a: Sequence[str], texts_b: Optional[Sequence[str]] = None,
                        batch_size: int = 512) -> Dict[str, np.ndarray]:
        """Encodes many texts (`batch_size` at a time through the tokenizer).

        Returns:
            dict of int32 numpy [n, max_seq_length].
        """
        n, length = len(texts_a), self.max_seq_length
        out = {k: np.zeros([n, length], np.int32) for k in FEATURE_NAMES}
        for start in range(0, n, batch_size):
            stop = min(n, start + batch_size)
            ids_a, starts_a, len_a = self._pieces(texts_a[start:stop])
            if texts_b is None:
                len_a = np.minimum(len_a, length - SINGLE_SPECIAL_TOKENS)
                ids_b = starts_b = len_b = None
            else:
                ids_b, starts_b, len_b = self._pieces(texts_b[start:stop])
                len_a, len_b = truncated_pair_lengths(len_a, len_b, length - PAIR_SPECIAL_TOKENS)
            for i in range(stop - start):
                row = [self.cls_id, *ids_a[starts_a[i]:starts_a[i] + len_a[i]], self.sep_id]
                first = len(row)
                if ids_b is not None:
                    row += [*ids_b[starts_b[i]:starts_b[i] + len_b[i]], self.sep_id]
                out["input_ids"][start + i, :len(row)] = row
                out["input_mask"][start + i, :len(row)] = 1
                out["segment_ids"][start + i, first:len(row)] = 1
        return out
