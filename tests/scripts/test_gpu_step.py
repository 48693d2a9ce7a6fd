"""benchmarks/gpu_step.py: its FLOPs count, its table, and its --smoke run on CPU JAX and CPU
PyTorch with TensorFlow unimportable (as on the GPU machine)."""

import json
import os
import subprocess
import sys

import pytest

from benchmarks import gpu_step, pretrain_step
from tests import backends
from tests import pretraining_fixtures as fx


def test_model_flops_counts_small_as_pretrain_step_and_base_by_hand():
    small = gpu_step.pretraining_config("small", "float32", 32, smoke=False)
    assert gpu_step.model_flops(small, 32) == pretrain_step.step_flops(32)
    base = gpu_step.pretraining_config("base", "bfloat16", 128, smoke=False)
    # Base: discriminator 768 x 12 (FFN 3072, embeddings 768), generator 256 x 12 (FFN 1024, a
    # 768 -> 256 projection), 19 masked slots, vocab 30522; MACs per token, then 6 per MAC.
    discriminator = 12 * (4 * 768 ** 2 + 2 * 768 * 3072) + 12 * 2 * 128 * 768
    generator = 12 * (4 * 256 ** 2 + 2 * 256 * 1024) + 768 * 256 + 12 * 2 * 128 * 256
    rtd_head = 768 ** 2 + 768
    mlm_head = 256 * 768 + 768 * 30522
    expected = 6 * 128 * 128 * (discriminator + generator + rtd_head) + 6 * 128 * 19 * mlm_head
    assert gpu_step.model_flops(base, 128) == expected  # ~10.0 TFLOP a step


def _row(impl, size, dtype, seq_per_s, **extra):
    return dict({"implementation": impl, "size": size, "dtype": dtype,
                 "sequences_per_second": seq_per_s, "step_seconds": 128 / seq_per_s,
                 "mfu": 0.5, "peak_memory_gib": 3.0, "peak_memory_kind": "device",
                 "first_call_seconds": 20.0}, **extra)


def test_table_ratios_and_targets():
    rows = [_row("electra_tf_jax", "base", "bfloat16", 2700.0),
            _row("torch", "base", "bfloat16", 2000.0),
            _row("torch_compile", "base", "bfloat16", 2800.0),
            {"implementation": "torch_compile", "size": "base", "dtype": "float32",
             "skipped": "over the --budget of 450 s (460 s spent)"},
            {"implementation": "torch", "size": "small", "dtype": "float32",
             "error": "exit 1: Traceback\nRuntimeError: CUDA out of memory"}]
    gpu_step.add_ratios(rows)
    assert rows[0]["vs_torch"] == pytest.approx(1.35)
    assert rows[0]["vs_torch_compile"] == pytest.approx(2700 / 2800)
    assert rows[1]["vs_torch"] == 1.0
    table = gpu_step.markdown_table(rows).splitlines()
    assert len(table) == 2 + len(rows)
    assert all(line.count("|") == table[0].count("|") for line in table)
    assert table[2] == ("| electra-tf (JAX, fit) | base | bfloat16 | 2700.0 | 47.4 | 50.0 | 3.00 "
                        "| 1.35 | 0.96 | 20.0 |")
    assert "skipped: over the --budget" in table[5]
    assert "ERROR: RuntimeError: CUDA out of memory" in table[6]
    targets = gpu_step.target_lines(rows, smoke=False)
    assert [t.rsplit("(", 1)[1] for t in targets] == ["met)", "not met)", "met)"]


def test_torch_peer_has_electra_tf_sizes():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from benchmarks.torch_electra import TorchElectra
    from electra_tf.config.model_config import get_bert_config, get_generator_config

    config = gpu_step.pretraining_config("small", "float32", 4, smoke=True)
    peer = TorchElectra.from_pretraining_config(config, gpu_step.SPECIAL, seed=3)
    disc = get_bert_config(config)
    for model, sizes in ((peer.discriminator, disc), (peer.generator,
                                                      get_generator_config(config, disc))):
        for key in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                    "intermediate_size", "embedding_size", "vocab_size"):
            assert getattr(model.config, key) == getattr(sizes, key), key
    assert peer.max_predictions == config.max_predictions_per_seq == 19
    assert peer.optimizer.defaults["lr"] == config.learning_rate


