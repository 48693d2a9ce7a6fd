"""QA features: sub-tokens, answer refinement, sliding windows, max-context (official
`QATask.featurize`; the same code for training and evaluation).

Per question:

1. query = WordPiece(question)[:max_query_length] (the first WordPieces are kept).
2. Each whitespace word of the context is WordPiece-tokenized on its own; `tok_to_orig[j]` is the
   word of sub-token j and `orig_to_tok[w]` the index of w's first sub-token (a word with no
   sub-tokens points at the next word's first, QUIRK Q29, mirrored).
3. Training, answerable: the answer's sub-token span is orig_to_tok[start_word] ..
   orig_to_tok[end_word + 1] - 1 (or the last sub-token), then narrowed to the first (start
   upwards, end downwards) sub-span whose sub-tokens equal WordPiece(answer text)
   (`improve_answer_span`: "1895" inside "(1895-1943)." becomes the sub-token "1895").
4. Windows over the context's sub-tokens with D = max_seq_length - len(query) - 3 tokens each:
   start at 0, stop after the window that reaches the end, else advance by min(length,
   doc_stride). 600 sub-tokens, a 20-token query and L = 512 give (0, 489) and (128, 472). A
   context with no sub-tokens gives no windows.
5. Layout [CLS] query [SEP] window [SEP]; segment_ids 0 through the first [SEP], 1 after.
6. A sub-token's "max-context" window maximises min(left, right) + 0.01 * window length (ties:
   the earliest window); decoding only accepts answers starting at a max-context position.
7. Training labels: an answer entirely inside the window -> its positions (window position +
   len(query) + 2); an answerable question whose answer is not entirely inside -> 0 / 0 with
   is_impossible = 0 (QUIRK Q3, mirrored: the official comment says such windows are dropped,
   the code keeps them); unanswerable -> 0 / 0, is_impossible = 1. Evaluation records carry 0s.
8. eid = 1000 * example eid + window index (official; decoding here uses `WindowInfo` in record
   order, so the 1000-window collision of QUIRK Q28 cannot mix questions up).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, NamedTuple, Sequence, Tuple

import numpy as np

from electra_tf.finetuning.qa.data import Paragraph, QAExample

if TYPE_CHECKING:  # the run's tokenizer: the in-graph one (TensorFlow) or PortableTokenizer
    from electra_tf.data.text.tokenization import Tokenizer

# Words per tokenizer call (bounds the memory of one graph call on a large split).
TOKENIZE_CHUNK = 200_000


class DocTokens(NamedTuple):
    """A context's sub-tokens.

    Attributes:
        ids: int32 [n_sub]. WordPiece ids of every word, concatenated.
        tok_to_orig: int32 [n_sub]. Word of each sub-token.
        orig_to_tok: int32 [n_words]. First sub-token of each word.
    """

    ids: np.ndarray
    tok_to_orig: np.ndarray
    orig_to_tok: np.ndarray


class Window(NamedTuple):
    start: int
    length: int


class WindowInfo(NamedTuple):
    """What decoding needs of one record.

    Attributes:
        example: int. Index of its question in the split.
        window: int. Window index within the question.
        doc_start: int. First context sub-token of the window.
        length: int. Context sub-tokens in the window.
        query_length: int. Question sub-tokens.
        max_context: bool [length]. Whether this window is each sub-token's max-context window.
    """

    example: int
    window: int
    doc_start: int
    length: int
    query_length: int
    max_context: np.ndarray

    @property
    def offset(self) -> int:
        """Position of the window's first sub-token in the record ([CLS] query [SEP] before)."""
        return self.query_length + 2

    @property
    def num_tokens(self) -> int:
        """Unpadded record length."""
        return self.query_length + self.length + 3


class QAFeatures(NamedTuple):
    """Featurised questions of one split.

    Attributes:
        arrays: int32 numpy [n_records, ...]: `input_ids`, `input_mask`, `segment_ids`
            [n, max_seq_length]; `eid`, `start_positions`, `end_positions`, `is_impossible` [n].
        windows: list of WindowInfo, one per record.
        doc_tokens: list of DocTokens, one per question (shared by a paragraph's questions).
    """

    arrays: Dict[str, np.ndarray]
    windows: List[WindowInfo]
    doc_tokens: List[DocTokens]


