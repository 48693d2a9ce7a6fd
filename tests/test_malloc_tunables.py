"""electra_tf.malloc_tunables: a JAX tool on a CPU re-executes itself with glibc's malloc set to
keep large buffers mapped, never against the user's own malloc tunables, never in a caller's
process; and glibc does what the module counts on (a thread's large buffer stops page-faulting
in anew after each free)."""

import json
import os
import subprocess
import sys

import pytest

from electra_tf import malloc_tunables as mt
from electra_tf.commands import finetune, pretrain
from tests import pretraining_fixtures as fx

OURS = ":".join(mt.TUNABLES)
glibc_only = pytest.mark.skipif(not mt.is_glibc(), reason="glibc's malloc only")


def test_adds_the_tunables_on_a_cpu_machine():
    env = mt.environ_for_jax({"PATH": "/bin"}, glibc=True, accelerator=False)
    assert env == {"PATH": "/bin", mt.GLIBC_TUNABLES_ENV: OURS}
    assert mt.applied(env)


def test_keeps_the_users_other_tunables():
    env = mt.environ_for_jax({mt.GLIBC_TUNABLES_ENV: "glibc.pthread.rseq=0"}, glibc=True,
                             accelerator=False)
    assert env[mt.GLIBC_TUNABLES_ENV] == "glibc.pthread.rseq=0:" + OURS


@pytest.mark.parametrize("environ", [
    {mt.GLIBC_TUNABLES_ENV: "glibc.malloc.arena_max=4"},  # the user tuned malloc: theirs wins
    {mt.OPT_OUT_ENV: "off"}, {mt.OPT_OUT_ENV: "0"}, {mt.OPT_OUT_ENV: "No"},
    {mt.GLIBC_TUNABLES_ENV: OURS},  # already in effect: no second re-execution
])
def test_leaves_the_environment_alone(environ):
    assert mt.environ_for_jax(environ, glibc=True, accelerator=False) is None


def test_not_on_another_libc_nor_beside_an_accelerator():
    assert mt.environ_for_jax({}, glibc=False, accelerator=False) is None
    assert mt.environ_for_jax({}, glibc=True, accelerator=True) is None


@pytest.mark.parametrize("platforms,expected", [
    ("cpu", False), (" cpu ", False), ("cuda", True), ("cpu,cuda", True), ("tpu", True)])
def test_jax_platforms_decides_when_set(platforms, expected, tmp_path):
    device = tmp_path / "nvidiactl"
    device.write_text("")
    assert mt.accelerator_present({"JAX_PLATFORMS": platforms}, [str(device)]) is expected


def test_device_files_decide_otherwise(tmp_path):
    assert not mt.accelerator_present({}, [str(tmp_path / "accel[0-9]*")])
    (tmp_path / "accel0").write_text("")
    assert mt.accelerator_present({}, [str(tmp_path / "accel[0-9]*")])


_FAULTS = r"""
import ctypes, json, resource, threading
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
size, faults = 256 << 20, []
def step():  # as XLA:CPU's worker thread: allocate the step's buffer, write it, free it
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    p = libc.malloc(size)
    ctypes.memset(p, 1, size)
    libc.free(p)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
for _ in range(3):
    t = threading.Thread(target=step)
    t.start()
    t.join()
print(json.dumps(faults))
"""


