"""Span extraction and BIOES encoding, exactly as the official `tagging_utils.py`.

`span_labels(tags)` walks the tags with `last` = "O" and a current start:

- a tag is "O" or PREFIX-TYPE with exactly one "-" (anything else is an error);
- if last != "O" and the tag is B-*, S-* or "O", the span (start, i - 1, type of last) closes;
- if the tag is B-* or S-*, or last == "O", a span starts at i;
- at the end, a final tag other than "O" closes (start, n - 1, its type).

So I-X after O starts a span, E-* and S-* do not close one (only a following B, S or O does),
and a span's type is the type of its last tag: "B-NP I-VP" -> (0, 1, VP). The official function
raises IndexError on an empty sequence (QUIRK Q11); here it returns [] (a sentence whose words
were all cut by truncation).

`bioes_tags(spans, n)`: every position of a span gets I-t, its end E-t, its start B-t, and a
one-word span S-t (official `get_tags(..., "BIOES")`).
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

Span = Tuple[int, int, str]
OUTSIDE = "O"


class TagError(ValueError):
    """A tag that is neither "O" nor PREFIX-TYPE."""


def split_tag(tag: str) -> Tuple[str, str]:
    """(prefix, type) of a tag; ("", "O") for "O".

    Raises:
        TagError: not "O" and not exactly one "-" (official: a ValueError from unpacking).
    """
    if tag == OUTSIDE:
        return "", OUTSIDE
    parts = tag.split("-")
    if len(parts) != 2:
        raise TagError(f"tag {tag!r} is neither 'O' nor PREFIX-TYPE (B-NP, I-VP, ...)")
    return parts[0], parts[1]


def span_labels(tags: Sequence[str]) -> List[Span]:
    """Spans (start, end, type), end inclusive, of a tag sequence (module docstring)."""
    spans = []
    last = OUTSIDE
    start = -1
    for i, tag in enumerate(tags):
        prefix, _ = split_tag(tag)
        if (prefix in ("B", "S") or tag == OUTSIDE) and last != OUTSIDE:
            spans.append((start, i - 1, last.split("-")[-1]))
        if prefix in ("B", "S") or last == OUTSIDE:
            start = i
        last = tag
    if tags and tags[-1] != OUTSIDE:
        spans.append((start, len(tags) - 1, tags[-1].split("-")[-1]))
    return spans


def bioes_tags(spans: Sequence[Span], length: int) -> List[str]:
    """The BIOES tags of `length` words holding `spans`."""
    tags = [OUTSIDE] * length
    for start, end, kind in spans:
        for i in range(start, end + 1):
            tags[i] = "I-" + kind
        tags[end] = "E-" + kind
        tags[start] = "B-" + kind
        if start == end:
            tags[start] = "S-" + kind
    return tags


def to_bioes(tags: Sequence[str]) -> List[str]:
    """A sentence's file tags re-encoded as BIOES through their spans (official for chunk)."""
    return bioes_tags(span_labels(tags), len(tags))
