"""TensorBoard beyond scalars: the run's hparams, its resolved config, an opt-in profiler trace.

- HPARAMS tab: every resolved hparam of the run (`config.json`'s fields; lists and dicts as
  JSON text, paths left out) through the hparams plugin, with the run's name as the trial id,
  so runs of one `DATA_DIR/models` compare side by side against their losses and eval metrics.
- TEXT tab: `config` holds the resolved config.json as a code block, at the step training
  (re)started from.
- PROFILE tab (needs `tensorboard-plugin-profile`, the `profile` extra): with
  `electra-pretrain --profile-steps N` the first whole loops after the first one (which
  compiles) are traced, at least N steps, into `MODEL_DIR/plugins/profile/<time>/`: by
  TensorFlow's profiler, or on JAX by `jax.profiler` (the same layout and tab).

Only the chief writes.
"""

from __future__ import annotations

import json
import logging
from typing import Optional

logger = logging.getLogger("electra_tf")

CONFIG_TEXT_TAG = "config"
# Config fields that are locations, not settings: they differ between machines, not runs.
PATH_FIELDS = ("data_dir", "model_dir", "vocab_file", "pretrain_tfrecords", "eval_tfrecords",
               "two_stage_generator_dir", "frozen_generator_dir", "init_checkpoint")


def hparam_values(config_dict: dict) -> dict:
    """The hparams plugin's values: bool/int/float/str as they are, others as JSON text; paths
    and unset (None) values left out."""
    values = {}
    for key, value in sorted(config_dict.items()):
        if key in PATH_FIELDS or value is None:
            continue
        values[key] = value if isinstance(value, (bool, int, float, str)) else json.dumps(
            value, sort_keys=True)
    return values


def write_run_info(writer: Optional["tf.summary.SummaryWriter"], config, step: int) -> None:
    """Writes the hparams (plugin) and the config text summary at `step` (chief only: nothing
    without a writer)."""
    if writer is None:
        return
    import tensorflow as tf
    from tensorboard.plugins.hparams import api as hp

    config_dict = config.to_dict()
    with writer.as_default(step=step):
        hp.hparams(hparam_values(config_dict), trial_id=config.model_name)
        tf.summary.text(CONFIG_TEXT_TAG, config_text(config_dict))
    writer.flush()


def config_text(config_dict: dict) -> str:
    """The `config` text summary: the resolved config as a JSON code block."""
    return "```\n" + json.dumps(config_dict, indent=2, sort_keys=True, default=str) + "\n```"


class Profiler:
    """Traces whole compiled loops (the first after the start is skipped: it compiles) until at
    least `steps` steps are traced; 0 traces nothing.

    Args:
        logdir: str. The run directory (the trace goes to logdir/plugins/profile/).
        steps: int. Steps to trace.
        chief: bool. Only the chief traces.
        backend: str. "tensorflow" (`tf.profiler`) or "jax" (`jax.profiler`): the Keras
            backend the run trains on (`capabilities`: PyTorch has none here).
    """

    def __init__(self, logdir: str, steps: int, chief: bool = True, backend: str = "tensorflow"):
        self.logdir = logdir
        self.steps = steps if chief else 0
        self.backend = backend
        self.loops_seen = 0
        self.active = False
        self.start_step = None

    def before_loop(self, step: int) -> None:
        self.loops_seen += 1
        if self.steps > 0 and self.loops_seen == 2 and not self.active:
            if self.backend == "jax":
                import jax

                jax.profiler.start_trace(self.logdir)
            else:
                import tensorflow as tf

                tf.profiler.experimental.start(self.logdir)
            self.active, self.start_step = True, step

    def after_loop(self, step: int) -> None:
        if self.active and step - self.start_step >= self.steps:
            self.stop(step)

    def stop(self, step: int) -> None:
        if self.active:
            if self.backend == "jax":
                import jax

                jax.profiler.stop_trace()
            else:
                import tensorflow as tf

                tf.profiler.experimental.stop()
            self.active, self.steps = False, 0
            logger.info("profiler: traced steps %d-%d into %s/plugins/profile (TensorBoard's "
                        "Profile tab)", self.start_step, step, self.logdir)
