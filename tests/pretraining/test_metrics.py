"""Pretraining metrics: official names and weightings on hand-made batches (item 34)."""

import numpy as np
import pytest
import tensorflow as tf

from electra_tf.pretraining import losses, masking, metrics as metrics_lib, sampling


def _outputs():
    """A hand-made official `eval_fn_inputs` dict whose metric values are worked out below."""
    return {
        "input_ids": tf.zeros([2, 6], tf.int32),
        "masked_lm_ids": tf.constant([[5, 6, 7, 0], [8, 9, 0, 0]]),
        "masked_lm_weights": tf.constant([[1, 1, 1, 0], [1, 1, 0, 0]], tf.float32),
        # correct at (0,0), (0,2), (1,0); unused slots "correct" (0 == 0) but weight 0
        "masked_lm_preds": tf.constant([[5, 0, 7, 0], [8, 1, 0, 0]]),
        "mlm_loss": tf.constant([[1.0, 2.0, 3.0, 100.0], [4.0, 5.0, 100.0, 100.0]]),
        "sampled_tokids": tf.constant([[5, 6, 0, 0], [0, 0, 0, 0]]),  # correct at (0,0), (0,1)
        "input_mask": tf.constant([[1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0]]),
        "disc_labels": tf.constant([[0, 1, 1, 0, 0, 0], [0, 1, 1, 0, 0, 0]]),
        "disc_preds": tf.constant([[0, 1, 0, 1, 1, 0], [0, 0, 1, 0, 1, 0]]),
        "disc_probs": tf.constant([[0.2, 0.9, 0.4, 0.7, 0.95, 0.05], [0.1, 0.3, 0.8, 0.45, 0.6, 0.02]]),
        "disc_loss": tf.constant([0.5, 1.5]),
    }


# Real tokens (input_mask 1): labels 0 1 1 0 | 0 1 1; preds 0 1 0 1 | 0 0 1.
EXPECTED = {
    "masked_lm_accuracy": 3 / 5,
    "masked_lm_loss": (1 + 2 + 3 + 4 + 5) / 5,
    "sampled_masked_lm_accuracy": 2 / 5,
    "disc_loss": 1.0,  # unweighted mean of the per-sequence losses
    # positives {0.9, 0.4, 0.3, 0.8} vs negatives {0.2, 0.7, 0.1}: 10 of 12 pairs ordered right
    "disc_auc": 10 / 12,
    "disc_accuracy": 4 / 7,
    "disc_precision": 2 / 3,  # predicted positives (0,1) (0,3) (1,2): 2 right
    "disc_recall": 2 / 4,  # true positives (0,1) (0,2) (1,1) (1,2): 2 found
    "disc_replaced_share": 4 / 7,  # real tokens labelled replaced (not an official metric)
}
# Official AUC: 5 padding positions join the negatives with probability 0; every positive beats
# them, so (10 + 4 * 5) / (4 * 8).
OFFICIAL_AUC = 30 / 32


def _results(m):
    return {k: float(v) for k, v in m.result().items()}


def test_exact_values_and_official_names():
    m = metrics_lib.PretrainingMetrics()
    m.update_state(_outputs())
    got = _results(m)
    assert list(got) == list(metrics_lib.METRIC_NAMES)
    for name, value in EXPECTED.items():
        assert got[name] == pytest.approx(value, abs=1e-6), name


def test_official_padding_inclusive_auc_behind_flag():
    m = metrics_lib.PretrainingMetrics(disc_auc_include_padding=True)
    m.update_state(_outputs())
    got = _results(m)
    assert got["disc_auc"] == pytest.approx(OFFICIAL_AUC, abs=1e-6)
    assert got["disc_accuracy"] == pytest.approx(EXPECTED["disc_accuracy"], abs=1e-6)


def test_streaming_over_batches_in_graph_mode_and_reset():
    m = metrics_lib.PretrainingMetrics()
    update = tf.function(m.update_state)
    update(_outputs())
    second = dict(_outputs())
    second["masked_lm_preds"] = second["masked_lm_ids"]  # all 5 right in the second batch
    second["disc_loss"] = tf.constant([3.0, 3.0])
    update(second)
    got = _results(m)
    assert got["masked_lm_accuracy"] == pytest.approx(8 / 10, abs=1e-6)
    assert got["disc_loss"] == pytest.approx(2.0, abs=1e-6)
    m.reset_state()
    m.update_state(_outputs())
    assert _results(m)["masked_lm_accuracy"] == pytest.approx(3 / 5, abs=1e-6)


def test_metric_sets_follow_objective_and_disc_weight():
    bert = metrics_lib.PretrainingMetrics(electra_objective=False)
    outputs = {k: v for k, v in _outputs().items() if not k.startswith(("disc_", "sampled_"))}
    bert.update_state(outputs)
    assert list(bert.result()) == ["masked_lm_accuracy", "masked_lm_loss"]
    no_disc = metrics_lib.PretrainingMetrics(disc_weight=0.0)
    no_disc.update_state(_outputs())
    assert list(no_disc.result()) == ["masked_lm_accuracy", "masked_lm_loss", "sampled_masked_lm_accuracy"]
    assert [m.name for m in metrics_lib.PretrainingMetrics().metrics] == list(metrics_lib.METRIC_NAMES)


def test_metric_inputs_builds_official_dict_from_package_outputs():
    out = _outputs()
    masked = masking.MaskedInputs(out["input_ids"], out["input_mask"], tf.zeros_like(out["input_mask"]),
                                  tf.zeros([2, 4], tf.int32), out["masked_lm_ids"], out["masked_lm_weights"])
    mlm = losses.MLMLoss(tf.constant(0.0), out["mlm_loss"], out["masked_lm_preds"])
    fake = sampling.FakeInputs(tf.zeros([2, 6], tf.int32), out["disc_labels"], out["sampled_tokids"])
    rtd = losses.RTDLoss(tf.constant(0.0), out["disc_loss"], out["disc_probs"], out["disc_preds"])
    built = metrics_lib.metric_inputs(masked, mlm, fake, rtd)
    assert set(built) == set(metrics_lib.METRIC_INPUT_KEYS)
    for key in built:
        np.testing.assert_array_equal(built[key].numpy(), out[key].numpy(), err_msg=key)
    assert set(metrics_lib.metric_inputs(masked, mlm)) == {
        "input_ids", "masked_lm_preds", "mlm_loss", "masked_lm_ids", "masked_lm_weights", "input_mask"}


def test_update_inside_mirrored_strategy_equals_one_device(mirrored_strategy):
    strategy = mirrored_strategy  # shared: see tests/conftest.py
    with strategy.scope():
        m = metrics_lib.PretrainingMetrics()
    out = _outputs()
    # replica r gets example r of the batch (as a batch of one)
    local = strategy.experimental_distribute_values_from_function(
        lambda ctx: {k: v[ctx.replica_id_in_sync_group:ctx.replica_id_in_sync_group + 1] for k, v in out.items()})
    tf.function(lambda x: strategy.run(m.update_state, args=(x,)))(local)
    got = _results(m)
    for name, value in EXPECTED.items():
        assert got[name] == pytest.approx(value, abs=1e-6), name
