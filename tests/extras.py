"""Optional dependencies (the package's extras) in tests.

Where an extra is not installed its tests are skipped; in CI (`CI=true`, set by `.ci/run`), whose
test command installs every extra, a missing one is an error instead, so the tests of an extra
can never pass by being skipped there.
"""

import importlib
import os

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def import_extra(module: str, extra: str):
    """`module`, or skip the calling test (module) where the `[extra]` is not installed."""
    if in_ci():
        return importlib.import_module(module)
    return pytest.importorskip(module, reason=f"needs the [{extra}] extra: "
                                              f"pip install -e '.[{extra}]'")
