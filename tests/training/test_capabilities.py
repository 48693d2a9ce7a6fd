"""The capabilities table (training/capabilities.py): every claim exercised, every gap one line.

Every (feature, backend) the table claims names the test that runs the feature on that backend
(`EXERCISED`); a claim without a test, or a test named here that does not exist, fails. A backend
the table does not claim gets the one-line error naming the feature before anything is written.
The JAX / PyTorch runs of the frozen generator and the two-stage start and the JAX profiler trace
are here; the TensorFlow ones are in their features' own test files.
"""

import dataclasses
import glob
import importlib
import json
import os

import pytest

from electra_tf.errors import TrainingError
from electra_tf.training import capabilities
from tests import backends
from tests import pretraining_fixtures as fx

# (feature, backend) -> "module::test" that runs the feature on that backend.
EXERCISED = {
    ("max_skipped_nonfinite_steps", "tensorflow"):
        "tests.training.test_reliability_nonfinite::"
        "test_poisoned_batch_is_skipped_without_touching_weights_or_optimizer",
    ("max_skipped_nonfinite_steps", "jax"):
        "tests.training.test_reliability_nonfinite::test_portable_backends_skip_a_poisoned_batch",
    ("max_skipped_nonfinite_steps", "torch"):
        "tests.training.test_reliability_nonfinite::test_portable_backends_skip_a_poisoned_batch",
    ("two_stage_generator_dir", "tensorflow"):
        "tests.training.test_two_stage::"
        "test_stage2_starts_from_stage1_freezes_the_generator_and_trains_the_discriminator",
    ("two_stage_generator_dir", "jax"):
        "tests.training.test_capabilities::test_a_frozen_generator_start_without_tensorflow",
    ("two_stage_generator_dir", "torch"):
        "tests.training.test_capabilities::test_a_frozen_generator_start_without_tensorflow",
    ("frozen_generator_dir", "tensorflow"):
        "tests.training.test_frozen_generator::"
        "test_frozen_generator_stays_bit_identical_and_the_run_resumes_exactly",
    ("frozen_generator_dir", "jax"):
        "tests.training.test_capabilities::test_a_frozen_generator_start_without_tensorflow",
    ("frozen_generator_dir", "torch"):
        "tests.training.test_capabilities::test_a_frozen_generator_start_without_tensorflow",
    ("jit_compile", "tensorflow"): "tests.training.test_trainer::test_jit_compile_trains",
    # JAX compiles the whole step always (Keras' jit): the hparam asks for what it does anyway.
    ("jit_compile", "jax"):
        "tests.training.test_portable_trainer::test_jax_trains_as_the_tensorflow_trainer",
    ("profile_steps", "tensorflow"):
        "tests.training.test_tensorboard::test_profiler_trace_is_written_only_when_asked",
    ("profile_steps", "jax"): "tests.training.test_capabilities::test_the_jax_run_traces_steps",
}

# A config that asks for each feature (the run's checks beyond the table are not wanted here).
ASKS = {
    "max_skipped_nonfinite_steps": {"max_skipped_nonfinite_steps": 2},
    "two_stage_generator_dir": {"two_stage_generator_dir": "/a/run"},
    "frozen_generator_dir": {"frozen_generator_dir": "/a/run"},
    "jit_compile": {"jit_compile": True},
    "profile_steps": {},
}


def _claims():
    return {(feature, backend) for feature, row in capabilities.CAPABILITIES.items()
            for backend in row.backends}


def test_every_claim_names_a_test_that_exists():
    assert set(EXERCISED) == _claims()
    for node in set(EXERCISED.values()):
        module, name = node.split("::")
        assert callable(getattr(importlib.import_module(module), name, None)), node


@pytest.mark.parametrize("feature,backend", sorted(
    (f, b) for f in capabilities.CAPABILITIES for b in capabilities.BACKENDS
    if (f, b) not in _claims()))
def test_a_backend_without_the_feature_refuses_it_in_one_line(feature, backend):
    config = dataclasses.replace(fx.tiny_config("/nonexistent", jit_compile=False),
                                 backend=backend, **ASKS[feature])
    profile_steps = 3 if feature == "profile_steps" else 0
    with pytest.raises(TrainingError) as error:
        capabilities.check(config, profile_steps)
    message = str(error.value)
    assert message.startswith(capabilities.CAPABILITIES[feature].name + " is supported with "
                              "--backend tensorflow")
    assert message.endswith(f"(this run has --backend {backend})") and "\n" not in message


def test_a_run_that_asks_for_nothing_passes_on_every_backend():
    for backend in capabilities.BACKENDS:
        config = dataclasses.replace(fx.tiny_config("/nonexistent", jit_compile=False),
                                     backend=backend)
        capabilities.check(config)


# --- The features on JAX and PyTorch ---------------------------------------------------------
GENERATOR_SIZES = {"model_hparam_overrides": {"hidden_size": 16, "num_hidden_layers": 2}}
TWO_STAGE = {"embedding_size": 64}
STEPS = dict(num_train_steps=2, iterations_per_loop=2, save_checkpoints_steps=2, do_eval=False,
             do_export=False)
