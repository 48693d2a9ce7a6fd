"""Strategy selection: never a TPU resolver without a name, clear errors for impossible choices.

No test here creates a real TPUClusterResolver: an unnamed one queries a cloud metadata address.
The resolver class is replaced by a recorder that refuses to be constructed, so reaching it at all
fails the test (or, for a named TPU, proves it is reached with that name and nothing else runs).
"""

import pytest
import tensorflow as tf

from electra_tf.training.tf import strategy as strategy_lib
from tests import pretraining_fixtures as fx


class _ResolverCalled(BaseException):  # not caught as a resolver error (strategy.py)
    pass


@pytest.fixture
def resolver_calls(monkeypatch):
    calls = []

    def fake_resolver(*args, **kwargs):
        calls.append((args, kwargs))
        raise _ResolverCalled(kwargs)

    monkeypatch.setattr(tf.distribute.cluster_resolver, "TPUClusterResolver", fake_resolver)
    monkeypatch.delenv("TPU_NAME", raising=False)
    monkeypatch.delenv("TF_CONFIG", raising=False)
    return calls


def test_auto_without_tpu_name_is_default_strategy_and_creates_no_resolver(resolver_calls):
    result = strategy_lib.get_strategy("auto")
    assert resolver_calls == []
    # No GPU here: auto is the default (single-device) strategy.
    assert result is tf.distribute.get_strategy()
    assert not tf.distribute.has_strategy()
    assert result.num_replicas_in_sync == 1
    assert strategy_lib.is_chief(result)


def test_auto_with_empty_tpu_name_env_creates_no_resolver(resolver_calls, monkeypatch):
    monkeypatch.setenv("TPU_NAME", "")
    assert strategy_lib.get_strategy("auto") is tf.distribute.get_strategy()
    assert resolver_calls == []


def test_tpu_without_a_name_raises_before_any_resolver(resolver_calls):
    with pytest.raises(strategy_lib.StrategyError, match="tpu_name"):
        strategy_lib.get_strategy("tpu")
    assert resolver_calls == []


@pytest.mark.parametrize("source", ["hparam", "env"])
def test_auto_with_a_named_tpu_asks_for_exactly_that_tpu(resolver_calls, monkeypatch, source):
    if source == "env":
        monkeypatch.setenv("TPU_NAME", "my-tpu")
        tpu_name = None
    else:
        tpu_name = "my-tpu"
    with pytest.raises(_ResolverCalled):
        strategy_lib.get_strategy("auto", tpu_name=tpu_name, tpu_zone="z", gcp_project="p")
    assert resolver_calls == [((), {"tpu": "my-tpu", "zone": "z", "project": "p"})]


def test_unknown_strategy_is_an_error(resolver_calls):
    with pytest.raises(strategy_lib.StrategyError, match="'gpu'"):
        strategy_lib.get_strategy("gpu")


def test_multi_worker_needs_valid_tf_config(resolver_calls, monkeypatch):
    with pytest.raises(strategy_lib.StrategyError, match="TF_CONFIG"):
        strategy_lib.get_strategy("multi_worker")
    monkeypatch.setenv("TF_CONFIG", "{not json")
    with pytest.raises(strategy_lib.StrategyError, match="TF_CONFIG is not valid JSON"):
        strategy_lib.get_strategy("multi_worker")


def test_one_device_strategy_on_cpu(resolver_calls):
    result = strategy_lib.get_strategy("one_device")
    assert isinstance(result, tf.distribute.OneDeviceStrategy)
    assert "CPU:0" in result.extended.worker_devices[0].upper()
    assert result.num_replicas_in_sync == 1


def test_tpu_name_resolution_order(monkeypatch):
    monkeypatch.setenv("TPU_NAME", "from-env")
    assert strategy_lib.tpu_name_from("from-hparam") == "from-hparam"
    assert strategy_lib.tpu_name_from(None) == "from-env"
    monkeypatch.delenv("TPU_NAME")
    assert strategy_lib.tpu_name_from(None) is None


_THREADS_SCRIPT = """
import json, sys
import tensorflow as tf
from electra_tf.training.tf import strategy as strategy_lib
name, threads, virtual_cpus = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
if virtual_cpus > 1:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * virtual_cpus)
strategy_lib.get_strategy(name, inter_op_threads=threads)
tf.constant(1.0) + 1.0  # the runtime is up: the setting is fixed now
print(tf.config.threading.get_inter_op_parallelism_threads())
"""


@pytest.mark.parametrize("name,threads,virtual_cpus,expected", [
    ("auto", None, 1, 1),         # single-device CPU run: one op at a time
    ("one_device", None, 1, 1),
    ("auto", 0, 1, 0),            # 0 keeps TensorFlow's default
    ("auto", 3, 1, 3),
    ("mirrored", None, 2, 0),     # replicas on one host need concurrent ops
    ("auto", None, 2, 0),         # logical CPUs configured for replicas: left alone
])
def test_inter_op_threads_default_in_a_fresh_process(name, threads, virtual_cpus, expected):
    # A fresh process: TensorFlow fixes thread pools when its runtime starts (pytest's already has).
    import json
    import os
    import subprocess
    import sys

    root = fx.REPO_ROOT
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=root)
    env.pop("TF_CONFIG", None)
    env.pop("TPU_NAME", None)
    out = subprocess.run([sys.executable, "-c", _THREADS_SCRIPT, name, json.dumps(threads),
                          str(virtual_cpus)], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout.strip().splitlines()[-1]) == expected


def test_inter_op_threads_after_the_runtime_started_keeps_the_current_setting():
    tf.constant(0.0) + 1.0
    current = tf.config.threading.get_inter_op_parallelism_threads()
    assert strategy_lib.set_inter_op_threads(current + 5) == current
    assert tf.config.threading.get_inter_op_parallelism_threads() == current
