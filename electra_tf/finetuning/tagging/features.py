"""Tagging features (official `tokenize_and_align` + `TaggingTask.featurize`).

Each word is WordPiece-tokenized on its own; the sequence is [CLS] word pieces... [SEP], and the
label of a word sits on its **first** sub-token (`labeled_positions`); later sub-tokens get no
loss and no prediction.

Official truncation (QUIRK Q6, mirrored exactly): with W = number of words + 2, walk the entries
[CLS], word_1..word_n, [SEP]; before appending an entry, if W + current length + 1 > L, append
[SEP] and stop. This uses the word count as part of the budget and so cuts earlier than needed:
on words with 1, 1, 5, 1, 1, 1 pieces it keeps 6 / 5 / 3 / 2 / 0 words at L = 19 / 18 / 14 /
11 / 9. The official code then fails an assertion when one long word pushes the sequence past L;
here the sequence is cut at L - 1 and closed with [SEP] (the words whose first sub-token falls
past the cut are untagged).

ner and pos (`official_truncation=False`) tag every word whose first sub-token fits: the sequence
is [CLS] and all the pieces, cut at L - 1 and closed with [SEP]; a word is tagged when its first
sub-token sits before the cut (on words with 1, 1, 5, 1, 1, 1 pieces it tags 6 / 6 / 5 / 3 words
at L = 19 / 12 / 11 / 9, where the official rule tags 6 / 3 / 2 / 0).

Features (official): `labels` = the word label ids [:L], zero-padded (aligned with the tagged
positions by word index); `labels_mask` = 1.0 on tagged words; `labeled_positions` = the tagged
positions, zero-padded (padding gathers [CLS] and is masked); `input_mask` 1 on real ids;
`segment_ids` 1 on every real token, [CLS] included (QUIRK Q7, mirrored).

Tokenization (QUIRK Q8, mirrored): words are lower-cased and accent-stripped whatever
`do_lower_case` says (`tagging_cased: true` tokenizes as the pretrained model instead; ner and
pos do so by default). One
difference: the official code skips BERT's CJK spacing for tagging; electra-tf's tokenizer
always puts spaces around CJK ideographs (so a word mixing CJK characters may split into more
pieces; it changes nothing for CoNLL-2000).
"""

from __future__ import annotations

from typing import Dict, List, Sequence

import numpy as np



def word_pieces(tokenizer, sentences: Sequence[Sequence[str]]) -> List[List[List[int]]]:
    """WordPiece ids of every word of every sentence (each word tokenized on its own).

    Args:
        tokenizer: `data.tokenization.Tokenizer` or `data.portable_tokenization.PortableTokenizer`
            (anything with `encode_batch(texts) -> (ids, row_splits)`).
        sentences: per sentence, its words.
    """
    flat = [word for words in sentences for word in words]
    ids, splits = tokenizer.encode_batch(flat)
    pieces = [ids[splits[i]:splits[i + 1]].tolist() for i in range(len(flat))]
    out, at = [], 0
    for words in sentences:
        out.append(pieces[at:at + len(words)])
        at += len(words)
    return out


def truncate(pieces: Sequence[Sequence[int]], max_seq_length: int, cls_id: int,
             sep_id: int, official_truncation: bool = True) -> (List[int], List[int]):
    """The official truncation (module docstring), with the overflow cut; or ner/pos's.

    Args:
        pieces: WordPiece ids of each word.
        max_seq_length: int. L.
        official_truncation: the official rule (chunk); False: every word whose first
            sub-token fits before the closing [SEP] is tagged (ner, pos).

    Returns:
        (input_ids, tagged_positions): the ids (at most L) and the first-sub-token position of
        each kept word, in word order.
    """
    if not official_truncation:
        input_ids, tagged = [cls_id], []
        for word in pieces:
            tagged.append(len(input_ids))
            input_ids.extend(word)
        input_ids = input_ids[:max_seq_length - 1] + [sep_id]
        return input_ids, [p for p in tagged if p < max_seq_length - 1]
    entries = [[cls_id]] + [list(p) for p in pieces] + [[sep_id]]
    budget = len(entries)
    input_ids: List[int] = []
    tagged: List[int] = []
    for index, entry in enumerate(entries):
        if budget + len(input_ids) + 1 > max_seq_length:
            input_ids.append(sep_id)
            break
        if 0 < index < len(entries) - 1:
            tagged.append(len(input_ids))
        input_ids.extend(entry)
    if len(input_ids) > max_seq_length:  # official: an assertion failure (QUIRK Q6, fixed)
        input_ids = input_ids[:max_seq_length - 1] + [sep_id]
        tagged = [p for p in tagged if p < max_seq_length - 1]
    return input_ids, tagged


def featurize(pieces: Sequence[Sequence[Sequence[int]]], labels: Sequence[Sequence[int]],
              max_seq_length: int, cls_id: int, sep_id: int,
              official_truncation: bool = True) -> Dict[str, np.ndarray]:
    """Features of many sentences.

    Args:
        pieces: per sentence, the WordPiece ids of each word.
        labels: per sentence, the label id of each word.
        max_seq_length: int.
        official_truncation: see `truncate`.

    Returns:
        int32 `input_ids`, `input_mask`, `segment_ids`, `labels`, `labeled_positions` and
        float32 `labels_mask`, each [n, max_seq_length].
    """
    n, length = len(pieces), max_seq_length
    out = {key: np.zeros([n, length], np.int32)
           for key in ("input_ids", "input_mask", "segment_ids", "labels", "labeled_positions")}
    out["labels_mask"] = np.zeros([n, length], np.float32)
    for i, (sentence, sentence_labels) in enumerate(zip(pieces, labels)):
        ids, tagged = truncate(sentence, max_seq_length, cls_id, sep_id, official_truncation)
        out["input_ids"][i, :len(ids)] = ids
        out["input_mask"][i, :len(ids)] = 1
        out["segment_ids"][i, :len(ids)] = 1
        kept = list(sentence_labels[:length])
        out["labels"][i, :len(kept)] = kept
        out["labeled_positions"][i, :len(tagged)] = tagged
        out["labels_mask"][i, :len(tagged)] = 1.0
    return out
