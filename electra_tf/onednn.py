"""oneDNN kernels for TensorFlow on x86 CPUs without AVX-512 too.

TensorFlow's Linux x86 wheels turn their oneDNN optimisations (oneDNN matmuls and fused
matmul + bias + activation kernels instead of Eigen's) on by default only on CPUs with AVX-512
class features; on an AVX2-only CPU (an AMD EPYC Zen 3, many laptops and cloud VMs) they stay
off. There the ELECTRA-small float32 training step ran at 11.7 sequences/s with oneDNN and 8.6
without (batch 32, 2 cores, docs/benchmarks.md, issue 30), so electra-tf turns them on for such
CPUs. TensorFlow reads the switch, the `TF_ENABLE_ONEDNN_OPTS` environment variable, once when
it is imported: `electra_tf/__init__.py` calls `set_default()` before any module of the package
imports TensorFlow. A user's own `TF_ENABLE_ONEDNN_OPTS` (0 or 1) always wins.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import MutableMapping, Optional

from electra_tf.precision import read_cpu

logger = logging.getLogger("electra_tf")

ENV = "TF_ENABLE_ONEDNN_OPTS"


def wanted(cpu_flags: Optional[frozenset]) -> bool:
    """Whether electra-tf turns oneDNN on for a CPU with these flags: an x86 CPU with AVX2
    whose TensorFlow default leaves it off (no AVX-512)."""
    return cpu_flags is not None and "avx2" in cpu_flags and "avx512f" not in cpu_flags


def set_default(environ: MutableMapping[str, str] = os.environ,
                cpu_flags: Optional[frozenset] = None,
                tensorflow_imported: Optional[bool] = None) -> Optional[str]:
    """Sets `TF_ENABLE_ONEDNN_OPTS=1` on an AVX2-only x86 CPU unless the user set it.

    Args:
        environ: the environment to change (the process's).
        cpu_flags: the CPU's flags; None reads them from /proc/cpuinfo.
        tensorflow_imported: whether TensorFlow is already imported (too late to switch: it is
            left as it is); None looks in `sys.modules`.

    Returns:
        The value set, or None when nothing was changed.
    """
    if ENV in environ:
        return None
    if tensorflow_imported is None:
        tensorflow_imported = "tensorflow" in sys.modules
    if cpu_flags is None:
        cpu_flags = read_cpu()[1]
    if not wanted(cpu_flags) or tensorflow_imported:
        return None
    environ[ENV] = "1"
    return "1"
