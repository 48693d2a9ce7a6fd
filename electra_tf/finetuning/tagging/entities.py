"""Entities of BIO / BIOES tag sequences, exactly as seqeval 1.2.2 finds them (`ner` task).

Tags are "O" or PREFIX-TYPE, PREFIX one of the scheme's (`BIO`: B, I; `BIOES`: B, I, E, S) and
TYPE any non-empty text (it may hold "-": "B-geo-loc" has type "geo-loc").

Two modes (`tagging_entity_mode`), each equal to a seqeval mode on the same tag sequences
(tests/finetuning/test_finetuning_ner.py runs seqeval itself):

- `default` = seqeval's default mode (`f1_score(y_true, y_pred)`, conlleval's rules): an entity
  starts at B-/S-, at I-/E- after O, E- or S-, or where the type changes, and ends before
  B-/S-/O, after E-/S-, or where the type changes. So "I-PER" without a B- is an entity, and
  "B-PER E-PER E-PER" is two entities.
- `strict` = seqeval's `mode="strict"` with `scheme=IOB2` (BIO) or `IOBES` (BIOES): an entity is
  a start tag (B-, or S- in BIOES) followed by the scheme's inside tags of the same type
  (I-, or I-/E- in BIOES); in BIOES it counts only when it ends with E- or is a lone S-. "I-PER"
  without a B- is no entity.

Both reduce to one rule used by the metric (numpy-free Python) and by the serving graph (tables):
`link(prev, tag)` says whether `tag` continues the run of `prev`; the maximal runs of linked
non-O tags are the candidates; a candidate is an entity when `can_start(first tag)` and
`can_end(last tag)`; its type is its first tag's (all tags of a run share it).
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

import numpy as np

from electra_tf.finetuning.tagging.spans import OUTSIDE, TagError

Entity = Tuple[int, int, str]  # (first word, last word inclusive, type)
SCHEMES = {"BIO": ("B", "I"), "BIOES": ("B", "I", "E", "S")}
MODES = ("default", "strict")


def parse_tag(tag: str, scheme: str) -> Tuple[str, str]:
    """(prefix, type) of a tag; ("O", "") for "O".

    Raises:
        TagError (spans.py): neither "O" nor PREFIX-TYPE with a prefix of `scheme` and a
            non-empty type.
    """
    if tag == OUTSIDE:
        return OUTSIDE, ""
    prefixes = SCHEMES[scheme]
    if len(tag) < 3 or tag[1] != "-" or tag[0] not in prefixes:
        hint = " (set tagging_scheme to BIOES)" if scheme == "BIO" and tag[:2] in ("E-", "S-") \
            else ""
        raise TagError(f"tag {tag!r} is not 'O' nor a {scheme} tag "
                       f"({', '.join(p + '-TYPE' for p in prefixes)}){hint}")
    return tag[0], tag[2:]


def link(prev: Tuple[str, str], tag: Tuple[str, str]) -> bool:
    """Whether parsed `tag` continues the run of parsed `prev` (module docstring).

    The same in both modes: it is seqeval's IOB2 / IOBES inside patterns (strict), and exactly
    the pairs where seqeval's default mode neither ends a chunk (`end_of_chunk`) nor starts one
    (`start_of_chunk`).
    """
    (p, p_type), (t, t_type) = prev, tag
    return p in ("B", "I") and t in ("I", "E") and p_type == t_type


def can_start(tag: Tuple[str, str], mode: str) -> bool:
    """Whether a run whose first tag is parsed `tag` may be an entity."""
    if tag[0] == OUTSIDE:
        return False
    return mode == "default" or tag[0] in ("B", "S")


def can_end(tag: Tuple[str, str], mode: str, scheme: str) -> bool:
    """Whether a run whose last tag is parsed `tag` may be an entity."""
    if mode == "strict" and scheme == "BIOES":
        return tag[0] in ("E", "S")
    return tag[0] != OUTSIDE


def entities(tags: Sequence[str], scheme: str, mode: str) -> List[Entity]:
    """The entities (first, last, type) of one sentence's tags (module docstring).

    Raises:
        TagError: a tag that is not of `scheme`.
    """
    parsed = [parse_tag(t, scheme) for t in tags]
    found = []
    start = 0
    for i in range(len(parsed) + 1):
        if i < len(parsed) and i > start and link(parsed[i - 1], parsed[i]):
            continue
        if i > start and can_start(parsed[start], mode) and can_end(parsed[i - 1], mode, scheme):
            found.append((start, i - 1, parsed[start][1]))
        start = i
    return found


def decoding_tables(labels: Sequence[str], scheme: str, mode: str):
    """The rule as tables over label ids, for the serving graph.

    Index len(labels) stands for "no tag" (padding, words cut by truncation) and acts as "O".

    Returns:
        (link [K+1, K+1] bool, can_start [K+1] bool, can_end [K+1] bool, types [K+1] str).
    """
    parsed = [parse_tag(t, scheme) for t in labels] + [(OUTSIDE, "")]
    k = len(parsed)
    links = np.array([[link(parsed[a], parsed[b]) for b in range(k)] for a in range(k)])
    starts = np.array([can_start(p, mode) for p in parsed])
    ends = np.array([can_end(p, mode, scheme) for p in parsed])
    return links, starts, ends, [p[1] for p in parsed]
