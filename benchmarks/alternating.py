"""What the micro-benchmarks share: variants timed in ONE process, calls alternating.

Every variant is called in turn (A, B, C, A, B, C, ...) so that load changes on a shared
machine hit all of them alike; products run on distinct operands (`distinct_operands`) so that
no graph optimisation can merge them.
"""

import argparse
import time
from typing import Callable, Dict, List

from benchmarks.cli_types import positive_int


def add_product_flags(parser: argparse.ArgumentParser, reps: int, calls: int = 7) -> None:
    """--dtype, --reps and --calls of a benchmark of products (`reps`, `calls`: defaults)."""
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                        help="operand dtype. Default: float32")
    parser.add_argument("--reps", type=positive_int, default=reps,
                        help=f"products per timed call, on distinct inputs. Default: {reps}")
    parser.add_argument("--calls", type=positive_int, default=calls,
                        help=f"timed calls per variant (after two untimed ones). Default: {calls}")


def add_token_batch_flags(parser: argparse.ArgumentParser) -> None:
    """--batch and --seq-length: the [batch, L] token batch whose shapes a benchmark uses."""
    parser.add_argument("--batch", type=positive_int, default=32, help="batch size. Default: 32")
    parser.add_argument("--seq-length", type=positive_int, default=128, help="L. Default: 128")


def product_parser(doc: str, reps: int) -> argparse.ArgumentParser:
    """The command line of a micro-benchmark of products at a token batch's shapes: the first
    paragraph of `doc` (the script's docstring) as its description, --batch and --seq-length,
    --dtype, --reps (default `reps`) and --calls. A script adds its own flags before parsing."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_token_batch_flags(parser)
    add_product_flags(parser, reps=reps)
    return parser


def distinct_operands(shape, dtype, reps: int, salt: int) -> list:
    """`reps` variables of `shape` and `dtype`, standard normal, seeded by (salt, index)."""
    import tensorflow as tf

    return [tf.Variable(tf.cast(tf.random.stateless_normal(shape, seed=[salt, i]), dtype))
            for i in range(reps)]


def time_alternating(functions: Dict[str, Callable], calls: int,
                     warmup: int = 2) -> Dict[str, List[float]]:
    """Seconds of each of `calls` calls per function, after `warmup` untimed calls of each.

    Each call is timed until its last output exists on the host (`.numpy()`), the calls of the
    functions alternating. Functions are called without arguments.
    """
    import tensorflow as tf

    for _ in range(warmup):
        for function in functions.values():
            function()
    times = {name: [] for name in functions}
    for _ in range(calls):
        for name, function in functions.items():
            start = time.perf_counter()
            _ = tf.nest.flatten(function())[-1].numpy()
            times[name].append(time.perf_counter() - start)
    return times
