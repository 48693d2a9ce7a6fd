"""The exported QA signature: question and context strings in, answer spans out, all in-graph.

`<task>(question, context)`, tf.string [batch] each ->

- `answer` tf.string [batch]: the official prediction (SQuAD 2.0: the best non-null answer;
  "empty" when no span survives the filters, as the official decoder);
- `answer_start`, `answer_end` int32 [batch]: the answer's character offsets in the context
  (`context[answer_start:answer_end] == answer`; -1 for "empty");
- `score` float32 [batch]: start + end score of the answer (log-probabilities with joint
  prediction, else logits);
- `null_odds` float32 [batch]: the minimum answerable logit over the windows (1e6 without a
  window); SQuAD 2.0's "no answer" odds, also computed (and trained, as officially) for the
  other QA tasks;
- `has_answer` bool [batch]: a span survived and, for `squad`, null_odds <= qa_na_threshold.

`<task>_ids(input_ids, input_mask, segment_ids)` int32 [batch, seq] -> the head's outputs for
windows already featurized (what the ONNX export converts): `start_logits`; with
`joint_prediction` `start_top_log_probs` / `start_top_index` [batch, beam] and `end_top_log_probs`
/ `end_top_index` [batch, beam, beam], else `end_logits`; with `answerable_classifier`
`answerable_logit` [batch].

The same steps as training and evaluation (`data.split_words`, `features.featurize`,
`decoding.Decoder`, tested to give the same answers on real text): whitespace words of the context
(space, \\t, \\r, \\n, U+202F); each word WordPiece-tokenized on its own; the question's first
`max_query_length` WordPieces; `doc_stride` windows of max_seq_length - len(query) - 3
sub-tokens; max-context flags (ties to the earliest window); the head's beam (or top n_best
starts x ends); the candidate filters; the best candidate over the windows (the first in window,
start, end order on ties); `get_final_text` against the covered words.
"""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf
import tensorflow_text as tf_text

from electra_tf.data.text.basic_tokenizer import GraphBasicTokenizer
from electra_tf.data.text.tokenization import Tokenizer
from electra_tf.finetuning.export import TaskServing, int_spec, text_spec
from electra_tf.finetuning.qa.decoding import EMPTY_PREDICTION, NULL_SCORE_INIT

_QA_WHITESPACE = "[ \\t\\r\\n\\x{202f}]+"  # data.QA_WHITESPACE
_NEG = -1e30


def _first_argmax(values: tf.Tensor) -> tf.Tensor:
    """Index of the first maximum along the last axis (tf.argmax does not promise the first)."""
    best = tf.reduce_max(values, axis=-1, keepdims=True)
    index = tf.range(tf.shape(values)[-1])
    big = tf.shape(values)[-1]
    return tf.reduce_min(tf.where(values >= best, index, big), axis=-1)


class _WindowLayout(NamedTuple):
    """Where each record's window lies (`QAEncoder.records`); a record is one window.

    Attributes:
        example: int64 [records]. The question of the record.
        window: int64 [records]. The window's index among its question's.
        step: int64 [records]. The stride between the question's windows.
        doc_start: int64 [records]. The window's first context sub-token.
        length: int64 [records]. Context sub-tokens in the window.
        num_windows: int64 [batch]. Windows per question (0 for an empty context).
    """

    example: tf.Tensor
    window: tf.Tensor
    step: tf.Tensor
    doc_start: tf.Tensor
    length: tf.Tensor
    num_windows: tf.Tensor


