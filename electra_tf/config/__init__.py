"""Configuration of a pretraining run: `PretrainingConfig`, the model sizes, --hparams parsing and
their checks (pure Python: no TensorFlow, JAX or PyTorch).

pretraining_config.py   PretrainingConfig (the official hparams, strict), presets, JSON
hparams.py              --hparams JSON -> dict, unknown keys (closest match), value types; ConfigError
hparam_checks.py        PretrainingConfig's choices, ranges and validate()
model_config.py         ModelConfig (the official BertConfig), size table, generator sizes
probe_settings.py       the `probe` hparam (the learning probe): keys, defaults, checks
generator_checks.py     frozen-generator / temperature-curriculum combinations that make no sense

`from electra_tf.config import PretrainingConfig` is the public name of the run's configuration.
"""

from electra_tf.config.pretraining_config import (HPARAM_NAMES, MODELS_DIR, PretrainingConfig,
                                                  check_model_name)

__all__ = ["HPARAM_NAMES", "MODELS_DIR", "PretrainingConfig", "check_model_name"]
