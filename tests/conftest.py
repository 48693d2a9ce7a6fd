"""Shared pytest setup.

Two logical CPU devices are configured before any TensorFlow op runs, so distributed tests can use
`tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])`; single-device code is unaffected.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # reference libraries must never reach a hub

import pytest  # noqa: E402

import electra_tf  # noqa: E402,F401  (before TensorFlow: its oneDNN default, electra_tf/onednn.py)
import tensorflow as tf  # noqa: E402

_cpus = tf.config.list_physical_devices("CPU")
if _cpus:
    try:
        tf.config.set_logical_device_configuration(
            _cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2)
    except RuntimeError:  # already initialised by an earlier import: keep what exists
        pass

from tests import pretraining_fixtures as fx  # noqa: E402

REPO_ROOT = fx.REPO_ROOT


@pytest.fixture
def repo_root():
    return REPO_ROOT


@pytest.fixture(scope="session", autouse=True)
def _child_tmpdir(tmp_path_factory):
    """Child processes started with `subprocess_env` keep their temp files under pytest's
    basetemp instead of /tmp (see `pretraining_fixtures.CHILD_TMPDIR`)."""
    fx.CHILD_TMPDIR = str(tmp_path_factory.mktemp("child-tmp"))
    yield
    fx.CHILD_TMPDIR = None


@pytest.fixture(scope="session", autouse=True)
def _jax_compilation_cache(tmp_path_factory):
    """One persistent XLA compilation cache for the session's JAX children: the JAX tests run
    the same tiny programs in several processes (a reference run, a killed run, its resume), and
    each compiled them from scratch (JAX reads JAX_COMPILATION_CACHE_DIR at import). Under
    pytest's basetemp, so every test session starts cold, as CI does."""
    cache = str(tmp_path_factory.mktemp("jax-cache"))
    saved = os.environ.get("JAX_COMPILATION_CACHE_DIR")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = cache
    yield
    if saved is None:
        os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)
    else:
        os.environ["JAX_COMPILATION_CACHE_DIR"] = saved


@pytest.fixture(autouse=True)
def _auto_precision_is_float32(monkeypatch):
    """`mixed_precision: "auto"` (the default) resolves to float32 in-process on every CI
    machine: the CPU's facts are read as they are, less its native-bf16 flags (AMX,
    AVX512_BF16), so a test's numbers do not depend on which CPU kind ran it. The tests of
    auto itself (tests/test_precision.py) inject the facts they need."""
    from electra_tf import precision

    real = precision.detect

    def without_native_bf16(strategy=None, cpu_info=precision.CPU_INFO):
        facts = real(strategy, cpu_info)
        if facts.kind != "cpu" or facts.cpu_flags is None:
            return facts
        return precision.DeviceFacts(
            "cpu", facts.name, facts.cpu_flags - set(precision.NATIVE_BF16_CPU_FLAGS))

    monkeypatch.setattr(precision, "detect", without_native_bf16)


@pytest.fixture(scope="module", autouse=True)
def _module_graphs_released():
    """Frees each module's traced graphs when it ends: TensorFlow's custom-gradient registry would
    keep them all (electra_tf/training/tf/graph_leaks.py), ~7 GB per pytest process by the end."""
    from electra_tf.training.tf import graph_leaks

    with graph_leaks.custom_gradients_released():
        yield


@pytest.fixture(scope="session")
def mirrored_strategy():
    """One two-replica MirroredStrategy for the whole session.

    TF 2.21 on CPU numbers collective instances per strategy object, so two MirroredStrategy
    objects in one process that run different graphs can collide ("Shape mismatch in the
    collective instance"): every test shares this one.
    """
    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """A module's pretraining dataset: `pretraining_fixtures.write_dataset` (vocab, train and
    eval shards, manifest) in a fresh directory."""
    path = str(tmp_path_factory.mktemp("data"))
    fx.write_dataset(path)
    return path


@pytest.fixture
def float32_policy():
    """Restores Keras' float32 policy after a test that builds a Trainer (which sets the policy
    of its config globally). Use with `pytestmark = pytest.mark.usefixtures("float32_policy")`."""
    yield
    import keras

    keras.mixed_precision.set_global_policy("float32")
