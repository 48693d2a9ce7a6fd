"""The exported tagging signatures: text in, one tag per word out (ner: and its entities).

`<task>(text)`: `text` tf.string [batch] -> `tags` tf.string [batch, max_words] (the tag of each
word; "" past the sentence and for words cut by the official truncation), `tag_ids` int32
[batch, max_words] (-1 there), `num_words` and `num_tagged` int32 [batch].

Words: chunk splits `text` at whitespace (Python's `str.split` whitespace, as the CoNLL reader
splits lines). ner and pos take raw text: it is split at whitespace and around punctuation
(each punctuation character, ASCII or Unicode category P, is a word of its own, as BERT's basic
tokenizer splits), so "Merkel, in Paris." is 5 words; they add `words` tf.string and
`word_starts`, `word_ends` int32 [batch, max_words]: character offsets (Unicode code points,
end exclusive: Python's `text[start:end]`) into the input string, -1 past the sentence.

ner adds its entities (`entities.py`, the metric's rule and mode, as tables): `entity_types`
tf.string [batch, max_entities] ("" past the last), `entity_starts`, `entity_ends` int32
(character offsets as above, -1 past the last), `entity_texts` tf.string (the input's text
between them) and `num_entities` int32 [batch].

`<task>_ids(input_ids, input_mask, segment_ids, labeled_positions)` -> `tag_ids` int32
[batch, n], `tags` (the prediction at each labeled position).

The features are built in-graph exactly as `features.featurize` builds the training features:
each word WordPiece-tokenized on its own, the official truncation rule (a word is kept iff
W + 1 + (pieces of the words before it) + 1 <= L, W = words + 2; ner and pos: iff 1 + (pieces of
the words before it) + 2 <= L), the overflow cut at L, segment ids 1 on real tokens (tested
against the Python features on real text).
"""

from __future__ import annotations

import sys
from typing import Dict, Optional, Sequence

import tensorflow as tf
import tensorflow_text as tf_text

from electra_tf.data.text.tokenization import Tokenizer
from electra_tf.finetuning.export import TaskServing, int_spec, text_spec
from electra_tf.finetuning.tagging.entities import decoding_tables

# Python's str.split() whitespace (the CoNLL reader's word boundaries), as an RE2 class.
_PYTHON_WHITESPACE = "[" + "".join(f"\\x{{{cp:04x}}}" for cp in range(sys.maxunicode + 1)
                                   if chr(cp).isspace()) + "]+"
