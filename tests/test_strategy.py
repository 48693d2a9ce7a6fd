"""Strategy selection: never a TPU resolver without a name, clear errors for impossible choices.

No test here creates a real TPUClusterResolver: an unnamed one queries a cloud metadata address.
The resolver class is replaced by a recorder that refuses to be constructed, so reaching it at all
fails the test (or, for a named TPU, proves it is reached with that name and nothing else runs).
"""

import pytest
import tensorflow as tf

from electra_tf.training import strategy as strategy_lib


class _ResolverCalled(Exception):
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
