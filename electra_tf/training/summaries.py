"""What a run reports: per-loop scalars, TensorBoard, the console line, eval results.

Only the chief writes (TensorBoard events in the run directory, `eval/` for evaluation,
`eval_results.txt`) and logs progress; every worker computes the same scalars.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Dict, Optional, Protocol

import numpy as np

from electra_tf import atomic
from electra_tf.errors import TrainingError, error_line, shown_path
from electra_tf.progress import format_duration
from electra_tf.training import collapse, run_dir

logger = logging.getLogger("electra_tf")


def loop_scalars(history: Dict[str, np.ndarray], metric_results: dict, done: int,
                 elapsed: float, global_batch: int) -> Dict[str, float]:
    """The scalars of one compiled TensorFlow loop from its per-step history (`chunk_scalars`
    over the steps it applied).

    Args:
        history: the loop's per-step values (`train_step.HISTORY_KEYS`, numpy).
        metric_results: `PretrainingMetrics.result()` over the loop's applied steps.
        done: int. Steps the loop ran (applied or skipped).
        elapsed: float. Wall-clock seconds of the loop.
        global_batch: int. Examples per step.
    """
    applied = history["skipped"] == 0  # the loop's scalars cover applied steps only
    terms = {k: float(history[k][applied].mean()) if applied.any() else float("nan")
             for k in ("total_loss", "masked_lm_loss", "disc_loss", "grad_norm")}
    # The rate of the loop's last update, lr(step - 1) at summary step `step`.
    return chunk_scalars(terms, float(history["learning_rate"][-1]), metric_results, done,
                         elapsed, global_batch, float(history["tokens"].sum()))


def chunk_scalars(terms: Dict[str, float], learning_rate: float, metric_results: dict,
                  done: int, elapsed: float, global_batch: int,
                  tokens: float) -> Dict[str, float]:
    """The scalars of one chunk of training steps, on every backend.

    Args:
        terms: {total_loss, masked_lm_loss, disc_loss, grad_norm}: the chunk's means of each
            step's value (not the official metrics of the same names, which are per-slot /
            per-sequence means: those give the other keys).
        learning_rate: float. The rate of the chunk's last update, lr(step - 1) at summary step
            `step`.
        metric_results: {name: value}: the official metrics over the chunk (and anything else
            the backend reports); `masked_lm_loss` and `disc_loss` there are left out.
        done: int. Steps the chunk ran.
        elapsed: float. Wall-clock seconds of the chunk.
        global_batch: int. Examples per step.
        tokens: float. Real (unpadded) tokens the chunk read, every host's.

    Returns:
        {name: float}: the terms, `learning_rate`, the metrics, `examples_per_second`,
        `tokens_per_second`.
    """
    scalars = {k: float(v) for k, v in terms.items()}
    scalars["learning_rate"] = float(learning_rate)
    scalars.update({k: float(v) for k, v in metric_results.items()
                    if k not in ("masked_lm_loss", "disc_loss") and k not in terms})
    scalars["examples_per_second"] = done * global_batch / elapsed
    scalars["tokens_per_second"] = float(tokens) / elapsed
    return scalars


def add_sampling_temperature(scalars: Dict[str, float], model, step: int) -> None:
    """With a temperature curriculum (`temperature_start`): `temperature`, what the loop's last
    step (global step `step` - 1) sampled at, beside its `learning_rate`."""
    if getattr(model, "temperature_start", None) is None:
        return
    from keras import ops

    scalars["temperature"] = float(ops.convert_to_numpy(model.sampling_temperature(step - 1)))


class ScalarWriter(Protocol):
    """A run's TensorBoard events as the run writes them, on every backend (TensorFlow:
    `TfEventWriter`; without TensorFlow: `portable_board.EventWriter`; off the chief:
    `NullWriter`)."""

    def scalars(self, step: int, values: Dict[str, float]) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


class NullWriter:
    """A `ScalarWriter` that writes nothing: a process other than the run's writer (the chief,
    host 0), on every backend."""

    def _add(self, step: int, summary) -> None:
        pass

    def scalars(self, step: int, values: Dict[str, float]) -> None:
        pass

    def text(self, tag: str, step: int, body: str) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


class TfEventWriter:
    """TensorFlow's summary writer as a `ScalarWriter` (its `summary_writer` for the hparams
    plugin and the config text: `board.write_run_info`)."""

    def __init__(self, directory: str):
        import tensorflow as tf

        self.summary_writer = tf.summary.create_file_writer(directory)

    def scalars(self, step: int, values: Dict[str, float]) -> None:
        import tensorflow as tf

        with self.summary_writer.as_default(step=step):
            for name, value in values.items():
                tf.summary.scalar(name, value)

    def flush(self) -> None:
        self.summary_writer.flush()

    def close(self) -> None:
        self.summary_writer.close()


def write_scalars(writer: ScalarWriter, step: int, scalars: Dict[str, float]) -> None:
    """TensorBoard scalars at `step`, flushed (nothing for none).

    Raises:
        TrainingError: the events cannot be written (a full disk).
    """
    if not scalars:
        return
    try:
        writer.scalars(step, scalars)
        writer.flush()
    except (OSError,) + _tf_errors() as e:  # a full disk
        raise TrainingError(f"cannot write the TensorBoard events at step {step} "
                            f"({error_line(e)}): training stopped; free space and rerun to "
                            "resume from the last checkpoint") from None


def log_progress(step: int, num_train_steps: int, scalars: Dict[str, float],
                 steps_per_second: float) -> None:
    """The console line after each loop: step, losses, rate, throughput, time left."""
    eta = (num_train_steps - step) / steps_per_second if steps_per_second > 0 else float("inf")
    logger.info(
        "step %d/%d (%.1f%%) loss %.4f mlm %.4f disc %.4f lr %.3g | %.1f ex/s %.0f tok/s | ETA %s",
        step, num_train_steps, 100.0 * step / num_train_steps,
        scalars["total_loss"], scalars["masked_lm_loss"], scalars["disc_loss"],
        scalars["learning_rate"], scalars["examples_per_second"],
        scalars["tokens_per_second"], format_seconds(eta))


def write_eval_results(model_dir: str, step: int, results: Dict[str, float],
                       event_writer=None, note: Optional[collapse.EvalNote] = None) -> None:
    """A log line (and `note`'s below it), then `eval_results.txt` (sorted `name = value` lines,
    the official printout) and TensorBoard scalars under `eval/`.

    Args:
        model_dir: str. The run directory.
        step: int. The step evaluated.
        results: {name: value}, `global_step` included.
        event_writer: optional callable (directory, step, {name: value}) writing the scalars
            (`portable_board.write_scalars` on backends without TensorFlow); by default
            TensorFlow's summary writer.
        note: optional `collapse.EvalNote`, what the collapse guard says of these results
            (`CollapseGuard.judge_eval`), logged at its level.

    Raises:
        TrainingError: the files cannot be written (a read-only model dir, a full disk); the
            message carries the results, so the computed metrics are never lost.
    """
    shown = ", ".join(f"{k} {results[k]:.4f}" for k in sorted(results) if k != "global_step")
    logger.info("eval at step %d: %s", step, shown)
    if note is not None:
        logger.log(note.level, "%s", note.text)
    path = os.path.join(model_dir, run_dir.EVAL_RESULTS_NAME)
    scalars = {k: v for k, v in results.items() if k != "global_step"}
    errors = (OSError,) + _tf_errors()
    try:
        atomic.write_text(path, "".join(f"{key} = {results[key]}\n" for key in sorted(results)))
        (event_writer or _tf_write_scalars)(os.path.join(model_dir, run_dir.EVAL_SUMMARY_DIR),
                                            step, scalars)
    except errors as e:
        raise TrainingError(f"cannot write the eval results {shown_path(path)} "
                            f"({error_line(e)}); the results at step {step}: {shown}") from None


def _tf_write_scalars(directory: str, step: int, scalars: Dict[str, float]) -> None:
    import tensorflow as tf

    writer = tf.summary.create_file_writer(directory)
    with writer.as_default(step=step):
        for key, value in scalars.items():
            tf.summary.scalar(key, value)
    writer.close()


def _tf_errors() -> tuple:
    """TensorFlow's I/O error class when TensorFlow is in use (a run without it has none)."""
    tf = sys.modules.get("tensorflow")
    return (tf.errors.OpError,) if tf is not None else ()


format_seconds = format_duration  # `1h02m03s`, or `?` for an unknown duration
