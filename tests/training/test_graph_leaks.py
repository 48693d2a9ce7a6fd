"""graph_leaks: traced graphs are freed once their work ends, although TensorFlow's
custom-gradient registry would keep them (tensorflow/tensorflow#97697).

A pretraining `run` and each fine-tuning trial leave no registration behind, and the pretraining
model's traced graphs are garbage-collected after `run` returns (the fine-tuning side is asserted
in tests/finetuning/test_finetuning_starting_points.py's two-trial test).
"""

import gc
import logging
import weakref

import pytest
import tensorflow as tf
from tensorflow.python.framework import func_graph

from electra_tf.training.tf import graph_leaks, trainer as trainer_lib
from tests import pretraining_fixtures as fx

pytestmark = pytest.mark.usefixtures("float32_policy")  # conftest


def trace_a_custom_gradient():
    """Traces and runs a step that differentiates a custom gradient. Returns (gradient, weak
    reference to the traced graph)."""
    @tf.custom_gradient
    def double(x):
        return 2.0 * x, lambda dy: 3.0 * dy  # 3, not 2: the custom gradient is the one used

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = double(x)
        return tape.gradient(y, x)

    x = tf.constant(1.0)
    gradient = float(step(x))
    return gradient, weakref.ref(step.get_concrete_function(x).graph)


def test_registrations_made_in_the_block_are_released_and_their_graph_freed():
    outside_gradient, outside_graph = trace_a_custom_gradient()  # registered outside: kept
    before = graph_leaks.registered_custom_gradients()
    with graph_leaks.custom_gradients_released():
        gradient, graph = trace_a_custom_gradient()
        assert gradient == outside_gradient == 3.0
        assert graph_leaks.registered_custom_gradients() > before
    assert graph_leaks.registered_custom_gradients() == before
    gc.collect()
    assert graph() is None, "the block's traced graph is still referenced"
    assert outside_graph() is not None  # TensorFlow's registry still holds the outside one


def test_registrations_are_released_when_the_block_raises():
    before = graph_leaks.registered_custom_gradients()
    with pytest.raises(ValueError, match="boom"):
        with graph_leaks.custom_gradients_released():
            trace_a_custom_gradient()
            raise ValueError("boom")
    assert graph_leaks.registered_custom_gradients() == before


def _pretrainer_graphs():
    gc.collect()
    return [g for g in gc.get_objects() if isinstance(g, func_graph.FuncGraph)
            and any("electra_pretrainer" in op.name for op in g.get_operations())]


def test_a_pretraining_run_leaves_no_registration_and_no_graph_of_its_model(data_dir, caplog):
    config = fx.tiny_config(data_dir, "graphs", num_train_steps=2, iterations_per_loop=1,
                            save_checkpoints_steps=2, do_eval=True)
    gc.collect()
    before = graph_leaks.registered_custom_gradients()
    graphs_before = len(_pretrainer_graphs())
    with caplog.at_level(logging.DEBUG, logger="electra_tf"):
        results = trainer_lib.run(config)
    assert results["final"]["global_step"] == 2
    released = [r.getMessage() for r in caplog.records if "custom-gradient" in r.getMessage()]
    assert released and int(released[-1].split()[1]) > 0, released  # the step did register some
    assert graph_leaks.registered_custom_gradients() == before
    del results
    assert len(_pretrainer_graphs()) == graphs_before