@pytest.mark.slow
def test_smoke_runs_without_tensorflow(tmp_path):
    backends.require("jax")
    backends.require("torch")
    pytest.importorskip("transformers")
    out = tmp_path / "gpu_step.json"
    proc = subprocess.run([sys.executable, os.path.join(fx.REPO_ROOT, "benchmarks", "gpu_step.py"),
                           "--smoke", "--out", str(out)],
                          capture_output=True, text=True, timeout=300,
                          env=fx.subprocess_env(), cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    rows = {r["implementation"]: r for r in report["results"]}
    assert set(rows) == {"electra_tf_jax", "torch"}
    for row in rows.values():
        assert "error" not in row, row.get("error")
        assert row["sequences_per_second"] > 0 and row["step_seconds"] > 0
        assert row["mfu"] is None or row["mfu"] > 0
        assert row["peak_memory_gib"] > 0 and row["peak_memory_kind"] == "host RSS"
        assert row["device"] == "cpu"
        assert row["tensorflow_loaded"] is False  # the children block it (tensorflow absent)
    assert rows["electra_tf_jax"]["vs_torch"] > 0
    assert report["matmul_peak"]["tflops"]["float32"] > 0
    assert report["table"] in proc.stdout


@pytest.mark.slow
def test_tiny_trainer_rows_one_per_steps_per_execution(tmp_path):
    """--tiny: the trainer of run_pretraining.py --backend jax on shards the benchmark writes,
    one trainer per --steps-per-execution value in one child, one row each (issue 45)."""
    backends.require("jax")
    out = tmp_path / "trainer.json"
    proc = subprocess.run([sys.executable, os.path.join(fx.REPO_ROOT, "benchmarks", "gpu_step.py"),
                           "--tiny", "--impl", "electra_tf_jax_trainer",
                           "--steps-per-execution", "1,2", "--no-peak", "--steps", "3",
                           "--windows", "1", "--out", str(out)],
                          capture_output=True, text=True, timeout=300,
                          env=fx.subprocess_env(), cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    rows = report["results"]
    assert [(r["implementation"], r["steps_per_execution"]) for r in rows] == [
        ("electra_tf_jax_trainer", 1), ("electra_tf_jax_trainer", 2)]
    for row in rows:
        assert "error" not in row, row.get("error")
        assert row["steps"] == 4 and len(row["window_seconds"]) == 1  # a multiple of 2 steps
        assert row["sequences_per_second"] > 0 and row["tensorflow_loaded"] is False
    assert report["tiny"] and report["seq_length"] == gpu_step.TINY_SHAPE["max_seq_length"]
    assert "| electra-tf (JAX, run_pretraining), 2 step(s)/call | small | float32 |" in proc.stdout



@pytest.mark.slow
def test_tiny_trainer_rows_with_the_speed_options_as_hparams(tmp_path):
    """--model-variants on the trainer rows: the options reach run_pretraining.py's trainer as
    the hparams vocab_padding_multiple and fused_attention (issue 45), a row per variant."""
    backends.require("jax")
    out = tmp_path / "trainer.json"
    proc = subprocess.run([sys.executable, os.path.join(fx.REPO_ROOT, "benchmarks", "gpu_step.py"),
                           "--tiny", "--impl", "electra_tf_jax_trainer", "--no-peak",
                           "--model-variants", "default,noattndrop+fused+pad128",
                           "--steps-per-execution", "2", "--steps", "2", "--windows", "1",
                           "--warmup", "0", "--min-window", "0", "--out", str(out)],
                          capture_output=True, text=True, timeout=300,
                          env=fx.subprocess_env(), cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads(out.read_text())["results"]
    assert [(r["model_variant"], r["steps_per_execution"]) for r in rows] == [
        ("default", 2), ("noattndrop+fused+pad128", 2)]
    for row in rows:
        assert "error" not in row, row.get("error")
        assert row["sequences_per_second"] > 0 and row["tensorflow_loaded"] is False
