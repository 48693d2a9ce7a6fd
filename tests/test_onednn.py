"""electra_tf.onednn: TensorFlow's oneDNN kernels turned on for AVX2-only x86 CPUs, never
against the user's own setting, and only before TensorFlow loads."""

import os
import subprocess
import sys

import pytest

from electra_tf import onednn
from tests import pretraining_fixtures as fx

ZEN3 = frozenset({"sse4_2", "avx", "avx2", "fma"})
ZEN4 = frozenset({"avx2", "fma", "avx512f", "avx512_bf16"})
ARM = frozenset({"fp", "asimd", "sve"})


@pytest.mark.parametrize("flags,expected", [
    (ZEN3, "1"),  # TensorFlow's default leaves oneDNN off here
    (ZEN4, None),  # TensorFlow turns it on itself
    (ARM, None), (frozenset(), None),
])
def test_set_only_on_avx2_without_avx512(flags, expected):
    environ = {}
    assert onednn.set_default(environ, flags, tensorflow_imported=False) == expected
    assert environ == ({} if expected is None else {onednn.ENV: "1"})


def test_unreadable_flags_change_nothing():
    assert not onednn.wanted(None)


@pytest.mark.parametrize("users", ["0", "1", ""])
def test_the_users_setting_wins(users):
    environ = {onednn.ENV: users}
    assert onednn.set_default(environ, ZEN3, tensorflow_imported=False) is None
    assert environ == {onednn.ENV: users}


def test_too_late_once_tensorflow_is_imported():
    environ = {}
    assert onednn.set_default(environ, ZEN3, tensorflow_imported=True) is None
    assert environ == {}


_CHILD = """
import os, sys
import electra_tf
import tensorflow as tf
from tensorflow.python.util import _pywrap_util_port
print(os.environ.get("TF_ENABLE_ONEDNN_OPTS"), _pywrap_util_port.IsMklEnabled())
"""


def test_importing_the_package_decides_before_tensorflow_loads():
    """In a fresh process: the package's import sets the switch on this machine's CPU as
    `wanted` says, and TensorFlow then runs with oneDNN wherever the switch is 1."""
    env = fx.subprocess_env()
    env.pop(onednn.ENV, None)
    out = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    from electra_tf.precision import read_cpu

    if onednn.wanted(read_cpu()[1]):
        assert out == ["1", "True"], out
    else:
        assert out[0] == "None", out
    env[onednn.ENV] = "0"
    out = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    assert out == ["0", "False"], out
