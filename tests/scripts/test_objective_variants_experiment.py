"""experiments/electra_vs_mlm.py with issue 34's variants: every variant's plan costs the
budget, the probe's checkpoints are kept, the flags refuse unknown names, and a quick run of
two variants goes end to end (pretraining, probe curves, fine-tuning, summary)."""

import argparse
import json
import os
import subprocess
import sys

import pytest

from tests import pretraining_fixtures as fx

sys.path.insert(0, os.path.join(fx.REPO_ROOT, "experiments"))
import electra_vs_mlm as experiment  # noqa: E402

TIMEOUT = 600


@pytest.mark.parametrize("settings", [experiment.FULL, experiment.QUICK], ids=["full", "quick"])
def test_every_variant_costs_the_budget(settings):
    plan = experiment.budget(settings)
    budget = plan["budget_flops"]
    for objective in experiment.ALL_OBJECTIVES:
        stage1_steps, stage1_per_step, steps, per_step = experiment.plan_steps(plan, objective)
        total = stage1_steps * stage1_per_step + steps * per_step
        # Step counts are whole: the budget is met to within half of one step of each stage.
        assert abs(total - budget) <= (stage1_per_step + per_step) / 2, objective
    # GDES and decoupled optimizers add no matmul: the ELECTRA run's steps and FLOPs.
    for variant in experiment.VARIANT_HPARAMS:
        assert experiment.plan_steps(plan, variant) == experiment.plan_steps(plan, "electra")
    # Fast-ELECTRA's frozen generator costs a forward pass: its stage 2 step is cheaper than an
    # ELECTRA step, and its stage 1 is charged in full (both stages have the same steps).
    fe1_steps, fe1, fe2_steps, fe2 = experiment.plan_steps(plan, "fast_electra")
    assert fe2 < plan["flops_per_step"]["electra"] and fe1 > 0
    assert fe1_steps == fe2_steps


def test_the_probe_reads_step_0_and_every_fifth_and_the_fine_tuned_checkpoints_are_kept():
    assert experiment.probe_steps(experiment.FULL, 3000) == [0, 600, 1200, 1800, 2400, 3000]
    kept = experiment.kept_steps(experiment.FULL, 3000)
    assert 0 not in kept  # the trainer writes ckpt-0 itself
    assert {1000, 2000, 3000} <= set(kept)  # fine-tuned at 1/3 and 2/3 (checkpoint_fractions)
    assert set(experiment.probe_steps(experiment.FULL, 3000)) - {0} <= set(kept)


def test_objectives_flag_keeps_the_documented_order_and_refuses_unknown_names():
    parse = experiment._names(experiment.ALL_OBJECTIVES)
    assert parse("fast_electra,electra , gdes") == ("electra", "gdes", "fast_electra")
    with pytest.raises(argparse.ArgumentTypeError, match="unknown name.*electrra"):
        parse("electra,electrra")
    with pytest.raises(argparse.ArgumentTypeError):
        parse(" , ")


def test_summary_lists_each_stage_the_probe_and_the_seeds():
    plan = experiment.budget(experiment.QUICK)
    row = {"seconds": 1.0, "examples_per_second": 2.0}
    results = {
        "plan": plan, "objectives": ["gdes", "fast_electra"],
        "pretraining": {"gdes": row, "fast_electra_1": row, "fast_electra": {}},
        "finetuning": {"gdes": {"pang_lee": {"trials": 3, "dev": {"accuracy": {"mean": 50.0, "std": 1.0}}}}},
        "curve_points": [],
        "probe": {"gdes": [{"step": 0, "flops": 0.0, "dev_accuracy": 0.5, "train_accuracy": 0.75}]},
    }
    text = experiment.summary_markdown(results)
    steps = plan["steps"]
    assert f"| fast_electra_1 | {steps['fast_electra_1']} |" in text
    assert f"| fast_electra | {steps['fast_electra_2']} |" in text and "| - | - |" in text
    assert f"| gdes | {steps['electra']} |" in text
    assert "| gdes | pang_lee | 3 | 50.0 ± 1.0 |" in text
    assert "| gdes | 0 | 0 | 50.0 | 75.0 |" in text


@pytest.mark.slow
def test_two_variants_run_end_to_end(tmp_path):
    data_dir, raw = tmp_path / "data", tmp_path / "raw"
    fx.write_dataset(str(data_dir), examples_per_shard=64)
    fx.write_labelled_tasks(str(raw))
    out = tmp_path / "output"
    run = subprocess.run(
        [sys.executable, os.path.join("experiments", "electra_vs_mlm.py"), "--quick",
         "--objectives", "fast_electra,gdes", "--tasks", "pang_lee", "--seeds", "1",
         "--curve-seeds", "0", "--data-dir", str(data_dir), "--raw-dir", str(raw),
         "--work-dir", str(tmp_path / "work"), "--output-dir", str(out)],
        capture_output=True, text=True, env=fx.subprocess_env(), cwd=fx.REPO_ROOT, timeout=TIMEOUT)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    with open(out / "results.json") as f:
        results = json.load(f)
    plan = results["plan"]
    assert results["objectives"] == ["gdes", "fast_electra"]
    assert set(results["pretraining"]) == {"gdes", "fast_electra_1", "fast_electra"}
    assert set(results["finetuning"]) == {"gdes", "fast_electra", "random"}
    for objective, steps in (("gdes", plan["steps"]["electra"]),
                             ("fast_electra", plan["steps"]["fast_electra_2"])):
        rows = results["probe"][objective]
        assert [r["step"] for r in rows] == experiment.probe_steps(experiment.QUICK, steps)
        assert all(0.0 <= r["dev_accuracy"] <= 1.0 for r in rows)
        # The probe's x axis counts what the run cost: fast_electra starts after its stage 1.
        first = rows[0]["flops"]
        assert first == (0.0 if objective == "gdes" else
                         plan["steps"]["fast_electra_1"] * plan["flops_per_step"]["fast_electra_1"])
    # The discriminator AUC curve comes from the training events of every run.
    assert results["reference_curves"]["fast_electra"]["disc_auc"]
    summary = (out / "summary.md").read_text()
    assert "## Learning probe" in summary and "| fast_electra_1 |" in summary