STARTS = {
    # kind: (the source run's hparams, the run's hparams but the source's directory)
    "frozen_generator_dir": (dict(electra_objective=False, **GENERATOR_SIZES),
                             {"gen_weight": 0.0}),
    "two_stage_generator_dir": (dict(electra_objective=False, **TWO_STAGE),
                                dict(TWO_STAGE, untied_generator_embeddings=True,
                                     generator_hidden_size=1.0, generator_layers=1.0,
                                     gen_weight=0.0)),
}


@pytest.mark.slow  # two tiny runs in a child per case: ~40 s each on 2 loaded cores
@pytest.mark.parametrize("backend", ["jax", "torch"])
@pytest.mark.parametrize("kind", sorted(STARTS))
def test_a_frozen_generator_start_without_tensorflow(data_dir, backend, kind):
    """The source's masked LM is copied at step 0 (two-stage: into the discriminator too) and
    never moves; the discriminator trains."""
    backends.require(backend)
    source_hparams, hparams = STARTS[kind]
    source = fx.tiny_config(data_dir, f"{kind}_source_{backend}", backend=backend,
                            **dict(STEPS, **source_hparams))
    config = fx.tiny_config(data_dir, f"{kind}_{backend}", backend=backend,
                            **dict(STEPS, **hparams, **{kind: source.model_dir}))
    out = backends.run_on_backend(backend, f"""
        import json
        import numpy as np
        from electra_tf.config import PretrainingConfig
        from electra_tf.training import run_dir
        from electra_tf.training.portable import trainer as portable_trainer

        def same(a, b):
            return len(a) == len(b) > 0 and all(np.array_equal(x, y) for x, y in zip(a, b))

        source = PretrainingConfig.from_dict(json.loads({source.to_json()!r}))
        config = PretrainingConfig.from_dict(json.loads({config.to_json()!r}))
        portable_trainer.run(source)
        mlm = run_dir.load_run(source.model_dir).model.mlm_encoder.get_weights()
        with portable_trainer.PortableTrainer(config) as trainer:
            model = trainer.model
            start = [w.copy() for w in model.discriminator.get_weights()]
            out["copied"] = np.array(same(model.generator.get_weights(), mlm))
            out["disc_copied"] = np.array(same(start, mlm))
            trainer.train()
            out["frozen"] = np.array(same(model.generator.get_weights(), mlm))
            out["disc_moved"] = np.array(not same(model.discriminator.get_weights(), start))
            out["step"] = np.array(trainer.step)
        """)
    assert bool(out["copied"]) and bool(out["frozen"]) and bool(out["disc_moved"])
    assert bool(out["disc_copied"]) == (kind == "two_stage_generator_dir")
    assert int(out["step"]) == 2


def test_a_tensorflow_source_is_refused_in_one_line_without_tensorflow(data_dir, tmp_path):
    """A JAX / PyTorch run reads a source's ckpt-N.npz; a TensorFlow run's checkpoint would
    need TensorFlow: one line naming the hparam and the way out."""
    backends.require("jax")
    source = fx.tiny_config(data_dir, "tf_source", electra_objective=False, **GENERATOR_SIZES)
    os.makedirs(source.model_dir)
    source.save(os.path.join(source.model_dir, "config.json"))
    config = fx.tiny_config(data_dir, "from_tf_source", backend="jax",
                            frozen_generator_dir=source.model_dir)
    out = backends.run_on_backend("jax", f"""
        import json
        from electra_tf.config import PretrainingConfig
        from electra_tf.errors import TrainingError
        from electra_tf.training import frozen_generator

        config = PretrainingConfig.from_dict(json.loads({config.to_json()!r}))
        try:
            frozen_generator.start(None, config, None, fresh=True)
            out["error"] = ""
        except TrainingError as e:
            out["error"] = str(e)
        """)
    error = str(out["error"])
    assert error.startswith(f"frozen_generator_dir {source.model_dir} is not a JAX or PyTorch "
                            "run"), error
    assert "--backend tensorflow" in error and "\n" not in error


@pytest.mark.slow  # a tiny JAX run in a child: ~30 s
def test_the_jax_run_traces_steps(data_dir):
    """--profile-steps on JAX: jax.profiler's trace in the run directory's plugins/profile/, the
    layout TensorBoard's Profile tab reads (the TensorFlow run's too)."""
    backends.require("jax")
    config = fx.tiny_config(data_dir, "jax_profile", backend="jax", num_train_steps=4,
                            iterations_per_loop=2, save_checkpoints_steps=4, do_eval=False,
                            do_export=False)
    backends.run_on_backend("jax", f"""
        import json
        from electra_tf.config import PretrainingConfig
        from electra_tf.training.portable import trainer as portable_trainer

        portable_trainer.run(PretrainingConfig.from_dict(json.loads({config.to_json()!r})),
                             profile_steps=2)
        """)
    traces = glob.glob(os.path.join(config.model_dir, "plugins", "profile", "*", "*.xplane.pb"))
    assert len(traces) == 1 and os.path.getsize(traces[0]) > 1000, traces
    with open(os.path.join(config.model_dir, "config.json"), encoding="utf-8") as f:
        assert json.load(f)["backend"] == "jax"
