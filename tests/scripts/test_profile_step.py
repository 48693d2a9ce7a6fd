"""benchmarks/profile_step.py: the HLO reading and categories on a written module and trace, and
(slow) a real capture of the tiny model on CPU JAX, parsed; benchmarks/gpu_session.sh's CPU
dry run (slow)."""

import gzip
import json
import os
import subprocess
import sys
import tarfile

import pytest

from benchmarks import profile_step
from tests import pretraining_fixtures as fx

# A module in the optimized-HLO text form XLA dumps: each op's category follows from its
# opcode, its fusion's body and its op_name metadata.
_HLO = """HloModule jit_train_step, entry_computation_layout={(f32[4,4]{1,0})->f32[4,4]{1,0}}

%fused_computation (param_0: f32[4,4]) -> f32[4,4] {
  %param_0 = f32[4,4]{1,0} parameter(0)
  ROOT %erf.1 = f32[4,4]{1,0} erf(f32[4,4]{1,0} %param_0), metadata={op_name="jit(train_step)/jvp(electra)/layer_0/erf"}
}

%add_f32 (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %add.9 = f32[] add(f32[] %a, f32[] %b)
}

ENTRY %main.1 (Arg_0.1: f32[4,4], idx: s32[4,1]) -> (f32[4,4], f32[4,4]) {
  %Arg_0.1 = f32[4,4]{1,0} parameter(0)
  %idx = s32[4,1]{1,0} parameter(1)
  %dot.1 = f32[4,4]{1,0} dot(f32[4,4]{1,0} %Arg_0.1, f32[4,4]{1,0} %Arg_0.1), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_name="jit(train_step)/jvp(electra)/layer_0/dot_general"}
  %dot.2 = f32[4,4]{1,0} dot(f32[4,4]{1,0} %Arg_0.1, f32[4,4]{1,0} %Arg_0.1), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_name="jit(train_step)/jvp(electra)/layer_0/attention/dot_general"}
  %dot.3 = f32[4,4]{1,0} dot(f32[4,4]{1,0} %Arg_0.1, f32[4,4]{1,0} %Arg_0.1), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_name="jit(train_step)/transpose(jvp(generator_predictions))/dot_general"}
  %erf_fusion = f32[4,4]{1,0} fusion(f32[4,4]{1,0} %dot.1), kind=kLoop, calls=%fused_computation
  %scatter.1 = f32[4,4]{1,0} scatter(f32[4,4]{1,0} %Arg_0.1, s32[4,1]{1,0} %idx, f32[4,4]{1,0} %dot.1), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=%add_f32, metadata={op_name="jit(train_step)/transpose(jvp(generator))/embeddings/word_embeddings"}
  %multiply.5 = f32[4,4]{1,0} multiply(f32[4,4]{1,0} %dot.1, f32[4,4]{1,0} %dot.2), metadata={op_name="jit(train_step)/adamw/mul"}
  %reduce.2 = f32[4]{0} reduce(f32[4,4]{1,0} %dot.3, f32[] %c), dimensions={1}, to_apply=%add_f32, metadata={op_name="jit(train_step)/jvp(fake_data)/reduce"}
  %copy.7 = f32[4,4]{0,1} copy(f32[4,4]{1,0} %dot.1)
  %custom-call.4 = (f32[4,4]{1,0}, u8[0]{0}) custom-call(f32[4,4]{1,0} %Arg_0.1), custom_call_target="__cudnn$fmhaSoftmax"
  ROOT %tuple = (f32[4,4]{1,0}, f32[4,4]{1,0}) tuple(f32[4,4]{1,0} %dot.1, f32[4,4]{1,0} %erf_fusion)
}
"""

EXPECTED = {"dot.1": "matmul", "dot.2": "attention", "dot.3": "vocab_matmul",
            "erf_fusion": "layernorm_gelu", "scatter.1": "embedding_grad",
            "multiply.5": "optimizer", "reduce.2": "gumbel_sampling", "copy.7": "layout",
            "custom-call.4": "attention", "no_such_op": "other"}


def test_categories_of_a_written_module():
    ops = profile_step.parse_hlo(_HLO)
    assert ops["custom-call.4"]["opcode"] == "custom-call"  # a tuple-shaped result
    assert ops["erf_fusion"]["calls"] == ["fused_computation"]
    assert {name: profile_step.categorize(ops, name) for name in EXPECTED} == EXPECTED
    assert profile_step.op_name(ops, "erf_fusion") == "jit(train_step)/jvp(electra)/layer_0/erf"


def _write_capture(root, events):
    os.makedirs(root / "hlo")
    (root / "hlo" / "module_0007.jit_train_step.cpu_after_optimizations.txt").write_text(_HLO)
    run = root / "trace" / "plugins" / "profile" / "run1"
    os.makedirs(run)
    trace = {"traceEvents": [{"ph": "M", "pid": 1, "name": "process_name"}] + [
        {"ph": "X", "pid": 1, "tid": 2, "ts": ts, "dur": dur, "name": name,
         "args": {"hlo_module": module, "hlo_op": op}} for module, op, ts, dur, name in events]}
    with gzip.open(run / "perfetto_trace.json.gz", "wt") as f:
        json.dump(trace, f)


