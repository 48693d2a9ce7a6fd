"""`portable_support.use_compilation_cache` (issue 45, the time to the first step): a JAX run
turns on XLA's persistent compilation cache, so a second process (a resumed run) loads what the
first compiled; `ELECTRA_TF_JAX_COMPILATION_CACHE=off` keeps it off and a cache the user set is
kept. In JAX children (JAX reads its cache settings per process), TensorFlow unimportable."""

import numpy as np

from tests import backends

_CHILD = """
import jax
import jax.numpy as jnp

from electra_tf.training.portable import support as portable_support

hits = []
jax.monitoring.register_event_listener(
    lambda event, **kw: hits.append(event)
    if event == "/jax/compilation_cache/cache_hits" else None)
path = portable_support.use_compilation_cache("jax")
out["path"] = np.array(path or "")
out["torch"] = np.array(portable_support.use_compilation_cache("torch") or "")
jax.jit(lambda x: jnp.tanh(x) * 3.0 + x)(jnp.arange(5.0)).block_until_ready()
out["hits"] = np.array(len(hits))
"""


def _run(**env):
    # The session's own cache (conftest) is unset: the function chooses.
    got = backends.run_on_backend("jax", _CHILD, env=dict({"JAX_COMPILATION_CACHE_DIR": ""},
                                                          **env))
    return str(got["path"]), int(got["hits"]), str(got["torch"])


def test_second_process_loads_the_compiled_program(tmp_path):
    backends.require("jax")
    cache = str(tmp_path / "cache")
    path, hits, torch = _run(ELECTRA_TF_JAX_COMPILATION_CACHE=cache)
    assert (path, hits, torch) == (cache, 0, "")
    assert any(p.is_file() for p in (tmp_path / "cache").rglob("*"))  # written
    path, hits, _ = _run(ELECTRA_TF_JAX_COMPILATION_CACHE=cache)
    assert path == cache and hits >= 1  # read back (the jitted function, the eager arange)


def test_off_and_a_cache_set_by_the_user(tmp_path):
    backends.require("jax")
    assert _run(ELECTRA_TF_JAX_COMPILATION_CACHE="off")[:2] == ("", 0)
    mine = str(tmp_path / "mine")
    got = backends.run_on_backend("jax", _CHILD, env={"JAX_COMPILATION_CACHE_DIR": mine,
                                                      "ELECTRA_TF_JAX_COMPILATION_CACHE": "x"})
    assert str(got["path"]) == mine


def test_an_unwritable_cache_directory_leaves_it_off(tmp_path):
    backends.require("jax")
    blocker = tmp_path / "file"
    blocker.write_text("")  # a file where the directory's parent should be
    assert _run(ELECTRA_TF_JAX_COMPILATION_CACHE=str(blocker / "cache"))[:2] == ("", 0)
