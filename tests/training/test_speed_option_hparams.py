"""The speed options of issue 45 as pretraining hparams: `vocab_padding_multiple` and
`fused_attention` in `PretrainingConfig` (strict: types, ranges, fused attention refused beside
an attention dropout), saved in config.json (an older config.json without them loads with the
defaults), and reaching the model both trainers build (`from_pretraining_config`): a few steps
on TensorFlow (`Trainer`) and on JAX and PyTorch (`PortableTrainer`, TensorFlow unimportable).
"""

import json
import os

import numpy as np
import pytest

from electra_tf.config import PretrainingConfig
from electra_tf.config.hparams import ConfigError
from electra_tf.pretraining.model import PretrainingModel
from electra_tf.vocab import SpecialTokens
from tests import backends
from tests import pretraining_fixtures as fx

SPECIAL = SpecialTokens(pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4)
NO_ATTENTION_DROPOUT = {"model_hparam_overrides": {"attention_probs_dropout_prob": 0.0}}
# Both options on, as a user sets them (attention dropout 0 for fused attention).
BOTH = dict(vocab_padding_multiple=128, fused_attention=True, **NO_ATTENTION_DROPOUT)
STEPS = 3


def _create(**hparams):
    return PretrainingConfig.create("m", "/tmp/unused", fx.tiny_hparams(**hparams))


def test_defaults_are_off():
    config = _create()
    assert config.vocab_padding_multiple == 1 and config.fused_attention is False


@pytest.mark.parametrize("hparams, message", [
    ({"vocab_padding_multiple": 0}, r"^vocab_padding_multiple must be in \[1, 2147483647\] "
                                    r"\(1 = off\), got 0$"),
    ({"vocab_padding_multiple": -128}, "^vocab_padding_multiple must be in .* got -128$"),
    ({"vocab_padding_multiple": 2**31}, "^vocab_padding_multiple must be in .* got 2147483648$"),
    ({"vocab_padding_multiple": 1.5}, "'vocab_padding_multiple' must be int, got 1.5"),
    ({"vocab_padding_multiple": True}, "'vocab_padding_multiple' must be int, got True"),
    ({"vocab_padding_multiple": "128"}, "'vocab_padding_multiple' must be int"),
    ({"fused_attention": 1}, "'fused_attention' must be bool, got 1"),
    ({"fused_attention": "true"}, "'fused_attention' must be bool"),
    ({"fused_atention": True}, "Unknown hparam 'fused_atention'; did you mean 'fused_attention'"),
    ({"vocab_padding": 128}, "Unknown hparam 'vocab_padding'; did you mean "
                             "'vocab_padding_multiple'"),
    # The default attention dropout (0.1): fused attention has none.
    ({"fused_attention": True},
     r"^fused_attention .*model_hparam_overrides\.attention_probs_dropout_prob 0, got 0\.1 "),
    ({"fused_attention": True, "model_hparam_overrides": {"attention_probs_dropout_prob": 0.05}},
     r"^fused_attention .*model_hparam_overrides\.attention_probs_dropout_prob 0, got 0\.05 "),
])
def test_invalid_values_are_one_line_errors_naming_the_hparam(hparams, message):
    with pytest.raises(ConfigError, match=message) as error:
        _create(**hparams)
    assert "\n" not in str(error.value)


def test_valid_values_and_the_model_built_from_the_config():
    config = _create(**BOTH)
    assert config.vocab_padding_multiple == 128 and config.fused_attention is True
    model = PretrainingModel.from_pretraining_config(config, SPECIAL)
    assert model.vocab_padding_multiple == 128 and model.fused_attention
    assert model.generator_head.vocab_padding_multiple == 128
    assert all(layer.fused_attention for encoder in (model.discriminator, model.generator)
               for layer in encoder.encoder_layers)
    # Off (the defaults): nothing changes in the model either.
    plain = PretrainingModel.from_pretraining_config(_create(), SPECIAL)
    assert plain.generator_head.vocab_padding_multiple == 1
    assert not any(layer.fused_attention for encoder in (plain.discriminator, plain.generator)
                   for layer in encoder.encoder_layers)
    # A keyword argument still wins over the config (benchmarks/gpu_step.py's variants).
    again = PretrainingModel.from_pretraining_config(config, SPECIAL, vocab_padding_multiple=64)
    assert again.generator_head.vocab_padding_multiple == 64


