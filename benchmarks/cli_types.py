"""argparse types shared by the benchmark scripts (each rejects bad input in one line)."""

import argparse
from typing import List


def positive_int(text: str) -> int:
    """`--calls 7`: one integer > 0."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def positive_ints(text: str) -> List[int]:
    """`--batch 32,128`: comma-separated integers, each > 0, at least one."""
    try:
        values = [int(v) for v in text.split(",") if v]
    except ValueError:
        values = []
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    return values