@glibc_only
def test_glibc_keeps_a_threads_large_buffer_mapped_with_the_tunables():
    def faults(**extra):
        env = fx.subprocess_env(**extra)
        env.pop(mt.GLIBC_TUNABLES_ENV, None)
        env.update(extra)
        out = subprocess.run([sys.executable, "-c", _FAULTS], capture_output=True, text=True,
                             timeout=120, env=env, check=True).stdout
        return json.loads(out)

    default = faults()
    tuned = faults(**{mt.GLIBC_TUNABLES_ENV: OURS})
    # Relative to the first step's faults: 65,537 with 4 KB pages, ~128 where transparent huge
    # pages are "always" (2 MB pages), not a page count fixed here.
    assert default[0] >= 100 and tuned[0] >= 100, (default, tuned)
    # Without: every step maps the buffer anew and faults it all in again.
    assert all(f > default[0] // 2 for f in default[1:]), default
    # With: the first step faults it in, the later ones reuse it.
    assert all(f <= tuned[0] // 20 for f in tuned[1:]), tuned


_REEXEC = r"""
import os, sys
from electra_tf import malloc_tunables
print("run", os.getpid(), os.environ.get("GLIBC_TUNABLES"), sys.argv[1:], flush=True)
malloc_tunables.reexec_for_jax()
print("after", flush=True)
"""


@glibc_only
def test_reexec_keeps_the_process_and_its_arguments():
    env = fx.subprocess_env(JAX_PLATFORMS="cpu")
    env.pop(mt.GLIBC_TUNABLES_ENV, None)
    env.pop(mt.OPT_OUT_ENV, None)
    proc = subprocess.run([sys.executable, "-c", _REEXEC, "--flag", "a b"], capture_output=True,
                          text=True, timeout=120, env=env, check=True)
    lines = proc.stdout.splitlines()
    assert len(lines) == 3 and lines[2] == "after", proc.stdout
    first, second = (line.split(" ", 3) for line in lines[:2])
    assert first[1] == second[1]  # the same process id: exec, not a child
    assert first[2] == "None" and second[2] == OURS
    assert first[3] == second[3] == "['--flag', 'a b']"


@pytest.mark.parametrize("orig_argv", [["python", "-"], ["python"]])
def test_no_reexec_of_a_program_read_from_stdin(orig_argv, monkeypatch):
    monkeypatch.delenv(mt.GLIBC_TUNABLES_ENV, raising=False)
    monkeypatch.delenv(mt.OPT_OUT_ENV, raising=False)
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.setattr(sys, "orig_argv", orig_argv, raising=False)
    monkeypatch.setattr(mt, "is_glibc", lambda: True)
    calls = []
    monkeypatch.setattr(os, "execve", lambda *a: calls.append(a))
    mt.reexec_for_jax()
    assert calls == []
    monkeypatch.setattr(sys, "orig_argv", ["python", "tool.py", "--x"], raising=False)
    mt.reexec_for_jax()  # the same process with a script: re-executed
    assert calls == [(sys.executable, [sys.executable, "tool.py", "--x"],
                      dict(os.environ, **{mt.GLIBC_TUNABLES_ENV: OURS}))]


class _Reexec(Exception):
    pass


def _record_reexec(monkeypatch):
    calls = []

    def reexec():
        calls.append(True)
        raise _Reexec

    monkeypatch.setattr(mt, "reexec_for_jax", reexec)
    return calls


@pytest.mark.parametrize("tool,argv,runner", [
    (finetune, ["--backend", "jax", "--model-name", "m", "--data-dir", "d"], "run_cli"),
    (pretrain, ["--backend", "jax", "--model-name", "m", "--data-dir", "d"],
     "run_pretraining_cli"),
])
def test_the_tools_reexecute_from_the_command_line_only(tool, argv, runner, monkeypatch):
    calls = _record_reexec(monkeypatch)
    monkeypatch.setattr(sys, "argv", ["tool"] + argv)
    monkeypatch.setenv("KERAS_BACKEND", "jax")
    with pytest.raises(_Reexec):
        tool.main()
    assert calls == [True]
    calls.clear()
    monkeypatch.setattr(tool, runner, lambda *a, **k: 0)
    assert tool.main(argv) == 0  # a caller's process (a test, a notebook) is never re-executed
    assert calls == []


def test_a_tensorflow_run_is_not_reexecuted(monkeypatch):
    calls = _record_reexec(monkeypatch)
    monkeypatch.setattr(sys, "argv", ["tool", "--model-name", "m", "--data-dir", "d"])
    monkeypatch.setattr(finetune, "run_cli", lambda *a, **k: 0)
    monkeypatch.setattr(finetune.console, "import_tensorflow", lambda: None)
    assert finetune.main() == 0
    assert calls == []
