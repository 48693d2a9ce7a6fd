"""The exported tagging signatures: whitespace-separated words in, one tag per word out.

`<task>(text)`: `text` tf.string [batch], words separated by whitespace (Python's `str.split`
whitespace, as the CoNLL reader splits lines) -> `tags` tf.string [batch, max_words] (the BIOES
tag of each word; "" past the sentence and for words cut by the official truncation),
`tag_ids` int32 [batch, max_words] (-1 there), `num_words` and `num_tagged` int32 [batch].

`<task>_ids(input_ids, input_mask, segment_ids, labeled_positions)` -> `tag_ids` int32
[batch, n], `tags` (the prediction at each labeled position).

The features are built in-graph exactly as `features.featurize` builds the training features:
each word WordPiece-tokenized on its own, the official truncation rule (a word is kept iff
W + 1 + (pieces of the words before it) + 1 <= L, W = words + 2), the overflow cut at L,
segment ids 1 on real tokens (tested against the Python features on real text).
"""

from __future__ import annotations

import sys
from typing import Dict, Sequence

import tensorflow as tf
import tensorflow_text as tf_text

from electra_tf.data.tokenization import Tokenizer
from electra_tf.finetuning.export import TaskServing, int_spec, text_spec

# Python's str.split() whitespace (the CoNLL reader's word boundaries), as an RE2 class.
_PYTHON_WHITESPACE = "[" + "".join(f"\\x{{{cp:04x}}}" for cp in range(sys.maxunicode + 1)
                                   if chr(cp).isspace()) + "]+"


def _exclusive_row_cumsum(values: tf.Tensor, row_splits: tf.Tensor) -> tf.Tensor:
    """Per-row exclusive cumulative sum of a flat [n] int tensor grouped by `row_splits`."""
    total = tf.concat([tf.zeros([1], values.dtype), tf.cumsum(values)], 0)
    row_starts = tf.gather(total, row_splits[:-1])
    lengths = row_splits[1:] - row_splits[:-1]
    return total[:-1] - tf.repeat(row_starts, lengths)


class TaggingEncoder(tf.Module):
    """Raw text -> tagging features, in-graph (module docstring).

    Args:
        tokenizer: the task's Tokenizer (lower-cased unless `tagging_cased`).
        max_seq_length: int.
    """

    def __init__(self, tokenizer: Tokenizer, max_seq_length: int, name=None):
        super().__init__(name=name)
        self.graph_tokenizer = tokenizer.graph_tokenizer()
        self.max_seq_length = max_seq_length
        self.cls_id = tokenizer.vocab.special.cls_id
        self.sep_id = tokenizer.vocab.special.sep_id

    def words(self, text: tf.Tensor) -> tf.RaggedTensor:
        """tf.string [batch, (words)]."""
        return tf_text.regex_split(text, _PYTHON_WHITESPACE)

    def encode(self, text: tf.Tensor) -> Dict[str, tf.Tensor]:
        """Features of a batch of sentences.

        Returns:
            int32 `input_ids`, `input_mask`, `segment_ids` [batch, seq] (seq = the longest),
            `labeled_positions` [batch, max_kept_words], and `num_words`, `num_tagged` [batch].
        """
        length = self.max_seq_length
        words = self.words(text)
        splits = words.row_splits
        pieces = tf.cast(self.graph_tokenizer.tokenize(words.flat_values), tf.int32)
        counts = tf.cast(pieces.row_lengths(), tf.int64)
        num_words = tf.cast(words.row_lengths(), tf.int64)
        budget = tf.repeat(num_words + 2, num_words)  # W of each word's sentence
        before = 1 + _exclusive_row_cumsum(counts, splits)  # position of each word's first piece
        keep = budget + before + 1 <= length
        kept_words = tf.RaggedTensor.from_row_splits(keep, splits)
        num_kept = tf.reduce_sum(tf.cast(kept_words, tf.int64), axis=1)
        kept_pieces = tf.ragged.boolean_mask(pieces, keep)
        body = tf.RaggedTensor.from_row_lengths(kept_pieces, num_kept).merge_dims(1, 2)
        batch = tf.shape(text, out_type=tf.int64)[0]
        has_cls = num_words + 2 + 1 <= length  # official: even [CLS] may not fit (tiny L)
        cls = tf.RaggedTensor.from_row_lengths(
            tf.fill([tf.reduce_sum(tf.cast(has_cls, tf.int64))], self.cls_id),
            tf.cast(has_cls, tf.int64))
        sep = tf.RaggedTensor.from_tensor(tf.fill([batch, 1], self.sep_id))
        ids = tf.concat([cls, body, sep], axis=1)
        # Overflow (one word with very many pieces): cut at L - 1 and close with [SEP].
        too_long = ids.row_lengths() > length
        cut = tf.concat([ids[:, :length - 1], sep], axis=1)
        ids = _select_rows(too_long, cut, ids)
        positions = tf.RaggedTensor.from_row_lengths(tf.boolean_mask(before, keep), num_kept)
        positions = tf.ragged.boolean_mask(positions, positions < tf.where(
            too_long, tf.cast(length - 1, tf.int64), tf.cast(length, tf.int64))[:, None])
        input_ids = ids.to_tensor(default_value=0)
        return {
            "input_ids": input_ids,
            "input_mask": tf.ones_like(ids).to_tensor(default_value=0),
            "segment_ids": tf.ones_like(ids).to_tensor(default_value=0),
            "labeled_positions": tf.cast(positions.to_tensor(default_value=0), tf.int32),
            "num_words": tf.cast(num_words, tf.int32),
            "num_tagged": tf.cast(positions.row_lengths(), tf.int32),
        }


