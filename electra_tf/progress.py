"""Progress lines for long steps (fetch, build, train, fine-tune): rate and time left.

Pure standard library, so light tools (the fetch) use it without importing TensorFlow.
"""

from __future__ import annotations

import math
import time
from typing import Optional


def format_duration(seconds: float) -> str:
    """`1h02m03s`, or `?` for an unknown (infinite or NaN) duration."""
    if not math.isfinite(seconds):
        return "?"
    seconds = max(int(seconds), 0)
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m{seconds % 60:02d}s"


def eta_seconds(done: float, total: float, elapsed: float) -> float:
    """Seconds left at the average rate so far (inf before any progress)."""
    if done <= 0 or elapsed <= 0:
        return float("inf")
    return max(total - done, 0) * elapsed / done


class RateEta:
    """Measures a long step from its creation: `describe(done, total)` gives
    `"<rate> <unit>/s, ETA 0h01m02s"` at the average rate so far.

    Args:
        unit: str. What `done` and `total` count ("MB", "steps").
        scale: float. `done / scale` is shown as the rate (e.g. 1e6 for bytes shown as MB).
    """

    def __init__(self, unit: str, scale: float = 1.0, clock=time.monotonic):
        self.unit = unit
        self.scale = scale
        self.clock = clock
        self.start = clock()

    def elapsed(self) -> float:
        return self.clock() - self.start

    def describe(self, done: float, total: Optional[float]) -> str:
        elapsed = self.elapsed()
        rate = done / self.scale / elapsed if elapsed > 0 else float("nan")
        text = f"{rate:.1f} {self.unit}/s"
        if total is not None:
            text += f", ETA {format_duration(eta_seconds(done, total, elapsed))}"
        return text