def test_breakdown_of_a_written_trace(tmp_path):
    # Two steps: a matmul (10 us) then its GELU fusion (5 us), 85 us apart; a helper module's op;
    # the CPU tracer's "end:" markers are not ops.
    _write_capture(tmp_path, [
        ("jit_train_step", "dot.1", 0.0, 10.0, "dot.1"),
        ("jit_train_step", "dot.1", 10.0, 0.0, "end: dot.1"),
        ("jit_train_step", "erf_fusion", 10.0, 5.0, "erf_fusion"),
        ("jit_train_step", "dot.1", 100.0, 10.0, "dot.1"),
        ("jit_train_step", "erf_fusion", 110.0, 5.0, "erf_fusion"),
        ("jit_equal", "compare.1", 112.0, 3.0, "compare.1"),
    ])
    result = profile_step.breakdown(str(tmp_path), steps=2)
    assert result["categories"]["matmul"] == {"ms_per_step": 0.01, "share_of_op_time": 20 / 33,
                                              "ops": 1}
    assert result["categories"]["layernorm_gelu"]["ms_per_step"] == 0.005
    assert result["categories"]["module:jit_equal"]["ops"] == 0  # one op in two steps
    assert result["window_ms_per_step"] == pytest.approx(115 / 2 / 1e3)
    assert result["busy_ms_per_step"] == pytest.approx(30 / 2 / 1e3)  # 112-115 overlaps 110-115
    assert result["host_gap_ms_per_step"] == pytest.approx(85 / 2 / 1e3)
    assert result["unknown_op_count"] == 0
    assert result["custom_call_targets"] == ["__cudnn$fmhaSoftmax"]
    assert result["scopes"]["forward electra/layer_N"] == pytest.approx(0.015)
    table = profile_step.markdown(result).splitlines()
    assert table[2].startswith("| matmul | 0.010 | 60.6% | 1 |")
    assert "| host_gap (no op running) | 0.043 | 73.9% of the window |" in table[-2]


@pytest.mark.slow  # a JAX child compiles the tiny model's step: ~1-2 min on a loaded 2-core CPU
def test_capture_of_the_tiny_model_on_cpu(tmp_path):
    out = tmp_path / "prof"
    proc = subprocess.run(
        [sys.executable, os.path.join(fx.REPO_ROOT, "benchmarks", "profile_step.py"), "--tiny",
         "--dtype", "float32", "--batch", "4", "--steps", "2", "--device", "cpu",
         "--out-dir", str(out)], capture_output=True, text=True, timeout=900,
        env=fx.subprocess_env())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((out / "breakdown.json").read_text())
    assert result["unknown_op_count"] == 0  # every op of the trace is found in the dumped HLO
    for category in ("matmul", "vocab_matmul", "attention", "layernorm_gelu", "gumbel_sampling",
                     "embedding_grad", "optimizer", "masking"):
        assert result["categories"][category]["ms_per_step"] > 0, category
    assert result["window_ms_per_step"] >= result["busy_ms_per_step"] > 0
    assert result["host_gap_ms_per_step"] >= 0
    assert result["capture"]["platform"] == "cpu" and result["steps"] == 2
    # Only the train step's optimized HLO is kept of XLA's dump.
    assert os.listdir(out / "hlo") and all(
        n.endswith("after_optimizations.txt") and "train" in n for n in os.listdir(out / "hlo"))
    assert not (out / "xla_dump").exists()
    assert "| matmul |" in proc.stdout


@pytest.mark.slow  # six CPU JAX children (two profiles, a fit row pair, two trainer rows, ...)
def test_gpu_session_dry_run_on_cpu(tmp_path):
    proc = subprocess.run(["bash", os.path.join(fx.REPO_ROOT, "benchmarks", "gpu_session.sh"),
                           "--dry-run"], capture_output=True, text=True, timeout=3600,
                          env=fx.subprocess_env(OUT=str(tmp_path)))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with tarfile.open(tmp_path / "gpu_session.tar.gz") as tar:
        names = set(tar.getnames())
        log = tar.extractfile("gpu_session/session.log").read().decode()
        options = json.load(tar.extractfile("gpu_session/base_options.json"))
        trainer_options = json.load(tar.extractfile("gpu_session/trainer_small_options.json"))
    phases = ("profile_small", "profile_base", "base_options", "trainer_small_128",
              "trainer_small_512", "trainer_small_options", "profile_base_options")
    for phase in phases:
        assert f"{phase}: exit 0" in log, log
    for profile in ("profile_small", "profile_base", "profile_base_options"):
        assert f"gpu_session/{profile}/breakdown.json" in names
    for rows in ("trainer_small_128", "trainer_small_512"):
        assert f"gpu_session/{rows}.json" in names
    assert [r.get("model_variant") for r in options["results"]] == [
        "noattndrop", "noattndrop+fused+pad128"]
    assert all("sequences_per_second" in r for r in options["results"])
    # The trainer rows with the speed options as hparams (vocab_padding_multiple,
    # fused_attention), a row each.
    assert [(r["implementation"], r.get("model_variant")) for r in trainer_options["results"]] \
        == [("electra_tf_jax_trainer", "noattndrop"),
            ("electra_tf_jax_trainer", "noattndrop+fused+pad128")]
    assert all("sequences_per_second" in r for r in trainer_options["results"])
    assert "gpu_session/info.txt" in names
    assert os.path.exists(tmp_path / "gpu_session_traces.tar.gz")