def _select_rows(choose_a: tf.Tensor, a: tf.RaggedTensor, b: tf.RaggedTensor) -> tf.RaggedTensor:
    """Row i of `a` where choose_a[i], else of `b` (ragged [batch, (n)])."""
    rows = tf.range(tf.size(choose_a, out_type=tf.int64), dtype=tf.int64)
    rows_a = tf.boolean_mask(rows, choose_a)
    rows_b = tf.boolean_mask(rows, tf.logical_not(choose_a))
    merged = tf.concat([tf.gather(a, rows_a), tf.gather(b, rows_b)], axis=0)
    return tf.gather(merged, tf.math.invert_permutation(tf.concat([rows_a, rows_b], 0)))


def tagging_serving(model, task_name: str, tokenizer: Tokenizer, labels: Sequence[str],
                    max_seq_length: int) -> TaskServing:
    """The `<task>` and `<task>_ids` signatures of a tagging task (module docstring)."""
    encoder = TaggingEncoder(tokenizer, max_seq_length)
    label_names = tf.constant(list(labels), tf.string)
    positions_key = f"{task_name}_labeled_positions"

    def tag(features):
        outputs = model.task_outputs(features, task_name, training=False)
        return outputs["predictions"]

    @tf.function(input_signature=[text_spec("text")])
    def serve_text(text):
        features = encoder.encode(text)
        tag_ids = tag({"input_ids": features["input_ids"], "input_mask": features["input_mask"],
                       "segment_ids": features["segment_ids"],
                       positions_key: features["labeled_positions"]})
        num_words, num_tagged = features["num_words"], features["num_tagged"]
        width = tf.reduce_max(tf.concat([num_words, [0]], 0))
        tagged = tf.range(tf.shape(tag_ids)[1])[None, :] < num_tagged[:, None]
        tag_ids = tf.where(tagged, tag_ids, -1)
        tag_ids = tf.pad(tag_ids, [[0, 0], [0, tf.maximum(width - tf.shape(tag_ids)[1], 0)]],
                         constant_values=-1)[:, :width]
        tags = tf.where(tag_ids >= 0, tf.gather(label_names, tf.maximum(tag_ids, 0)), "")
        return {"tags": tags, "tag_ids": tag_ids, "num_words": num_words, "num_tagged": num_tagged}

    @tf.function(input_signature=[int_spec("input_ids"), int_spec("input_mask"),
                                  int_spec("segment_ids"), int_spec("labeled_positions")])
    def serve_ids(input_ids, input_mask, segment_ids, labeled_positions):
        tag_ids = tag({"input_ids": input_ids, "input_mask": input_mask,
                       "segment_ids": segment_ids, positions_key: labeled_positions})
        return {"tag_ids": tag_ids, "tags": tf.gather(label_names, tag_ids)}

    return TaskServing({task_name: serve_text, f"{task_name}_ids": serve_ids},
                       {"encoder": encoder})