def doc_windows(num_doc_tokens: int, max_tokens_for_doc: int, doc_stride: int) -> List[Window]:
    """The official sliding windows over a context's sub-tokens (module docstring, step 4)."""
    windows = []
    start = 0
    while start < num_doc_tokens:
        length = min(num_doc_tokens - start, max_tokens_for_doc)
        windows.append(Window(start, length))
        if start + length == num_doc_tokens:
            break
        start += min(length, doc_stride)
    return windows


def max_context(windows: Sequence[Window], window_index: int) -> np.ndarray:
    """bool [length of window `window_index`]: is it the max-context window of each sub-token."""
    this = windows[window_index]
    positions = np.arange(this.start, this.start + this.length)
    best_score = np.full(len(positions), -np.inf)
    best_window = np.full(len(positions), -1)
    for index, window in enumerate(windows):
        end = window.start + window.length - 1
        inside = (positions >= window.start) & (positions <= end)
        score = np.minimum(positions - window.start, end - positions) + 0.01 * window.length
        better = inside & (score > best_score)  # strict: ties stay with the earlier window
        best_score = np.where(better, score, best_score)
        best_window = np.where(better, index, best_window)
    return best_window == window_index


def improve_answer_span(doc_ids: Sequence[int], start: int, end: int,
                        answer_ids: Sequence[int]) -> Tuple[int, int]:
    """The first (start upwards, end downwards) sub-span equal to the answer's WordPieces."""
    answer = list(answer_ids)
    for new_start in range(start, end + 1):
        for new_end in range(end, new_start - 1, -1):
            if list(doc_ids[new_start:new_end + 1]) == answer:
                return new_start, new_end
    return start, end


def _batched_pieces(tokenizer: Tokenizer, texts: Sequence[str]) -> List[np.ndarray]:
    """WordPiece ids of each text, tokenizing in chunks."""
    out: List[np.ndarray] = []
    for begin in range(0, len(texts), TOKENIZE_CHUNK):
        ids, splits = tokenizer.encode_batch(list(texts[begin:begin + TOKENIZE_CHUNK]))
        out.extend(ids[splits[i]:splits[i + 1]] for i in range(len(splits) - 1))
    return out


def doc_tokens_of(paragraphs: Sequence[Paragraph], tokenizer: Tokenizer) -> List[DocTokens]:
    """DocTokens of each paragraph (every word tokenized on its own)."""
    words = [w for p in paragraphs for w in p.words]
    pieces = _batched_pieces(tokenizer, words)
    out, at = [], 0
    for paragraph in paragraphs:
        word_pieces = pieces[at:at + len(paragraph.words)]
        at += len(paragraph.words)
        counts = np.array([len(p) for p in word_pieces], np.int32)
        orig_to_tok = (np.cumsum(counts) - counts).astype(np.int32)
        ids = (np.concatenate(word_pieces) if word_pieces else np.zeros([0])).astype(np.int32)
        tok_to_orig = np.repeat(np.arange(len(word_pieces), dtype=np.int32), counts)
        out.append(DocTokens(ids, tok_to_orig, orig_to_tok))
    return out


def answer_token_span(example: QAExample, doc: DocTokens, answer_ids: Sequence[int]) -> Tuple[int, int]:
    """The refined sub-token span of a training answer (module docstring, step 3)."""
    start = int(doc.orig_to_tok[example.start_word])
    if example.end_word < len(doc.orig_to_tok) - 1:
        end = int(doc.orig_to_tok[example.end_word + 1]) - 1
    else:
        end = len(doc.ids) - 1
    return improve_answer_span(doc.ids, start, end, answer_ids)


