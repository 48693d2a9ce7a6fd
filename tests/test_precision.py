"""`mixed_precision: "auto"`: the decision table with injected device facts, the one-time
warning, reading /proc/cpuinfo, and auto end to end (config.json, TensorBoard text, model card,
same losses and weights as the policy it resolved to)."""

import json
import logging
import os

import numpy as np
import pytest

from electra_tf import precision
from electra_tf.config import PretrainingConfig
from electra_tf.config.hparams import ConfigError
from electra_tf.precision import DeviceFacts, resolve
from tests import pretraining_fixtures as fx

ZEN3 = DeviceFacts("cpu", "AMD EPYC", frozenset({"avx", "avx2", "fma", "sse4_2"}))
ZEN4 = DeviceFacts("cpu", "AMD EPYC 9R14", frozenset({"avx2", "avx512f", "avx512_bf16"}))
XEON = DeviceFacts("cpu", "Intel Xeon Platinum 8488C",
                   frozenset({"avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}))
NO_FLAGS = DeviceFacts("cpu", "arm64")
H100 = DeviceFacts("gpu", "NVIDIA H100", compute_capability=(9, 0))
A100 = DeviceFacts("gpu", "NVIDIA A100", compute_capability=(8, 0))
V100 = DeviceFacts("gpu", "Tesla V100", compute_capability=(7, 0))
T4 = DeviceFacts("gpu", "Tesla T4", compute_capability=(7, 5))
TPU = DeviceFacts("tpu", "")
# The same CPUs under JAX: XLA:CPU multiplies bf16 with no native kernels, whatever the flags.
ZEN4_JAX = DeviceFacts("cpu", "AMD EPYC 9R14", ZEN4.cpu_flags, backend="jax")
XEON_JAX = DeviceFacts("cpu", "Intel Xeon Platinum 8488C", XEON.cpu_flags, backend="jax")
XEON_TORCH = DeviceFacts("cpu", "Intel Xeon Platinum 8488C", XEON.cpu_flags, backend="torch")


# ------------------------------------------------------------------------------------------------
# The decision table
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("facts,policy,clue", [
    (XEON, "mixed_bfloat16", "AMX_BF16"),
    (ZEN4, "mixed_bfloat16", "AVX512_BF16"),
    (ZEN3, "float32", "no AVX512_BF16 or AMX"),
    (ZEN4_JAX, "float32", "XLA:CPU"),
    (XEON_JAX, "float32", "no native bf16 matmul kernels"),
    (XEON_TORCH, "mixed_bfloat16", "AMX_BF16"),
    (NO_FLAGS, "float32", "CPU flags unreadable"),
    (H100, "mixed_bfloat16", "compute capability 9.0"),
    (A100, "mixed_bfloat16", "compute capability 8.0"),
    (V100, "mixed_float16", "dynamic loss scaling"),
    (T4, "mixed_float16", "compute capability 7.5"),
    (TPU, "mixed_bfloat16", "TPU"),
])
def test_auto_decision_table(facts, policy, clue):
    choice = resolve("auto", facts)
    assert (choice.requested, choice.policy, choice.slow) == ("auto", policy, None)
    assert choice.reason.startswith("auto: ") and clue in choice.reason
    assert choice.line() == f"precision: {policy} ({choice.reason})"


def test_auto_without_loss_scaling_never_picks_float16():
    """Fine-tuning has no loss scaling: an old GPU gets float32, bf16 stays where native."""
    allowed = ("float32", "mixed_bfloat16")
    assert resolve("auto", V100, allowed).policy == "float32"
    assert "loss scaling" in resolve("auto", V100, allowed).reason
    assert resolve("auto", H100, allowed).policy == "mixed_bfloat16"
    assert resolve("auto", ZEN3, allowed).policy == "float32"
    with pytest.raises(ValueError, match="mixed_float16"):
        resolve("mixed_float16", H100, allowed)


@pytest.mark.parametrize("requested", ["float32", "mixed_bfloat16", "mixed_float16"])
def test_explicit_policy_is_honoured_everywhere(requested):
    for facts in (XEON, ZEN4, ZEN3, NO_FLAGS, H100, V100, TPU):
        choice = resolve(requested, facts)
        assert (choice.policy, choice.reason) == (requested, "set explicitly")


@pytest.mark.parametrize("requested,facts,slow", [
    ("mixed_bfloat16", ZEN3, "AMD EPYC has no AVX512_BF16 or AMX"),
    ("mixed_bfloat16", NO_FLAGS, "CPU flags unreadable"),
    ("mixed_bfloat16", ZEN4_JAX, "no faster than float32"),
    ("mixed_bfloat16", V100, "lacks native bf16"),
    ("mixed_float16", ZEN3, "no fast float16"),
    ("mixed_float16", XEON, "no fast float16"),
    ("mixed_bfloat16", XEON, None), ("mixed_bfloat16", ZEN4, None), ("mixed_bfloat16", H100, None),
    ("mixed_bfloat16", TPU, None), ("mixed_float16", V100, None), ("float32", ZEN3, None),
])
def test_slow_explicit_policies_are_named(requested, facts, slow):
    choice = resolve(requested, facts)
    if slow is None:
        assert choice.slow is None
    else:
        assert slow in choice.slow


def test_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="mixed_precision must be one of auto, float32"):
        resolve("bf16", ZEN3)
    with pytest.raises(ValueError):
        DeviceFacts("npu", "x")
    with pytest.raises(ValueError, match="backend must be one of tensorflow, jax, torch"):
        DeviceFacts("cpu", "x", backend="numpy")


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_keras_backend_facts_name_the_backend(backend, tmp_path):
    """On this CPU-only machine: the facts of JAX's or PyTorch's device are the CPU's (its flags
    from the cpuinfo given) and record the backend, which decides bf16 on a CPU."""
    pytest.importorskip(backend)
    path = tmp_path / "cpuinfo"
    path.write_text(CPUINFO)
    facts = precision.detect_keras_backend(backend, cpu_info=str(path))
    assert (facts.kind, facts.backend) == ("cpu", backend)
    assert "avx512_bf16" in facts.cpu_flags
    assert resolve("auto", facts).policy == ("float32" if backend == "jax" else "mixed_bfloat16")


def test_emulated_bf16_warns_once_naming_the_device_and_slowdown(monkeypatch, caplog):
    monkeypatch.setattr(precision, "_warned", set())
    choice = resolve("mixed_bfloat16", ZEN3)
    with caplog.at_level(logging.WARNING, logger="electra_tf"):
        assert precision.warn_if_slow(choice) is True
        assert precision.warn_if_slow(choice) is False
        assert precision.warn_if_slow(resolve("mixed_bfloat16", ZEN3)) is False
        assert precision.warn_if_slow(resolve("mixed_bfloat16", XEON)) is False
        assert precision.warn_if_slow(resolve("auto", ZEN3)) is False
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "mixed_bfloat16" in warnings[0] and "CPU AMD EPYC" in warnings[0]
    assert "7x slower than float32" in warnings[0] and '"auto"' in warnings[0]


def test_choose_logs_the_line_and_warns_once(monkeypatch, caplog):
    monkeypatch.setattr(precision, "_warned", set())
    monkeypatch.setattr(precision, "detect", lambda strategy=None: ZEN3)
    with caplog.at_level(logging.INFO, logger="electra_tf"):
        for _ in range(3):
            assert precision.choose("mixed_bfloat16").policy == "mixed_bfloat16"
        assert precision.choose("auto").policy == "float32"
    messages = [r.getMessage() for r in caplog.records]
    assert messages.count("precision: mixed_bfloat16 (set explicitly)") == 3
    assert sum("runs, but slowly" in m for m in messages) == 1
    assert any(m.startswith("precision: float32 (auto: CPU AMD EPYC has no") for m in messages)


# ------------------------------------------------------------------------------------------------
# Reading the device
# ------------------------------------------------------------------------------------------------
CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9R14 96-Core Processor
flags\t\t: fpu avx2 avx512f avx512_bf16 fma

processor\t: 1
model name\t: something else
flags\t\t: fpu
"""


def test_read_cpu_takes_the_first_processor(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text(CPUINFO)
    name, flags = precision.read_cpu(str(path))
    assert name == "AMD EPYC 9R14 96-Core Processor"
    assert flags == {"fpu", "avx2", "avx512f", "avx512_bf16", "fma"}
    facts = precision.DeviceFacts("cpu", name, flags)
    assert resolve("auto", facts).policy == "mixed_bfloat16"


def test_read_cpu_without_cpuinfo_means_no_native_bf16(tmp_path):
    name, flags = precision.read_cpu(str(tmp_path / "missing"))
    assert flags is None and name
    assert resolve("auto", DeviceFacts("cpu", name, flags)).policy == "float32"


def test_detect_reads_this_machine(monkeypatch):
    """The real detection (conftest's stand-in undone): a CPU-only machine, its flags."""
    monkeypatch.undo()
    facts = precision.detect()
    assert facts.kind == "cpu"
    if os.path.exists(precision.CPU_INFO):
        with open(precision.CPU_INFO, encoding="utf-8") as f:
            line = next(line for line in f if line.startswith("flags"))
        assert facts.cpu_flags == frozenset(line.split(":", 1)[1].split())


# ------------------------------------------------------------------------------------------------
# Config
# ------------------------------------------------------------------------------------------------
def test_auto_is_the_default_and_recorded_fields_are_not_hparams():
    config = PretrainingConfig.create("m", "/data")
    assert config.mixed_precision == "auto" and config.resolved_mixed_precision is None
    with pytest.raises(ConfigError, match="recorded by the run"):
        PretrainingConfig.create("m", "/data", {"resolved_mixed_precision": "float32"})
    with pytest.raises(ConfigError, match="mixed_precision must be one of auto, float32"):
        PretrainingConfig.create("m", "/data", {"mixed_precision": "bf16"})
    recorded = dict(config.to_dict(), resolved_mixed_precision="mixed_bfloat16",
                    resolved_mixed_precision_reason="auto: TPU")
    again = PretrainingConfig.from_dict(json.loads(json.dumps(recorded)))
    assert again.resolved_mixed_precision == "mixed_bfloat16"
    with pytest.raises(ConfigError, match="resolved_mixed_precision must be one of"):
        PretrainingConfig.from_dict(dict(recorded, resolved_mixed_precision="auto"))


def test_help_lists_auto_not_the_recorded_fields(capsys):
    from electra_tf.commands import pretrain

    with pytest.raises(SystemExit):
        pretrain.main(["--help"])
    out = capsys.readouterr().out
    assert "mixed_precision" in out and "resolved_mixed_precision" not in out
    assert "auto" in out and "AVX512_BF16" in out


# ------------------------------------------------------------------------------------------------
# End to end: the Trainer
# ------------------------------------------------------------------------------------------------
STEPS = dict(num_train_steps=3, iterations_per_loop=3, save_checkpoints_steps=3,
             model_hparam_overrides={"num_hidden_layers": 1}, do_export=True)


def _train(data_dir, name, facts, monkeypatch, **hparams):
    from electra_tf.training.tf import trainer as trainer_lib

    monkeypatch.setattr(precision, "detect", lambda strategy=None: facts)
    config = fx.tiny_config(data_dir, name, **dict(STEPS, **hparams))
    with trainer_lib.Trainer(config) as trainer:
        scalars = trainer.train()
        weights = [v.numpy().copy() for v in trainer.model.trainable_variables]
        policy = trainer.model.discriminator.dtype_policy.name
    return scalars, weights, policy, config


@pytest.mark.usefixtures("float32_policy")
@pytest.mark.parametrize("facts,resolved", [(ZEN3, "float32"), (XEON, "mixed_bfloat16")])
def test_auto_trains_exactly_as_the_policy_it_resolved_to(data_dir, monkeypatch, facts, resolved):
    auto, auto_weights, auto_policy, config = _train(
        data_dir, f"auto_{resolved}", facts, monkeypatch, mixed_precision="auto")
    same, same_weights, same_policy, _ = _train(
        data_dir, f"explicit_{resolved}", facts, monkeypatch, mixed_precision=resolved)
    assert auto_policy == same_policy == resolved
    for key in ("total_loss", "masked_lm_loss", "disc_loss", "grad_norm"):
        assert auto[key] == same[key], key
    for a, b in zip(auto_weights, same_weights):
        np.testing.assert_array_equal(a, b)

    with open(os.path.join(config.model_dir, "config.json"), encoding="utf-8") as f:
        saved = json.load(f)
    assert saved["mixed_precision"] == "auto"
    assert saved["resolved_mixed_precision"] == resolved
    assert saved["resolved_mixed_precision_reason"] == resolve("auto", facts).reason
    assert PretrainingConfig.load(os.path.join(config.model_dir, "config.json")) \
        .resolved_mixed_precision == resolved
    _assert_tensorboard_text_records(config.model_dir, resolved)
    if resolved == "mixed_bfloat16":
        _assert_model_card_records(config, resolved)


def _assert_tensorboard_text_records(model_dir, resolved):
    import tensorflow as tf

    texts = []
    for root, _, files in os.walk(model_dir):
        for name in files:
            if name.startswith("events.out.tfevents"):
                for event in tf.compat.v1.train.summary_iterator(os.path.join(root, name)):
                    for value in event.summary.value:
                        if value.tag.startswith("config"):
                            texts.append(tf.make_ndarray(value.tensor).item().decode())
    assert any(f'"resolved_mixed_precision": "{resolved}"' in t for t in texts), texts


def _assert_model_card_records(config, resolved):
    from electra_tf.convert import model_card

    loaded = type("Loaded", (), {"config": PretrainingConfig.load(
        os.path.join(config.model_dir, "config.json")), "step": 3,
        "vocab": type("Vocab", (), {"kind": "wordpiece"})})
    card = model_card.model_card(
        "discriminator", "ElectraForPreTraining", {"num_hidden_layers": 1, "hidden_size": 64,
                                                   "num_attention_heads": 1,
                                                   "intermediate_size": 256, "embedding_size": 32,
                                                   "vocab_size": fx.VOCAB_SIZE,
                                                   "max_position_embeddings": 512},
        loaded, config.model_dir, 1000, True)
    assert f"| mixed_precision | auto: {resolved} (auto: CPU Intel Xeon" in card


def test_resuming_in_another_precision_warns(data_dir, monkeypatch, caplog):
    from electra_tf.training.tf import trainer as trainer_lib

    _train(data_dir, "moved", XEON, monkeypatch, mixed_precision="auto")
    monkeypatch.setattr(precision, "detect", lambda strategy=None: ZEN3)
    config = fx.tiny_config(data_dir, "moved", **dict(STEPS, num_train_steps=4,
                                                     mixed_precision="auto"))
    with caplog.at_level(logging.WARNING, logger="electra_tf"):
        with trainer_lib.Trainer(config) as trainer:
            assert trainer.step == 3
            assert trainer.model.discriminator.dtype_policy.name == "float32"
    assert any("trained in mixed_bfloat16 until now; it continues in float32" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
    import keras

    keras.mixed_precision.set_global_policy("float32")


@pytest.mark.slow
def test_the_tool_prints_and_records_what_auto_picks_on_this_machine(data_dir):
    """run_pretraining.py with no precision set: one start line saying what "auto" picked on
    this machine's CPU and why, and config.json recording it (in a real process: conftest's
    in-process stand-in does not reach it)."""
    import subprocess
    import sys

    hparams = fx.tiny_hparams(num_train_steps=1, iterations_per_loop=1, save_checkpoints_steps=1)
    del hparams["mixed_precision"]
    proc = subprocess.run(fx.run_pretraining_command(data_dir, "auto_cli", hparams),
                          env=fx.subprocess_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    name, flags = precision.read_cpu()
    expected = resolve("auto", DeviceFacts("cpu", name, flags))
    lines = [line for line in (proc.stdout + proc.stderr).splitlines()
             if "precision: " in line]
    assert len(lines) == 1 and lines[0].endswith(expected.line()), lines
    with open(os.path.join(data_dir, "models", "auto_cli", "config.json"), encoding="utf-8") as f:
        saved = json.load(f)
    assert (saved["mixed_precision"], saved["resolved_mixed_precision"],
            saved["resolved_mixed_precision_reason"]) == ("auto", expected.policy, expected.reason)


def test_recorded_cpu_flags_are_the_avx512_and_amx_ones_sorted():
    """The CPU record of every benchmark figure (`grep -o 'avx512...\\|amx...' | sort -u`)."""
    flags = frozenset({"fpu", "avx2", "fma", "avx512vl", "avx512f", "amx_tile", "avx512_bf16"})
    assert precision.recorded_cpu_flags(flags) == ["amx_tile", "avx512_bf16", "avx512f",
                                                   "avx512vl"]
    assert precision.recorded_cpu_flags(None) == []
    assert precision.recorded_cpu_flags({"avx2", "fma"}) == []
