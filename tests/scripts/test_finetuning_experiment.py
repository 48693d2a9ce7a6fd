"""The experiment script's compute accounting (experiments/electra_vs_mlm.py)."""

import os
import sys

import pytest

from electra_tf.config import PretrainingConfig
from electra_tf.config.model_config import get_bert_config, get_generator_config
from tests import pretraining_fixtures as fx

sys.path.insert(0, os.path.join(fx.REPO_ROOT, "experiments"))
import electra_vs_mlm as experiment  # noqa: E402


def test_electra_small_step_flops_match_the_measured_environment_figure():
    # docs: "One step is about 288 GFLOP" for ELECTRA-small, batch 32, seq 128, generator 1/4,
    # MLM head on 20 masked positions (environment.md), counted independently there.
    config = PretrainingConfig.create("x", "unused", {})
    disc = get_bert_config(config)
    gen = get_generator_config(config, disc)
    flops = 32 * experiment.flops_per_sequence("electra", disc, gen, 128, 20, 30522)
    assert flops / 1e9 == pytest.approx(288.24, abs=0.01)
    mlm = experiment.flops_per_sequence("mlm", disc, None, 128, 20, 30522)
    # MLM-only: one full-size encoder with the vocab head, no discriminator head.
    assert mlm == pytest.approx(3 * (experiment.encoder_forward_flops(disc, 128)
                                     + experiment.mlm_head_forward_flops(256, 128, 30522, 20)))
    frozen = experiment.flops_per_sequence("two_stage_2", disc, disc, 128, 20, 30522)
    trained = experiment.flops_per_sequence("electra", disc, disc, 128, 20, 30522)
    head = experiment.encoder_forward_flops(disc, 128) + experiment.mlm_head_forward_flops(256, 128, 30522, 20)
    assert trained - frozen == pytest.approx(2 * head)  # a frozen generator skips its backward pass


def test_fast_electra_step_flops_count_the_frozen_generator_forward_only():
    # ELECTRA-small, seq 128, 20 masked positions. By hand: the generator (hidden 64, 12 layers,
    # FFN 256, embedding 128) forward = projection 2*128*128*64 + 12 * (2*128*(4*64*64 + 2*64*256)
    # + 4*128*128*64) = 2,097,152 + 12 * 16,777,216 = 203,423,744; its MLM head at 20 positions
    # 2*20*(64*128 + 128*30522) = 156,600,320. The discriminator (hidden 256, FFN 1024) forward
    # = 2*128*128*256 + 12 * (2*128*(4*256*256 + 2*256*1024) + 4*128*128*256) = 8,388,608
    # + 12 * 218,103,808 = 2,625,634,304, its head 2*128*(256*256 + 256) = 16,842,752.
    config = PretrainingConfig.create("x", "unused", {})
    disc = get_bert_config(config)
    gen = get_generator_config(config, disc)
    generator_forward = 203_423_744 + 156_600_320
    discriminator_trained = 3 * (2_625_634_304 + 16_842_752)
    fast = experiment.flops_per_sequence("fast_electra", disc, gen, 128, 20, 30522)
    assert fast == generator_forward + discriminator_trained
    electra = experiment.flops_per_sequence("electra", disc, gen, 128, 20, 30522)
    assert electra - fast == 2 * generator_forward  # no backward pass through the generator


@pytest.mark.parametrize("settings", [experiment.FULL, experiment.QUICK], ids=["full", "quick"])
def test_every_objective_gets_the_same_pretraining_budget(settings):
    plan = experiment.budget(settings)
    steps, per_step = plan["steps"], plan["flops_per_step"]
    budget = plan["budget_flops"]
    assert steps["electra"] * per_step["electra"] == budget
    assert abs(steps["mlm"] * per_step["mlm"] - budget) <= per_step["mlm"] / 2
    two_stage = steps["two_stage_1"] * per_step["two_stage_1"] + steps["two_stage_2"] * per_step["two_stage_2"]
    assert steps["two_stage_1"] == steps["two_stage_2"]
    assert abs(two_stage - budget) <= (per_step["two_stage_1"] + per_step["two_stage_2"]) / 2
    fast = (steps["fast_electra_1"] * per_step["fast_electra_1"]
            + steps["fast_electra_2"] * per_step["fast_electra_2"])
    assert steps["fast_electra_1"] == steps["fast_electra_2"]
    assert abs(fast - budget) <= (per_step["fast_electra_1"] + per_step["fast_electra_2"]) / 2
    # Per step, a frozen generator costs its forward pass only; the budget also pays for its
    # pretraining (stage 1, as many steps), so stage 2 has fewer steps than ELECTRA's.
    assert per_step["fast_electra_2"] < per_step["electra"]
    assert steps["fast_electra_2"] < steps["electra"]


@pytest.mark.parametrize("settings", [experiment.FULL, experiment.QUICK], ids=["full", "quick"])
def test_fast_electra_stage1_is_the_electra_runs_generator(settings):
    stage1 = PretrainingConfig.create("s1", "unused",
                                      experiment.fast_electra_stage1_hparams(settings, 5))
    electra = PretrainingConfig.create("e", "unused", experiment.pretraining_hparams(settings, 5))
    assert not stage1.electra_objective
    assert get_bert_config(stage1) == get_generator_config(electra, get_bert_config(electra))