class QAEncoder(tf.Module):
    """Question + context -> window records, decoding maps and the final text, in-graph.

    Args:
        tokenizer: the run's Tokenizer.
        max_seq_length, max_query_length, doc_stride: official hparams.
    """

    def __init__(self, tokenizer: Tokenizer, max_seq_length: int, max_query_length: int,
                 doc_stride: int, name=None):
        super().__init__(name=name)
        self.graph_tokenizer = tokenizer.graph_tokenizer()
        self.basic_tokenizer = GraphBasicTokenizer(tokenizer.do_lower_case, tokenizer.strip_accents)
        self.vocab_tokens = tf.constant(list(tokenizer.vocab.tokens), tf.string)
        self.max_seq_length = max_seq_length
        self.max_query_length = max_query_length
        self.doc_stride = doc_stride
        self.cls_id = tokenizer.vocab.special.cls_id
        self.sep_id = tokenizer.vocab.special.sep_id

    def records(self, question: tf.Tensor, context: tf.Tensor) -> dict:
        """Window records of a batch (module docstring; `features.featurize` in-graph).

        Returns:
            dict: `input_ids`, `input_mask`, `segment_ids` int32 [records, seq];
            `example` int32 [records] (the question of each record), `offset`, `length`,
            `doc_start` int32 [records]; `max_context` bool [records, seq] (at context
            positions); `tok_to_orig` int32 [records, seq] (word of each context position, -1
            elsewhere); `words` ragged string [batch, (words)], `word_begin`, `word_end` ragged
            int64 byte offsets [batch, (words)]; `num_windows` int32 [batch].
        """
        words, word_begin, word_end = tf_text.regex_split_with_offsets(context, _QA_WHITESPACE)
        doc, doc_words = self._context_pieces(words)
        query = tf.cast(self.graph_tokenizer.tokenize(question), tf.int32)[:, :self.max_query_length]
        layout = self._window_layout(doc.row_lengths(), query.row_lengths())
        ids, segments, orig, offset = self._record_tokens(query, doc, doc_words, layout)
        max_context = self._max_context(layout.example, layout.window, layout.doc_start,
                                        layout.length, layout.num_windows, layout.step, offset)
        # Padded to max_seq_length as in training (the head's top-k needs beam_size positions).
        shape = [None, self.max_seq_length]
        return {
            "input_ids": ids.to_tensor(shape=shape),
            "input_mask": tf.ones_like(ids).to_tensor(shape=shape),
            "segment_ids": segments.to_tensor(shape=shape),
            "example": tf.cast(layout.example, tf.int32),
            "offset": tf.cast(offset, tf.int32),
            "length": tf.cast(layout.length, tf.int32),
            "doc_start": tf.cast(layout.doc_start, tf.int32),
            "max_context": max_context,
            "tok_to_orig": tf.cast(orig.to_tensor(default_value=-1, shape=shape), tf.int32),
            "words": words, "word_begin": word_begin, "word_end": word_end,
            "num_windows": tf.cast(layout.num_windows, tf.int32),
        }

    def _context_pieces(self, words: tf.RaggedTensor):
        """WordPiece ids of each context and the word each comes from.

        Args:
            words: ragged string [batch, (words)]. The whitespace words of each context.

        Returns:
            (doc, doc_words): ragged int32 [batch, (pieces)] sub-token ids, each word
            tokenized on its own; ragged int64 [batch, (pieces)] index of each sub-token's word
            within its context.
        """
        pieces = tf.cast(self.graph_tokenizer.tokenize(words.flat_values), tf.int32)
        counts = pieces.row_lengths()
        word_index = tf.ragged.range(words.row_lengths()).flat_values  # index within its context
        doc = tf.RaggedTensor.from_row_splits(pieces.flat_values,
                                              tf.gather(pieces.row_splits, words.row_splits))
        doc_words = tf.RaggedTensor.from_row_splits(tf.repeat(word_index, counts),
                                                    doc.row_splits)
        return doc, doc_words

    def _window_layout(self, n_doc: tf.Tensor, q_len: tf.Tensor) -> _WindowLayout:
        """The `doc_stride` windows over each context (see `_WindowLayout`).

        Args:
            n_doc: int64 [batch]. Context sub-tokens per question.
            q_len: int64 [batch]. Question sub-tokens (at most max_query_length) per question.
        """
        budget = self.max_seq_length - q_len - 3
        step = tf.minimum(budget, self.doc_stride)
        extra = tf.maximum(n_doc - budget, 0)
        n_windows = tf.where(n_doc > 0, 1 + (extra + step - 1) // step, 0)
        example = tf.repeat(tf.range(tf.size(n_doc, out_type=tf.int64)), n_windows)
        window = tf.ragged.range(n_windows).flat_values
        r_budget = tf.gather(budget, example)
        r_n = tf.gather(n_doc, example)
        r_step = tf.gather(step, example)
        doc_start = window * r_step
        length = tf.minimum(r_budget, r_n - doc_start)
        return _WindowLayout(example, window, r_step, doc_start, length, n_windows)

    def _record_tokens(self, query: tf.RaggedTensor, doc: tf.RaggedTensor,
                       doc_words: tf.RaggedTensor, layout: _WindowLayout):
        """[CLS] question [SEP] window [SEP] of each record, unpadded.

        Args:
            query: ragged int32 [batch, (query)]. Question sub-token ids.
            doc, doc_words: as `_context_pieces` returns them.
            layout: the records' windows.

        Returns:
            (ids, segments, orig, offset): ragged int32 [records, (seq)] token ids, segment
            ids and word of each context position (-1 elsewhere); int64 [records] position of
            the first context sub-token.
        """
        positions = tf.ragged.range(layout.doc_start, layout.doc_start + layout.length) + tf.gather(
            doc.row_splits[:-1], layout.example)[:, None]
        window_ids = tf.gather(doc.flat_values, positions)
        window_words = tf.cast(tf.gather(doc_words.flat_values, positions), tf.int32)
        r_query = tf.gather(query, layout.example)
        n_records = tf.size(layout.example, out_type=tf.int64)
        cls = tf.RaggedTensor.from_tensor(tf.fill([n_records, 1], self.cls_id))
        sep = tf.RaggedTensor.from_tensor(tf.fill([n_records, 1], self.sep_id))
        first = tf.concat([cls, r_query, sep], axis=1)
        second = tf.concat([window_ids, sep], axis=1)
        ids = tf.concat([first, second], axis=1)
        segments = tf.concat([tf.zeros_like(first), tf.ones_like(second)], axis=1)
        minus_one = tf.RaggedTensor.from_tensor(tf.fill([n_records, 1], -1))
        orig = tf.concat([tf.zeros_like(first) - 1, window_words, minus_one], axis=1)
        return ids, segments, orig, first.row_lengths()

    def _max_context(self, example, window, doc_start, length, n_windows, step, offset):
        """bool [records, seq]: the record is the max-context window of that context position.

        Every window of an example starts at k * step (k < n_windows) and holds min(budget,
        n - start) sub-tokens, so the competing windows are enumerated directly; scores in
        float64 as the official Python floats, ties to the earliest window.

        Args:
            example, window, doc_start, length, step, offset: int64 [records]: the record's
                question, window index, first context sub-token, context sub-tokens, stride
                and position of its first context sub-token.
            n_windows: int64 [batch]. Windows per question.
        """
        seq = self.max_seq_length
        pos = tf.range(seq, dtype=tf.int64)[None, :] - offset[:, None]  # position in window
        token = doc_start[:, None] + pos  # context sub-token index [R, seq]
        max_windows = tf.reduce_max(tf.concat([n_windows, [0]], 0))
        k = tf.range(max_windows, dtype=tf.int64)  # [K]
        starts = k[None, :] * step[:, None]  # [R, K]
        # Length of window k of the record's example: that of window 0 (the budget, or the whole
        # context), or what is left at the end.
        record_n = doc_start + length  # context length when the record is the last window
        last_start = (tf.gather(n_windows, example) - 1) * step
        n_doc = tf.where(doc_start == last_start, record_n, -1)
        # Every record of an example knows the example's context length through its last window.
        n_doc = tf.math.unsorted_segment_max(n_doc, example, tf.size(n_windows))
        n_doc = tf.gather(n_doc, example)
        first_length = tf.gather(tf.math.unsorted_segment_max(
            tf.where(doc_start == 0, length, -1), example, tf.size(n_windows)), example)
        lengths = tf.minimum(first_length[:, None], n_doc[:, None] - starts)  # [R, K]
        valid_k = k[None, :] < tf.gather(n_windows, example)[:, None]
        t = token[:, None, :]  # [R, 1, seq]
        s = starts[:, :, None]
        e = s + lengths[:, :, None] - 1
        inside = valid_k[:, :, None] & (t >= s) & (t <= e)
        score = (tf.cast(tf.minimum(t - s, e - t), tf.float64)
                 + 0.01 * tf.cast(lengths[:, :, None], tf.float64))
        score = tf.where(inside, score, tf.constant(-1e300, tf.float64))
        best = tf.reduce_max(score, axis=1, keepdims=True)
        first_best = tf.reduce_min(tf.where(score >= best, k[None, :, None], max_windows), axis=1)
        in_window = (pos >= 0) & (pos < length[:, None])
        return in_window & tf.equal(first_best, window[:, None])

    def final_text(self, pred_text: tf.Tensor, orig_text: tf.Tensor):
        """`decoding.get_final_text` of one prediction (scalar strings) in-graph.

        Returns:
            (text, start, end): the answer and its character span [start, end) in orig_text.
        """
        orig_chars = tf.strings.unicode_split(orig_text, "UTF-8")
        n_orig = tf.size(orig_chars)
        fallback = (orig_text, tf.constant(0), n_orig)
        tok_text = tf.strings.reduce_join(self.basic_tokenizer.tokenize(orig_text[None])[0],
                                          separator=" ")
        tok_chars = tf.strings.unicode_split(tok_text, "UTF-8")
        n_pred = tf.strings.length(pred_text, unit="UTF8_CHAR")

        def project():
            # The first occurrence of pred_text in tok_text (str.find), in characters.
            parts = tf.strings.split(tok_text, sep=pred_text, maxsplit=1)
            start = tf.strings.length(parts[0], unit="UTF8_CHAR")
            end = start + n_pred - 1
            # Space-free alignment: both texts must have as many non-space characters.
            orig_ns = tf.not_equal(orig_chars, " ")
            tok_ns = tf.not_equal(tok_chars, " ")
            ok = (tf.size(parts) == 2) & tf.equal(tf.reduce_sum(tf.cast(orig_ns, tf.int32)),
                                                   tf.reduce_sum(tf.cast(tok_ns, tf.int32)))
            count = tf.size(tok_chars)
            safe = lambda i: tf.clip_by_value(i, 0, tf.maximum(count - 1, 0))  # noqa: E731
            ok = ok & (count > 0) & (end < count)
            ok = ok & tf.gather(tok_ns, safe(start)) & tf.gather(tok_ns, safe(end))
            tok_ns_index = tf.cumsum(tf.cast(tok_ns, tf.int32)) - 1  # ns index of each tok char
            orig_positions = tf.cast(tf.where(orig_ns)[:, 0], tf.int32)  # ns index -> orig char
            ns_start = tf.gather(tok_ns_index, safe(start))
            ns_end = tf.gather(tok_ns_index, safe(end))
            size = tf.size(orig_positions)
            ok = ok & (ns_end < size)
            clip = lambda i: tf.clip_by_value(i, 0, tf.maximum(size - 1, 0))  # noqa: E731
            orig_start = tf.gather(orig_positions, clip(ns_start))
            orig_end = tf.gather(orig_positions, clip(ns_end)) + 1
            text = tf.strings.substr(orig_text, orig_start, orig_end - orig_start, unit="UTF8_CHAR")
            return tf.cond(ok & (size > 0), lambda: (text, orig_start, orig_end), lambda: fallback)

        return tf.cond(n_pred > 0, project, lambda: fallback)


def _candidate_grid(outputs, joint: bool, beam: int, n_best: int):
    """(start, end, score) [records, k, k] of every candidate, in the official order."""
    if joint:
        start_grid = tf.broadcast_to(outputs["start_top_index"][:, :, None],
                                     tf.shape(outputs["end_top_index"]))
        scores = outputs["start_top_log_probs"][:, :, None] + outputs["end_top_log_probs"]
        return start_grid, outputs["end_top_index"], scores
    start_scores, starts = tf.math.top_k(outputs["start_logits"], k=n_best)
    end_scores, ends = tf.math.top_k(outputs["end_logits"], k=n_best)
    start_grid = tf.broadcast_to(starts[:, :, None], [tf.shape(starts)[0], n_best, n_best])
    end_grid = tf.broadcast_to(ends[:, None, :], tf.shape(start_grid))
    return start_grid, end_grid, start_scores[:, :, None] + end_scores[:, None, :]


def _best_candidates(records, start_grid, end_grid, scores, max_answer_length: int):
    """The best surviving candidate of each question.

    Returns:
        (found bool [batch], score [batch], record int32 [batch], start, end int32 [batch]).
    """
    example, offset, length = records["example"], records["offset"], records["length"]
    per_record = start_grid.shape[1] * start_grid.shape[2]
    batch = tf.size(records["num_windows"])
    first = offset[:, None, None]
    last = (offset + length)[:, None, None]
    seq = tf.shape(records["max_context"])[1]
    start_max_context = tf.gather(records["max_context"], tf.minimum(start_grid, seq - 1),
                                  batch_dims=1)
    valid = ((start_grid != 0) & (start_grid >= first) & (start_grid < last)
             & (end_grid >= first) & (end_grid < last) & (end_grid >= start_grid)
             & (end_grid - start_grid + 1 <= max_answer_length) & start_max_context)
    flat_scores = tf.reshape(tf.where(valid, scores, _NEG), [-1, per_record])
    # One row per question: its records in window order, each flattened (start, end) row-major,
    # so the first maximum is the official stable sort's first entry.
    window = tf.cast(tf.ragged.range(records["num_windows"]).flat_values, tf.int32)
    max_windows = tf.reduce_max(tf.concat([records["num_windows"], [0]], 0))
    where = tf.stack([example, window], 1)
    slots = tf.scatter_nd(where, flat_scores, [batch, max_windows, per_record])
    occupied = tf.scatter_nd(where, tf.ones_like(example, tf.bool), [batch, max_windows])
    slots = tf.concat([tf.reshape(tf.where(occupied[:, :, None], slots, _NEG), [batch, -1]),
                       tf.fill([batch, 1], _NEG)], 1)  # a sentinel column for empty questions
    best = _first_argmax(slots)
    best_score = tf.gather(slots, best, batch_dims=1)
    found = best_score > _NEG / 2
    record_of = tf.scatter_nd(where, tf.range(tf.size(example)), [batch, max_windows])
    record = tf.gather(record_of, tf.minimum(best // per_record, tf.maximum(max_windows - 1, 0)),
                       batch_dims=1)
    record = tf.minimum(tf.where(found, record, 0), tf.maximum(tf.size(example) - 1, 0))
    cell = best % per_record
    start = tf.gather(tf.gather(tf.reshape(start_grid, [-1, per_record]), record), cell,
                      batch_dims=1)
    end = tf.gather(tf.gather(tf.reshape(end_grid, [-1, per_record]), record), cell, batch_dims=1)
    return found, best_score, record, start, end


def _answer(encoder: QAEncoder, records, context, i, record, start, end):
    """(text, begin, end) of question i's span: `get_final_text` and its context offsets."""
    ids = tf.gather(records["input_ids"], record)[start:end + 1]
    pred = tf.strings.reduce_join(tf.gather(encoder.vocab_tokens, ids), separator=" ")
    pred = tf.strings.regex_replace(pred, " ##", "")
    pred = tf.strings.regex_replace(pred, "##", "")
    pred = tf.strings.strip(tf.strings.regex_replace(pred, "\\s+", " "))
    orig_rows = tf.gather(records["tok_to_orig"], record)
    first_word, last_word = orig_rows[start], orig_rows[end]
    words = records["words"][i][first_word:last_word + 1]
    text, begin, finish = encoder.final_text(pred, tf.strings.reduce_join(words, separator=" "))
    # A character of orig (the words joined by one space) -> the same character of the context.
    char_offsets = tf.strings.unicode_decode_with_offsets(context[i], "UTF-8")[1]
    word_starts = tf.cast(tf.searchsorted(char_offsets, records["word_begin"][i], side="left"),
                          tf.int32)
    in_orig = tf.cumsum(tf.strings.length(words, unit="UTF8_CHAR") + 1, exclusive=True)
    k_begin = tf.searchsorted(in_orig, [begin], side="right")[0] - 1
    k_end = tf.searchsorted(in_orig, [finish - 1], side="right")[0] - 1
    return (text, word_starts[first_word + k_begin] + begin - in_orig[k_begin],
            word_starts[first_word + k_end] + finish - in_orig[k_end])


def qa_serving(model, task_name: str, tokenizer: Tokenizer, config, v2: bool) -> TaskServing:
    """The `<task>` signature of a QA task (module docstring)."""
    encoder = QAEncoder(tokenizer, config.max_seq_length, config.max_query_length,
                        config.doc_stride)
    n_best = min(config.n_best_size, config.max_seq_length)

    @tf.function(input_signature=[text_spec("question"), text_spec("context")])
    def serve(question, context):
        records = encoder.records(question, context)
        features = {k: records[k] for k in ("input_ids", "input_mask", "segment_ids")}
        outputs = model.task_outputs(features, task_name, training=False)
        grid = _candidate_grid(outputs, config.joint_prediction, config.beam_size, n_best)
        found, score, record, start, end = _best_candidates(records, *grid,
                                                            config.max_answer_length)
        # Null odds: the minimum answerable logit (or start[0] + end[0]) over the windows.
        if config.answerable_classifier:
            record_null = outputs["answerable_logit"]
        else:
            record_null = outputs["start_logits"][:, 0] + outputs["end_logits"][:, 0]
        null = tf.math.unsorted_segment_min(record_null, records["example"], tf.size(question))
        null = tf.where(records["num_windows"] > 0, null, NULL_SCORE_INIT)
        if not config.answerable_classifier:
            null = null - tf.where(found, score, 0.0)
        empty = (tf.constant(EMPTY_PREDICTION), tf.constant(-1), tf.constant(-1))
        texts, begins, ends = tf.map_fn(
            lambda i: tf.cond(found[i],
                              lambda: _answer(encoder, records, context, i, record[i], start[i],
                                              end[i]),
                              lambda: empty),
            tf.range(tf.size(question)), fn_output_signature=(tf.string, tf.int32, tf.int32))
        has_answer = found & (null <= config.qa_na_threshold) if v2 else found
        return {"answer": texts, "answer_start": begins, "answer_end": ends,
                "score": tf.where(found, score, 0.0), "null_odds": null,
                "has_answer": has_answer}

    # The head's raw outputs for token ids (the ONNX export's input): what `serve` decodes.
    keys = ["start_logits"]
    keys += (["start_top_log_probs", "start_top_index", "end_top_log_probs", "end_top_index"]
             if config.joint_prediction else ["end_logits"])
    keys += ["answerable_logit"] if config.answerable_classifier else []

    @tf.function(input_signature=[int_spec("input_ids"), int_spec("input_mask"),
                                  int_spec("segment_ids")])
    def serve_ids(input_ids, input_mask, segment_ids):
        outputs = model.task_outputs({"input_ids": input_ids, "input_mask": input_mask,
                                      "segment_ids": segment_ids}, task_name, training=False)
        return {k: outputs[k] for k in keys}

    return TaskServing({task_name: serve, f"{task_name}_ids": serve_ids}, {"encoder": encoder})