def test_config_json_round_trip_and_older_files_load_with_the_defaults(tmp_path):
    config = _create(**BOTH)
    path = str(tmp_path / "config.json")
    config.save(path)
    saved = json.loads(open(path, encoding="utf-8").read())
    assert saved["vocab_padding_multiple"] == 128 and saved["fused_attention"] is True
    assert PretrainingConfig.load(path) == config
    # A config.json written before the options existed: the keys absent, the options off.
    del saved["vocab_padding_multiple"], saved["fused_attention"]
    with open(path, "w", encoding="utf-8") as f:
        json.dump(saved, f)
    old = PretrainingConfig.load(path)
    assert old.vocab_padding_multiple == 1 and old.fused_attention is False
    # A saved config is checked as strictly as --hparams.
    saved["fused_attention"] = True  # beside the saved attention dropout 0: valid
    assert PretrainingConfig.from_dict(saved).fused_attention
    saved["model_hparam_overrides"] = {}
    with pytest.raises(ConfigError, match="^fused_attention .*got 0.1"):
        PretrainingConfig.from_dict(saved)


def _model_options(model) -> dict:
    layers = [layer for encoder in (model.discriminator, model.generator)
              for layer in encoder.encoder_layers]
    return {"padding": model.generator_head.vocab_padding_multiple,
            "fused": [layer.fused_attention for layer in layers]}


@pytest.mark.slow
@pytest.mark.usefixtures("float32_policy")
def test_a_tensorflow_run_with_both_options(data_dir):
    from electra_tf.training.tf import trainer as trainer_lib

    config = fx.tiny_config(data_dir, "tf_options", num_train_steps=STEPS,
                            iterations_per_loop=STEPS, save_checkpoints_steps=STEPS, **BOTH)
    with trainer_lib.Trainer(config) as trainer:
        options = _model_options(trainer.model)
        trainer.train()
        assert trainer.step == STEPS
    assert options["padding"] == 128 and options["fused"] and all(options["fused"])
    losses = fx.read_scalars(config.model_dir, ("total_loss",))["total_loss"]
    assert sorted(losses) == [STEPS] and np.isfinite(losses[STEPS])
    saved = PretrainingConfig.load(os.path.join(config.model_dir, "config.json"))
    assert saved.vocab_padding_multiple == 128 and saved.fused_attention


@pytest.mark.slow
@pytest.mark.parametrize("backend", backends.BACKENDS)
def test_a_jax_or_torch_run_with_both_options(data_dir, backend):
    backends.require(backend)
    hparams = fx.tiny_hparams(num_train_steps=STEPS, iterations_per_loop=STEPS,
                              save_checkpoints_steps=STEPS, backend=backend, **BOTH)
    name = f"{backend}_options"
    out = backends.run_on_backend(backend, f"""
        from electra_tf.config import PretrainingConfig
        from electra_tf.training.portable.trainer import PortableTrainer
        config = PretrainingConfig.create({name!r}, {data_dir!r}, {hparams!r})
        with PortableTrainer(config) as trainer:
            model = trainer.model
            layers = [layer for encoder in (model.discriminator, model.generator)
                      for layer in encoder.encoder_layers]
            out["padding"] = model.generator_head.vocab_padding_multiple
            out["fused"] = [layer.fused_attention for layer in layers]
            scalars = trainer.train()
            out["step"] = trainer.step
            out["total_loss"] = scalars["total_loss"]
    """)
    assert int(out["padding"]) == 128 and out["fused"].size and out["fused"].all()
    assert int(out["step"]) == STEPS and np.isfinite(out["total_loss"])
    model_dir = os.path.join(data_dir, "models", name)
    saved = PretrainingConfig.load(os.path.join(model_dir, "config.json"))
    assert saved.vocab_padding_multiple == 128 and saved.fused_attention
    assert saved.backend == backend