# BERT's punctuation (`_is_punctuation`): the ASCII non-alphanumeric printables and category P.
_PUNCTUATION = r"[!-/:-@\[-\x{60}{-~\p{P}]"


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
        split_punctuation: bool. Words end at punctuation too (ner, pos), not only whitespace.
        official_truncation: bool. The official rule (chunk), else ner/pos's
            (`features.truncate`).
    """

    def __init__(self, tokenizer: Tokenizer, max_seq_length: int, split_punctuation: bool = False,
                 official_truncation: bool = True, name=None):
        super().__init__(name=name)
        self.graph_tokenizer = tokenizer.graph_tokenizer()
        self.max_seq_length = max_seq_length
        self.cls_id = tokenizer.vocab.special.cls_id
        self.sep_id = tokenizer.vocab.special.sep_id
        self.split_punctuation = split_punctuation
        self.official_truncation = official_truncation

    def words_with_offsets(self, text: tf.Tensor):
        """(words tf.string [batch, (words)], byte starts, byte ends int64 [batch, (words)])."""
        if self.split_punctuation:
            return tf_text.regex_split_with_offsets(
                text, f"{_PYTHON_WHITESPACE}|{_PUNCTUATION}", _PUNCTUATION)
        return tf_text.regex_split_with_offsets(text, _PYTHON_WHITESPACE)

    def words(self, text: tf.Tensor) -> tf.RaggedTensor:
        """tf.string [batch, (words)]."""
        return self.words_with_offsets(text)[0]

    def encode(self, text: tf.Tensor) -> Dict[str, tf.Tensor]:
        """Features of a batch of sentences.

        Returns:
            int32 `input_ids`, `input_mask`, `segment_ids` [batch, seq] (seq = the longest),
            `labeled_positions` [batch, max_kept_words], `num_words`, `num_tagged` [batch], and
            the words as `words` tf.string, `word_starts`, `word_ends` int32 [batch, max_words]
            (character offsets into `text`, end exclusive; "" and -1 past the sentence).
        """
        length = self.max_seq_length
        words, byte_starts, byte_ends = self.words_with_offsets(text)
        splits = words.row_splits
        pieces = tf.cast(self.graph_tokenizer.tokenize(words.flat_values), tf.int32)
        counts = tf.cast(pieces.row_lengths(), tf.int64)
        num_words = tf.cast(words.row_lengths(), tf.int64)
        before = 1 + _exclusive_row_cumsum(counts, splits)  # position of each word's first piece
        if self.official_truncation:
            budget = tf.repeat(num_words + 2, num_words)  # W of each word's sentence
            keep = budget + before + 1 <= length
        else:  # the first piece before the closing [SEP]
            keep = before + 2 <= length
        kept_words = tf.RaggedTensor.from_row_splits(keep, splits)
        num_kept = tf.reduce_sum(tf.cast(kept_words, tf.int64), axis=1)
        kept_pieces = tf.ragged.boolean_mask(pieces, keep)
        body = tf.RaggedTensor.from_row_lengths(kept_pieces, num_kept).merge_dims(1, 2)
        batch = tf.shape(text, out_type=tf.int64)[0]
        has_cls = num_words + 2 + 1 <= length  # official: even [CLS] may not fit (tiny L)
        if not self.official_truncation:
            has_cls = tf.ones_like(num_words, tf.bool)
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
            "words": words.to_tensor(default_value=""),
            "word_starts": char_offsets(text, byte_starts),
            "word_ends": char_offsets(text, byte_ends),
        }


def char_offsets(text: tf.Tensor, byte_offsets: tf.RaggedTensor) -> tf.Tensor:
    """Byte offsets at character boundaries -> character (code point) offsets.

    Args:
        text: tf.string [batch].
        byte_offsets: int64 [batch, (n)].

    Returns:
        int32 [batch, max n]: the number of characters before each offset; -1 as padding.
    """
    _, char_starts = tf.strings.unicode_decode_with_offsets(text, "UTF-8")
    batch = tf.shape(text, out_type=tf.int64)[0]
    beyond = tf.fill([batch, 1], tf.int64.max)  # a column even for a batch of empty strings
    sorted_starts = tf.concat([char_starts.to_tensor(default_value=tf.int64.max), beyond], 1)
    offsets = tf.searchsorted(sorted_starts, byte_offsets.to_tensor(default_value=0), side="left")
    valid = tf.sequence_mask(byte_offsets.row_lengths(), tf.shape(offsets)[1])
    return tf.where(valid, tf.cast(offsets, tf.int32), -1)


class EntityDecoder(tf.Module):
    """Tag ids -> entities, by `entities.decoding_tables` (the metric's rule, in-graph).

    Args:
        labels: label names in id order.
        scheme: "BIO" or "BIOES".
        mode: "default" or "strict".
    """

    def __init__(self, labels: Sequence[str], scheme: str, mode: str, name=None):
        super().__init__(name=name)
        links, starts, ends, types = decoding_tables(labels, scheme, mode)
        self.none_id = len(labels)
        self.links = tf.constant(links)
        self.can_start = tf.constant(starts)
        self.can_end = tf.constant(ends)
        self.types = tf.constant(types, tf.string)

    def __call__(self, tag_ids: tf.Tensor) -> Dict[str, tf.Tensor]:
        """Entities of each row.

        Args:
            tag_ids: int32 [batch, words]; -1 for no tag (padding, cut words: read as "O").

        Returns:
            `first_words`, `last_words` int32 [batch, max_entities] (-1 padding), `types`
            tf.string ("" padding), `num_entities` int32 [batch].
        """
        tags = tf.where(tag_ids >= 0, tag_ids, self.none_id)
        batch, width = tf.shape(tags)[0], tf.shape(tags)[1]
        previous = tf.concat([tf.fill([batch, 1], self.none_id), tags[:, :-1]], 1)
        breaks = tf.logical_not(tf.gather_nd(self.links, tf.stack([previous, tags], -1)))
        # Runs of linked tags: the last word of the run each word is in.
        run = tf.cumsum(tf.cast(breaks, tf.int32), axis=1) - 1 + tf.range(batch)[:, None] * width
        positions = tf.broadcast_to(tf.range(width)[None, :], tf.shape(tags))
        run_last = tf.math.unsorted_segment_max(positions, run, batch * width)
        last = tf.gather(run_last, run)
        is_entity = (breaks & tf.gather(self.can_start, tags)
                     & tf.gather(self.can_end, tf.gather(tags, last, batch_dims=1)))
        first_words = tf.ragged.boolean_mask(positions, is_entity)
        last_words = tf.ragged.boolean_mask(last, is_entity)
        types = tf.ragged.boolean_mask(tf.gather(self.types, tags), is_entity)
        return {"first_words": first_words.to_tensor(default_value=-1),
                "last_words": last_words.to_tensor(default_value=-1),
                "types": types.to_tensor(default_value=""),
                "num_entities": tf.cast(first_words.row_lengths(), tf.int32)}


def _select_rows(choose_a: tf.Tensor, a: tf.RaggedTensor, b: tf.RaggedTensor) -> tf.RaggedTensor:
    """Row i of `a` where choose_a[i], else of `b` (ragged [batch, (n)])."""
    rows = tf.range(tf.size(choose_a, out_type=tf.int64), dtype=tf.int64)
    rows_a = tf.boolean_mask(rows, choose_a)
    rows_b = tf.boolean_mask(rows, tf.logical_not(choose_a))
    merged = tf.concat([tf.gather(a, rows_a), tf.gather(b, rows_b)], axis=0)
    return tf.gather(merged, tf.math.invert_permutation(tf.concat([rows_a, rows_b], 0)))


def tagging_serving(model, task_name: str, tokenizer: Tokenizer, labels: Sequence[str],
                    max_seq_length: int, raw_text: bool = False,
                    decoder: Optional[EntityDecoder] = None) -> TaskServing:
    """The `<task>` and `<task>_ids` signatures of a tagging task (module docstring).

    Args:
        raw_text: ner / pos: split words at punctuation too, return their character offsets, and
            truncate as ner / pos train (`features.truncate`).
        decoder: return the entities too (ner).
    """
    encoder = TaggingEncoder(tokenizer, max_seq_length, split_punctuation=raw_text,
                             official_truncation=not raw_text)
    label_names = tf.constant(list(labels), tf.string)
    positions_key = f"{task_name}_labeled_positions"

    def tag(features):
        outputs = model.task_outputs(features, task_name, training=False)
        # tf.argmax of the logits, not the head's keras.ops argmax (the same labels): on
        # TensorFlow keras' float argmax guards -0.0 with a Bitcast, which ONNX (to-onnx, opset
        # 15) has no op for. Classification serving does the same.
        return tf.argmax(outputs["logits"], axis=-1, output_type=tf.int32)

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
        out = {"tags": tags, "tag_ids": tag_ids, "num_words": num_words, "num_tagged": num_tagged}
        if raw_text:
            out.update({key: features[key] for key in ("words", "word_starts", "word_ends")})
        if decoder is not None:
            out.update(_entity_outputs(text, decoder(tag_ids), features))
        return out

    @tf.function(input_signature=[int_spec("input_ids"), int_spec("input_mask"),
                                  int_spec("segment_ids"), int_spec("labeled_positions")])
    def serve_ids(input_ids, input_mask, segment_ids, labeled_positions):
        tag_ids = tag({"input_ids": input_ids, "input_mask": input_mask,
                       "segment_ids": segment_ids, positions_key: labeled_positions})
        return {"tag_ids": tag_ids, "tags": tf.gather(label_names, tag_ids)}

    trackables = {"encoder": encoder}
    if decoder is not None:
        trackables["decoder"] = decoder
    return TaskServing({task_name: serve_text, f"{task_name}_ids": serve_ids}, trackables)


def _entity_outputs(text: tf.Tensor, found: Dict[str, tf.Tensor],
                    features: Dict[str, tf.Tensor]) -> Dict[str, tf.Tensor]:
    """The `entity_*` outputs: character offsets and text of each entity (module docstring)."""
    present = found["first_words"] >= 0
    starts = tf.gather(features["word_starts"], tf.maximum(found["first_words"], 0), batch_dims=1)
    ends = tf.gather(features["word_ends"], tf.maximum(found["last_words"], 0), batch_dims=1)
    starts, ends = tf.where(present, starts, -1), tf.where(present, ends, -1)
    whole = tf.broadcast_to(text[:, None], tf.shape(starts))
    texts = tf.strings.substr(whole, tf.maximum(starts, 0), tf.maximum(ends - starts, 0),
                              unit="UTF8_CHAR")
    return {"entity_types": found["types"], "entity_starts": starts, "entity_ends": ends,
            "entity_texts": tf.where(present, texts, ""), "num_entities": found["num_entities"]}
