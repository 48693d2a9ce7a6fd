"""glibc's malloc settings for a JAX run on a CPU: keep XLA:CPU's per-step buffer mapped.

XLA:CPU allocates each execution's temporary buffer with `posix_memalign` (1.26 GB for the
ELECTRA-small fine-tuning step at batch 32, sequence 128) from one of its worker threads. glibc
serves a request that large from a fresh `mmap` (a thread's arena always maps requests its
64 MB heaps cannot hold, whatever `mmap_max` says) and unmaps it on `free`, so every step
page-faults its whole working set in again: 300k minor faults and about 0.5 s of kernel time
per 2 s step on a 2-core AMD EPYC Zen 4, where TensorFlow's step (its own allocator) has none
(docs/benchmarks.md, "The host allocator"). With one arena (`arena_max=1`), no `mmap` for
large requests (`mmap_max=0`) and no trimming of the heap's top (`trim_threshold` above any
buffer), the buffer is carved from the main heap once and reused: the fine-tuning step took
1.72-1.86 s of wall time against 2.05-2.09 (-15%).

glibc reads its tunables (`GLIBC_TUNABLES`) once, when the process starts, so a tool that runs
on JAX re-executes itself with them set (`reexec_for_jax`, from the tools' `main` only: the
process keeps its id, arguments and standard streams; a library caller's process is never
re-executed). Nothing is changed when the user set malloc tunables of their own, when
`ELECTRA_TF_MALLOC_TUNABLES=off`, off Linux/glibc, or where an accelerator is present (the
step's buffers live on the device there; `JAX_PLATFORMS=cpu` counts as none). The cost: the
process keeps its peak heap mapped until it exits (its peak is the step's working set anyway).
"""

from __future__ import annotations

import glob
import logging
import os
import platform
import sys
from typing import Iterable, Mapping, Optional

logger = logging.getLogger("electra_tf")

GLIBC_TUNABLES_ENV = "GLIBC_TUNABLES"
OPT_OUT_ENV = "ELECTRA_TF_MALLOC_TUNABLES"  # "off" (or 0, false, no): leave malloc as it is
# Above any buffer a step allocates (64 GiB), so free() never hands the heap's top back.
TRIM_THRESHOLD = 64 << 30
TUNABLES = ("glibc.malloc.arena_max=1", "glibc.malloc.mmap_max=0",
            f"glibc.malloc.trim_threshold={TRIM_THRESHOLD}")
# Device files of the accelerators JAX would run on instead of the CPU: NVIDIA GPUs, TPUs
# (v2-v3: /dev/accel*, v4 and later: /dev/vfio/<n>), AMD GPUs.
ACCELERATOR_DEVICE_GLOBS = ("/dev/nvidiactl", "/dev/accel[0-9]*", "/dev/vfio/[0-9]*",
                            "/dev/kfd")


def is_glibc() -> bool:
    """Whether this process runs on Linux with glibc (whose malloc reads GLIBC_TUNABLES)."""
    return sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"


def accelerator_present(environ: Mapping[str, str] = os.environ,
                        device_globs: Iterable[str] = ACCELERATOR_DEVICE_GLOBS) -> bool:
    """Whether JAX would run on an accelerator here: `JAX_PLATFORMS` when set (`cpu` alone
    means none), else whether a GPU's or TPU's device file exists."""
    platforms = environ.get("JAX_PLATFORMS", "").strip()
    if platforms:
        return any(p.strip() not in ("", "cpu") for p in platforms.split(","))
    return any(glob.glob(pattern) for pattern in device_globs)


def applied(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the environment carries every one of electra-tf's tunables."""
    present = set(environ.get(GLIBC_TUNABLES_ENV, "").split(":"))
    return all(t in present for t in TUNABLES)


def environ_for_jax(environ: Mapping[str, str] = os.environ, *, glibc: Optional[bool] = None,
                    accelerator: Optional[bool] = None) -> Optional[dict]:
    """The environment a JAX run on a CPU should start with, or None when it should start with
    `environ` as it is (see the module docstring for when).

    Args:
        environ: the current environment.
        glibc: whether malloc is glibc's; None asks `is_glibc`.
        accelerator: whether JAX would run on an accelerator; None asks `accelerator_present`.

    Returns:
        A copy of `environ` with the tunables appended to `GLIBC_TUNABLES` (the user's other
        tunables kept), or None.
    """
    if environ.get(OPT_OUT_ENV, "").strip().lower() in ("off", "0", "false", "no"):
        return None
    if applied(environ):
        return None
    current = [t for t in environ.get(GLIBC_TUNABLES_ENV, "").split(":") if t]
    if any(t.startswith("glibc.malloc.") for t in current):
        return None  # the user tuned malloc: theirs wins
    if not (is_glibc() if glibc is None else glibc):
        return None
    if accelerator_present(environ) if accelerator is None else accelerator:
        return None
    return dict(environ, **{GLIBC_TUNABLES_ENV: ":".join(current + list(TUNABLES))})


def reexec_for_jax() -> None:
    """From a tool's `main` (flags parsed, nothing heavy imported yet) when it runs on JAX:
    re-executes the process with `environ_for_jax`'s environment, same interpreter, flags and
    arguments (`sys.orig_argv`). Returns when nothing needs changing; logs one line when the
    tunables are in effect."""
    if applied():
        logger.info("malloc: %s for XLA:CPU's per-step buffers (%s=off to leave malloc alone)",
                    ":".join(TUNABLES[:2] + (
                        f"glibc.malloc.trim_threshold={TRIM_THRESHOLD >> 30}GiB",)),
                    OPT_OUT_ENV)
        return
    environ = environ_for_jax()
    argv = list(getattr(sys, "orig_argv", None) or [])
    # A program read from standard input (`python - < tool.py`) cannot be read again.
    if environ is None or not sys.executable or len(argv) < 2 or argv[1] == "-":
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable] + argv[1:], environ)
