"""The `probe` hparam: what the learning probe of a pretraining run reads and how often it runs.

A plain JSON object in `--hparams` (so experiment scripts pass it as a dict), checked strictly:
an unknown key is an error naming it and the closest valid one; a value of the wrong type or
range is an error naming `probe.<key>`. The resolved config holds it with every default filled
in. Only the settings are checked here (pure Python, no file access): a `config.json` naming a
task directory that has since moved still loads; the trainer reads and checks the task directory
when a run with the probe starts (`training.probe`).
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Mapping

from electra_tf.errors import is_utf8_path, shown_path
from electra_tf.config.hparams import MAX_INT32, ConfigError, check_known_hparams, coerce_hparam

# How the per-token hidden states of the discriminator's last layer become one vector.
POOLINGS = ("mean", "cls")


@dataclasses.dataclass(frozen=True)
class ProbeSettings:
    """The learning probe's settings (docs/config.md, "The learning probe").

    Attributes:
        task_dir: str. A classification task directory as `run_finetuning.py` reads it: its
            name is the task name (a GLUE name such as `SST-2`, or any other name for a generic
            task with train/dev `.tsv`/`.csv` files), its parent the `raw_data_dir`.
        every_n_steps: int. Run after the training loop that reaches or passes each multiple.
        max_train_examples: int. Training examples the classifier is fit on (at most).
        max_dev_examples: int. Dev examples it is scored on (at most).
        pooling: str. "mean" (the last layer's hidden states averaged over real tokens) or
            "cls" (the [CLS] position's).
        l2: float. Weight of the classifier's 0.5 * l2 * ||W||^2 term (`linear_probe`).
    """

    task_dir: str
    every_n_steps: int = 1000
    max_train_examples: int = 1000
    max_dev_examples: int = 500
    pooling: str = "mean"
    l2: float = 1e-3

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


_FIELDS = tuple(f.name for f in dataclasses.fields(ProbeSettings))
_TYPES = typing.get_type_hints(ProbeSettings)


def parse(value: Mapping[str, Any]) -> ProbeSettings:
    """The settings of a `probe` hparam value (a mapping).

    Raises:
        ConfigError: an unknown or missing key, a wrong type or range (naming `probe.<key>`).
    """
    try:
        check_known_hparams(value, _FIELDS)
    except ConfigError as e:  # "Unknown hparam 'x'; did you mean ..." -> the probe's key
        raise ConfigError(str(e).replace("Unknown hparam '", "Unknown key 'probe.", 1)) from None
    if "task_dir" not in value:
        raise ConfigError("hparam 'probe' needs 'task_dir': a classification task directory "
                          "(as run_finetuning.py reads raw_data_dir/<task>)")
    settings = ProbeSettings(**{key: coerce_hparam(f"probe.{key}", item, _TYPES[key])
                                for key, item in value.items()})
    _check(settings)
    return settings


def _check(settings: ProbeSettings) -> None:
    def need(cond, message):
        if not cond:
            raise ConfigError(message)

    need(settings.task_dir.strip() != "", "probe.task_dir must name a directory, got ''")
    need(is_utf8_path(settings.task_dir),
         f"probe.task_dir {shown_path(settings.task_dir)}: not a valid UTF-8 file name")
    need(1 <= settings.every_n_steps <= MAX_INT32,
         f"probe.every_n_steps must be in [1, {MAX_INT32}], got {settings.every_n_steps}")
    need(settings.max_train_examples >= 2,
         f"probe.max_train_examples must be >= 2, got {settings.max_train_examples}")
    need(settings.max_dev_examples >= 1,
         f"probe.max_dev_examples must be >= 1, got {settings.max_dev_examples}")
    need(settings.pooling in POOLINGS,
         f"probe.pooling must be one of {', '.join(POOLINGS)}, got {settings.pooling!r}")
    need(settings.l2 > 0.0, f"probe.l2 must be > 0 (it keeps the fit finite on separable "
                            f"features), got {settings.l2}")


def resolved(value: Mapping[str, Any]) -> dict:
    """The `probe` hparam with every default filled in (what config.json records)."""
    return parse(value).to_dict()