def featurize(examples: Sequence[QAExample], tokenizer: Tokenizer, max_seq_length: int,
              max_query_length: int, doc_stride: int, is_training: bool) -> QAFeatures:
    """Records of every window of every question (module docstring).

    Args:
        examples: the split's questions.
        tokenizer: the run's Tokenizer, or `portable_tokenization.PortableTokenizer` (JAX and
            PyTorch runs: the same ids, so the same records; numpy throughout).
        max_seq_length, max_query_length, doc_stride: official hparams.
        is_training: label the records (training split).

    Returns:
        QAFeatures.
    """
    special = tokenizer.vocab.special
    example_docs, queries, answers = _tokenize_examples(examples, tokenizer, is_training)
    columns: Dict[str, List] = {k: [] for k in ("input_ids", "eid", "start_positions",
                                                "end_positions", "is_impossible")}
    segment_rows, windows_info = [], []
    for index, (example, doc, query, answer) in enumerate(
            zip(examples, example_docs, queries, answers)):
        query = query[:max_query_length]
        windows = doc_windows(len(doc.ids), max_seq_length - len(query) - 3, doc_stride)
        span = None
        if is_training and not example.is_impossible:
            span = answer_token_span(example, doc, answer)
        for w, window in enumerate(windows):
            ids = np.concatenate([[special.cls_id], query, [special.sep_id],
                                  doc.ids[window.start:window.start + window.length],
                                  [special.sep_id]]).astype(np.int32)
            start_position, end_position = _answer_positions(span, window, len(query))
            columns["input_ids"].append(ids)
            segment_rows.append(len(query) + 2)
            columns["eid"].append(1000 * example.eid + w)
            columns["start_positions"].append(start_position)
            columns["end_positions"].append(end_position)
            columns["is_impossible"].append(int(is_training and example.is_impossible))
            windows_info.append(WindowInfo(index, w, window.start, window.length, len(query),
                                           max_context(windows, w)))
    arrays = _record_arrays(columns, segment_rows, max_seq_length)
    return QAFeatures(arrays, windows_info, example_docs)


def _tokenize_examples(examples: Sequence[QAExample], tokenizer: Tokenizer, is_training: bool
                       ) -> Tuple[List[DocTokens], List[np.ndarray], List]:
    """Sub-tokens of each question's context, question and (training) answer text.

    Returns:
        (docs, queries, answers): the DocTokens of each question's context (one shared object
        per paragraph, each paragraph tokenized once); the question's WordPiece ids, not yet
        cut to max_query_length; the answer text's WordPiece ids with `is_training` (of ""
        for an unanswerable question), else None for each question.
    """
    paragraphs: Dict[int, int] = {}
    unique: List[Paragraph] = []
    for example in examples:
        if id(example.paragraph) not in paragraphs:
            paragraphs[id(example.paragraph)] = len(unique)
            unique.append(example.paragraph)
    docs = doc_tokens_of(unique, tokenizer)
    queries = _batched_pieces(tokenizer, [e.question for e in examples])
    answers = (_batched_pieces(tokenizer, [e.answer_text or "" for e in examples])
               if is_training else [None] * len(examples))
    return [docs[paragraphs[id(e.paragraph)]] for e in examples], queries, answers


def _answer_positions(span, window: Window, query_length: int) -> Tuple[int, int]:
    """Training labels of one record (module docstring, step 7): the answer's record positions
    when `span` (the answer's sub-token span, None for none) lies entirely in `window`, else
    0 / 0."""
    if span is not None and window.start <= span[0] and span[1] <= window.start + window.length - 1:
        return (span[0] - window.start + query_length + 2,
                span[1] - window.start + query_length + 2)
    return 0, 0


def _record_arrays(columns: Dict[str, List], segment_rows: List[int],
                   length: int) -> Dict[str, np.ndarray]:
    """The records as QAFeatures.arrays: ids padded to `length`, the mask, segment ids 1 from
    each record's `segment_rows` entry (its first context position) on, and the label columns.
    """
    n = len(columns["input_ids"])
    arrays = {k: np.zeros([n, length], np.int32) for k in ("input_ids", "input_mask", "segment_ids")}
    for row, (ids, first_segment) in enumerate(zip(columns["input_ids"], segment_rows)):
        arrays["input_ids"][row, :len(ids)] = ids
        arrays["input_mask"][row, :len(ids)] = 1
        arrays["segment_ids"][row, first_segment:len(ids)] = 1
    for key in ("eid", "start_positions", "end_positions", "is_impossible"):
        arrays[key] = np.array(columns[key], np.int32).reshape([n])
    return arrays
