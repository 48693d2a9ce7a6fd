"""The experiment script's compute accounting (experiments/electra_vs_mlm.py)."""

import os
import sys

import pytest

from electra_tf.config import PretrainingConfig, get_bert_config, get_generator_config
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
