"""The converters' side of a run directory: reading it (as ConversionErrors) and output safety.

The run directory itself (names, which checkpoint to read, how to build its model) belongs to
`electra_tf.training.run_dir`; exports only need its `model` weights.
"""

from __future__ import annotations

import os
from typing import Optional, Sequence

from electra_tf.convert.names import ConversionError
from electra_tf.errors import TrainingError
from electra_tf.training import run_dir


def load_model_dir(model_dir: str, checkpoint: Optional[str] = None) -> run_dir.LoadedRun:
    """`run_dir.load_run` for a converter: the run's model with the checkpoint's weights.

    Args:
        model_dir: a run directory (`--model-dir`).
        checkpoint: optional checkpoint prefix (or directory) instead of the latest one.

    Raises:
        ConversionError: files missing, or the checkpoint does not match the config.
    """
    try:
        return run_dir.load_run(model_dir, checkpoint)
    except TrainingError as e:
        raise ConversionError(str(e)) from None


def prepare_output_dir(output_dir: str, outputs: Sequence[str], overwrite: bool, create: bool = True) -> None:
    """Creates `output_dir` (if `create`); refuses to replace any of `outputs` in it without `overwrite`.

    Only the named outputs are ever replaced (by the writer, later); nothing else in the directory
    is touched.

    Raises:
        ConversionError: an output already exists and `overwrite` is False.
    """
    existing = [name for name in outputs if os.path.exists(os.path.join(output_dir, name))]
    if existing and not overwrite:
        raise ConversionError(f"--output-dir {output_dir} already holds {', '.join(existing)}; "
                              "pass --overwrite to replace them")
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise ConversionError(f"--output-dir {output_dir} is a file, not a directory")
    if create:
        os.makedirs(output_dir, exist_ok=True)
