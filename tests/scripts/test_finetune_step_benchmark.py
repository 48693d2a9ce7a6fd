"""benchmarks/finetune_step.py: its command line, the CPU flags it records, and (slow) a tiny
alternating run of both backends' fine-tuning steps."""

import json
import os
import subprocess
import sys

import pytest

from benchmarks import finetune_step
from electra_tf import malloc_tunables, precision

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_help_names_the_size_flags():
    out = subprocess.run([sys.executable, "benchmarks/finetune_step.py", "--help"], cwd=REPO_ROOT,
                         capture_output=True, text=True, check=True).stdout
    assert "--tiny" in out and "--size" in out and "--no-dropout" in out and "auto" in out


def test_unknown_backend_is_refused_in_one_line(capsys):
    with pytest.raises(SystemExit):
        finetune_step.parse_args(["--backends", "tensorflow,mxnet"])
    assert "--backends takes tensorflow and jax, got 'tensorflow,mxnet'" in capsys.readouterr().err


def test_tiny_and_size_exclude_each_other():
    with pytest.raises(SystemExit):
        finetune_step.parse_args(["--tiny", "--size", "base"])


def test_cpu_flags_reads_avx512_and_amx_names(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("flags\t: fpu avx2 avx512f avx512_bf16 amx_tile amx_bf16 sse4_2\n"
                    "flags\t: fpu avx2 avx512f avx512_bf16 amx_tile amx_bf16 sse4_2\n")
    assert finetune_step.cpu_flags(str(info)) == ["amx_bf16", "amx_tile", "avx512_bf16",
                                                  "avx512f"]
    assert finetune_step.cpu_flags(str(tmp_path / "absent")) == []


@pytest.mark.parametrize("argv", [["--backends", "jax", "--tiny"], ["--backends=jax", "--tiny"],
                                  ["--tiny", "--backends", "tensorflow,jax"]])
def test_workers_get_every_argument_but_backends(argv):
    assert finetune_step.worker_argv(argv) == ["--tiny"]
    # What the worker parses: a leftover backend name would be an unknown argument.
    assert finetune_step.parse_args(finetune_step.worker_argv(argv) + ["--worker", "jax"]).tiny


@pytest.mark.slow  # 65 s on 2 cores at load 7: two workers build and compile the tiny model
def test_tiny_run_times_both_backends_alternately(tmp_path):
    vocab = tmp_path / "vocab.txt"  # the model's vocab_size stays BERT's; any smaller vocab fits
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b"]) + "\n")
    out = subprocess.run([sys.executable, "benchmarks/finetune_step.py", "--tiny", "--rounds", "2",
                          "--steps", "1", "--warmup", "1", "--vocab-file", str(vocab),
                          "--precision", "auto"],
                         cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout
    result = json.loads(out)
    for backend in finetune_step.BACKENDS:
        timing = result["backends"][backend]
        assert len(timing["rounds"]) == 2
        assert timing["median_cpu_ms"] > 0 and timing["median_wall_ms"] > 0
    assert set(result["jax_over_tensorflow"]) == {"wall", "cpu"}
    # auto as each runner decides it on this CPU: JAX's CPU backend always float32
    name, flags = precision.read_cpu()
    assert result["backends"]["tensorflow"]["precision"] == precision.resolve(
        "auto", precision.DeviceFacts("cpu", name, flags), ("float32", "mixed_bfloat16")).policy
    assert result["backends"]["jax"]["precision"] == "float32"
    # The JAX worker runs with the malloc tunables its runner sets here (where it sets them).
    assert (result["backends"]["jax"]["glibc_tunables"] or "").endswith(
        ":".join(malloc_tunables.TUNABLES)) == (
        malloc_tunables.environ_for_jax(os.environ) is not None)
    assert len(result["loadavg_before"]) == 3
