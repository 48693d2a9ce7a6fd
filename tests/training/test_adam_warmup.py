"""training/adam_warmup.py: the official Adam's effective peak rate under a schedule, and the
one warning a short warmup gets (in both trainers, once per run)."""

import logging
import math

import pytest

from electra_tf.config import PretrainingConfig
from electra_tf.training import adam_warmup


def _uncorrected(t, beta_1=0.9, beta_2=0.999):
    return (1 - beta_1 ** t) / math.sqrt(1 - beta_2 ** t)


def test_the_factor_is_the_uncorrected_over_the_corrected_update():
    # Without warmup or decay the schedule is 1: the factor is Adam's own, largest near step 10.
    found = adam_warmup.amplification(num_train_steps=10 ** 9, num_warmup_steps=0,
                                      lr_decay_power=0.0)
    assert found.step == max(range(1, 200), key=_uncorrected)
    assert found.factor == pytest.approx(_uncorrected(found.step))
    assert 6.0 < found.factor < 7.0


def test_official_recipe_is_not_amplified_and_the_collapsed_gpu_run_was():
    official = adam_warmup.amplification(1_000_000, 10_000)
    assert official.factor <= 1.0 and official.step == 10_001  # the peak of the schedule
    # Issue 44's GPU run: batch 512, 2176 steps, 218 warmup: 2.0x at the end of warmup.
    gpu = adam_warmup.amplification(2176, 218)
    assert gpu.step == 219
    assert gpu.factor == pytest.approx((1 - 218 / 2176) * _uncorrected(219))
    assert 2.0 < gpu.factor < 2.1


def _config(**hparams):
    return PretrainingConfig.create("unit", "/nonexistent-data-dir", hparams)


def test_warning_names_the_numbers_and_both_fixes():
    warning = adam_warmup.short_warmup_warning(
        _config(num_train_steps=2176, num_warmup_steps=218, learning_rate=1e-3))
    assert warning.startswith("num_warmup_steps=218 is short for the official Adam")
    assert "at step 219 at 2.0x learning_rate=0.001 (an effective 0.002" in warning
    # The warmup that brings a long run to the threshold: 1 / sqrt(1 - 0.999^W) = 1.5.
    safe = math.ceil(math.log(1 - 1 / 1.5 ** 2) / math.log(0.999))
    assert f"num_warmup_steps >= {safe}" in warning and 580 < safe < 600
    assert '"adam_bias_correction": true' in warning
    assert adam_warmup.amplification(10 ** 6, safe).factor <= adam_warmup.WARN_ABOVE


@pytest.mark.parametrize("hparams", [
    {},  # the official recipe
    {"num_train_steps": 2176, "num_warmup_steps": 218, "adam_bias_correction": True},
    {"num_train_steps": 2176, "num_warmup_steps": 218, "optimizer": "lamb"},
    {"num_train_steps": 100_000, "num_warmup_steps": 1000},
])
def test_no_warning_where_the_updates_follow_the_schedule(hparams):
    assert adam_warmup.short_warmup_warning(_config(**hparams)) is None


def test_the_trainers_warn_once_per_run(tmp_path, caplog):
    from electra_tf.training.tf.trainer import Trainer
    from tests.pretraining_fixtures import tiny_config, write_dataset

    write_dataset(str(tmp_path))
    config = tiny_config(str(tmp_path), num_train_steps=4, num_warmup_steps=1,
                         iterations_per_loop=2, save_checkpoints_steps=4)
    with caplog.at_level(logging.WARNING, logger="electra_tf"), Trainer(config) as trainer:
        trainer.train(stop_at_step=2)
        trainer.train()
    warnings = [r.getMessage() for r in caplog.records if "short for the official Adam" in
                r.getMessage()]
    assert len(warnings) == 1, warnings
