"""TensorBoard event files without TensorFlow: the JAX and PyTorch trainer's scalars and config.

Written with TensorBoard's own writer (`tensorboard.summary.writer.EventFileWriter`) and summary
protos (`scalar_pb`, `text_pb`), which need no TensorFlow: the same tags, plugins and layout as
the TensorFlow trainer's `tf.summary` events (run directory for training, `eval/` for the
held-out evaluation), so one TensorBoard shows runs of every backend side by side.
"""

from __future__ import annotations

from typing import Dict

from electra_tf.errors import TrainingError, error_line
from electra_tf.training import board


class EventWriter:
    """Scalars and text into `directory`'s event file (created on the first write)."""

    def __init__(self, directory: str):
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self.directory = directory
        self._writer = EventFileWriter(directory)

    def _add(self, step: int, summary) -> None:
        import time

        from tensorboard.compat.proto import event_pb2

        self._writer.add_event(event_pb2.Event(wall_time=time.time(), step=int(step),
                                               summary=summary))

    def scalars(self, step: int, values: Dict[str, float]) -> None:
        """One scalar event per name, at `step` (the `scalars` plugin, as `tf.summary.scalar`)."""
        from tensorboard.compat.proto import summary_pb2
        from tensorboard.plugins.scalar.summary_v2 import scalar_pb

        summary = summary_pb2.Summary()
        for name, value in values.items():
            summary.value.extend(scalar_pb(name, float(value)).value)
        self._add(step, summary)

    def text(self, tag: str, step: int, body: str) -> None:
        """A markdown text at `step` (the `text` plugin)."""
        from tensorboard.plugins.text.summary_v2 import text_pb

        self._add(step, text_pb(tag, body))

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def write_scalars(directory: str, step: int, values: Dict[str, float]) -> None:
    """Scalars at `step` into a fresh event file of `directory` (the eval results)."""
    writer = EventWriter(directory)
    try:
        writer.scalars(step, values)
    finally:
        writer.close()


def write_run_info(writer: EventWriter, config, step: int) -> None:
    """The hparams plugin's session and the resolved config as the `config` text, as the
    TensorFlow trainer's `board.write_run_info`."""
    from tensorboard.plugins.hparams import summary_v2 as hparams_summary

    config_dict = config.to_dict()
    try:
        writer._add(step, hparams_summary.hparams_pb(board.hparam_values(config_dict),
                                                     trial_id=config.model_name))
        writer.text(board.CONFIG_TEXT_TAG, step, board.config_text(config_dict))
        writer.flush()
    except OSError as e:
        raise TrainingError(f"cannot write TensorBoard events in {writer.directory} "
                            f"({error_line(e)})") from None
