"""One pretraining run on any backend: `PretrainingRun` owns the run, its backend runs the steps.

What the run owns, the same on every backend (this module):

1. The phases (`run_phases`): train, the observer's results, evaluate, export, the final line.
2. The loop (`train`): from the current step to `num_train_steps` in chunks of
   `iterations_per_loop` steps that end at every checkpoint (`_chunk_size`); after each chunk
   the TensorBoard scalars (`summaries.write_scalars`) and the progress line (chief), the
   observer (the learning probe, `observers`), then a stop (SIGTERM: save, `Preempted`, exit
   status 42) or a checkpoint when one is due. A fresh run saves step 0 before its first chunk.
3. The chunk's scalars (`_chunk_scalars`: the backend's losses and metrics, the sampling
   temperature, skipped steps and records, the collapse guard), the evaluation's verdict and
   files (`evaluate`), the weights' fingerprint and the words of a stop.

What a backend defines (its subclass, in its folder: TensorFlow's `training/tf/trainer.Trainer`,
JAX / PyTorch's `training/portable/trainer.PortableTrainer`), the backend interface; the methods
are abstract here, so a backend that lacks one cannot be built:

    set-up            config, vocab, model, observer, collapse_guard, restored_from, chief
                      (this process writes the run directory), stop (the SIGTERM request)
    step              the optimizer's step counter
    latest            the newest checkpoint this process saved or restored (None: none)
    _saved_at_step()  whether `latest` is this step's checkpoint
    _open_writer()    a `summaries.ScalarWriter` of the run's events (a null one off the chief)
    _write_run_info   the hparams plugin and the config text at the first step trained
    _describe()       the backend's words in the "training from step" line (devices, precision)
    _train_chunk(n)   runs n steps (fewer on a stop): the chunk's scalars, {} when none ran
    _before_chunk, _after_chunk, _end_training
                      hooks around chunks (the profiler; the hosts' stop agreement)
    _save()           a checkpoint of this step (with the data position)
    _evaluate_batches()  the held-out split's metrics (raises `Preempted` on a stop)
    _write_eval_results(results, note)
    _export()         the export phase (a SavedModel needs TensorFlow)
    model_variables() the model's variables in their fixed order

What each backend can run is one table (`capabilities`), checked before anything is written.
Subclasses rather than a backend object held by the run, as Keras composes its `Model` from a
backend's `Trainer` class: the backend's state (model, strategy, checkpoint manager) and the
run's are one object that the tests, the probe and the pretraining command hold.
"""

from __future__ import annotations

import abc
import logging
import time
from typing import Dict, List, Optional

from electra_tf.errors import Preempted
from electra_tf.training import run_base, summaries

logger = logging.getLogger("electra_tf")


class PretrainingRun(abc.ABC):
    """The run of one `PretrainingConfig`: its loop, checkpoints' cadence, stops, evaluation and
    phases over a backend's steps (see the module docstring for the backend interface).

    A run holds its run directory's lock (`_lock`) until `close()` or the block's end.
    """

    _lock = None
    _schedule_checked = False
    observer = None
    restored_from: Optional[str] = None

    # --- The phases --------------------------------------------------------------------------------
    def run_phases(self) -> dict:
        """Trains, evaluates and exports as the config says.

        Returns:
            {"train": last chunk's scalars, "probe": the observer's results, "eval": eval
             results, "export": the export's result, "final": {"global_step", "checkpoint",
             "weights_sha256"}}, for the phases that ran.
        """
        config = self.config
        results = {}
        with self.stop:  # SIGTERM in any phase below: Preempted (exit status 42)
            if config.do_train:
                results["train"] = self.train()
            if self.observer is not None:
                results["probe"] = self.observer.results()
            if config.do_eval:
                results["eval"] = self.evaluate()
            if config.do_export:
                exported = self._export()
                if exported is not None:
                    results["export"] = exported
        results["final"] = {"global_step": self.step, "checkpoint": self.latest,
                            "weights_sha256": self.weights_fingerprint()}
        logger.info("final: step %d, checkpoint %s, weights sha256 %s", self.step,
                    results["final"]["checkpoint"], results["final"]["weights_sha256"])
        return results

    # --- Training ----------------------------------------------------------------------------------
    def train(self, stop_at_step: Optional[int] = None) -> Dict[str, float]:
        """Trains to `num_train_steps` (or `stop_at_step`, for tests and staged runs), resuming
        from the current step. Returns the last chunk's scalars."""
        config = self.config
        start_step = self.step
        end_step = min(config.num_train_steps, stop_at_step or config.num_train_steps)
        if start_step >= end_step:
            logger.info("already at step %d >= num_train_steps %d: nothing to train", start_step,
                        config.num_train_steps)
            return {}
        if not self._schedule_checked:  # once per run, whatever the number of train() calls
            self._schedule_checked = True
            run_base.warn_about_schedule(config)
        with self.stop:  # SIGTERM: stop before the next step, save, raise Preempted
            return self._train_steps(start_step, end_step)

    def _train_steps(self, start_step: int, end_step: int) -> Dict[str, float]:
        config = self.config
        writer = self._open_writer()
        scalars: Dict[str, float] = {}
        run_start = time.time()
        try:
            self._write_run_info(writer, start_step)  # hparams plugin, config text
            if start_step == 0:
                self._save()  # step-0 checkpoint: a crash in the first chunk loses nothing
            self._before_training()
            self._observe(writer, start_step, end_step)  # step 0: the untrained baseline
            logger.info("training from step %d to %d (global batch %d, %s)", start_step,
                        config.num_train_steps, config.train_batch_size, self._describe())
            run_start = time.time()
            while self.step < end_step:
                self._before_chunk()
                previous_step = self.step
                chunk = self._train_chunk(self._chunk_size(end_step))
                self._after_chunk()
                if chunk:  # empty when stopped before its first step
                    scalars = chunk
                    summaries.write_scalars(writer, self.step, scalars)
                    if self.chief:
                        rate = (self.step - start_step) / max(time.time() - run_start, 1e-9)
                        summaries.log_progress(self.step, config.num_train_steps, scalars, rate)
                self._observe(writer, previous_step, end_step)
                self._stop_or_save(end_step)
        finally:
            self._end_training()
            writer.close()
        if self.chief:
            self._log_done(start_step, time.time() - run_start, scalars)
        return scalars

    def _chunk_size(self, end_step: int) -> int:
        """Steps of the next chunk: up to the next checkpoint, the end, or the loop size."""
        step, every = self.step, self.config.save_checkpoints_steps
        return min(self.config.iterations_per_loop, every - step % every, end_step - step)

    def _chunk_scalars(self, scalars: Dict[str, float], skipped_steps: Optional[int] = None,
                       skipped_records: Optional[int] = None) -> Dict[str, float]:
        """What every backend adds to a chunk's scalars (`summaries.chunk_scalars`): the sampling
        temperature, the non-finite steps skipped (with `max_skipped_nonfinite_steps`) and the
        records skipped (with `skip_bad_records`); then the collapse guard sees them."""
        summaries.add_sampling_temperature(scalars, self.model, self.step)
        if self.config.max_skipped_nonfinite_steps and skipped_steps is not None:
            scalars["skipped_steps"] = float(skipped_steps)
        if self.config.skip_bad_records and skipped_records is not None:
            scalars["skipped_records"] = float(skipped_records)
        self.collapse_guard.observe(self.step, scalars)
        return scalars

    def _observe(self, writer, previous_step: int, end_step: int) -> None:
        """The observer's scalars at this step (the learning probe's when due), beside the
        losses; not while a stop is under way."""
        if self.observer is not None and not self.stop.requested:
            summaries.write_scalars(writer, self.step, self.observer.observe(
                previous_step, self.step, end_step, self.model.discriminator))

    def _stop_or_save(self, end_step: int) -> None:
        """After a chunk: stop (saving) if SIGTERM asked, else save when a checkpoint is due."""
        if self.stop.requested:
            self._stop_preempted()
        if self.step % self.config.save_checkpoints_steps == 0 or self.step >= end_step:
            self._save()

    def _stop_preempted(self) -> None:
        """Saves the current step (unless just saved) and raises Preempted."""
        if not self._saved_at_step():
            self._save()
        raise Preempted(f"stopped by SIGTERM at step {self.step} of {self.config.num_train_steps}; "
                        f"saved {self.latest}. Rerun the same command to resume")

    def _log_done(self, start_step: int, elapsed: float, scalars: Dict[str, float]) -> None:
        losses = (f"; last loop: loss {scalars['total_loss']:.4f} mlm "
                  f"{scalars['masked_lm_loss']:.4f} disc {scalars['disc_loss']:.4f}"
                  if scalars else "")
        logger.info("training done: steps %d-%d in %s (%.1f ex/s incl. compilation)%s; "
                    "checkpoint %s", start_step, self.step, summaries.format_seconds(elapsed),
                    (self.step - start_step) * self.config.train_batch_size / max(elapsed, 1e-9),
                    losses, self.latest)

    # --- Evaluation --------------------------------------------------------------------------------
    def evaluate(self) -> Dict[str, float]:
        """Runs `num_eval_steps` batches of the held-out split in eval mode (no dropout).

        Writes `eval_results.txt` (sorted `name = value` lines, the official printout) and
        TensorBoard scalars under `model_dir/eval`, with the collapse guard's `disc_collapsed`
        (`collapse.CollapseGuard.judge_eval`) and its line on a base-rate discriminator.
        """
        results = self._evaluate_batches()
        results["global_step"] = self.step
        note = self.collapse_guard.judge_eval(self.step, results)  # adds disc_collapsed
        self._write_eval_results(results, note)
        return results

    # --- State -------------------------------------------------------------------------------------
    def weights_fingerprint(self) -> str:
        """sha256 of the model's variables (trainable, then the rest incl. dropout RNG states),
        in the model's fixed order: equal weights, equal fingerprints, on every backend."""
        return run_base.weights_fingerprint(self.model_variables())

    def model_variables(self) -> List:
        return list(self.model.trainable_variables) + list(self.model.non_trainable_variables)

    def preempted(self, during: str, rerun: str) -> Preempted:
        """The stop of a phase other than training: nothing of the run is lost."""
        return run_base.preempted(self.step, self.latest or self.restored_from, during, rerun)

    # --- The backend interface (module docstring) ------------------------------------------------
    @property
    @abc.abstractmethod
    def step(self) -> int:
        """The optimizer's step counter."""

    @abc.abstractmethod
    def _saved_at_step(self) -> bool:
        """Whether this step's checkpoint is written."""

    @abc.abstractmethod
    def _open_writer(self) -> summaries.ScalarWriter:
        """The run's TensorBoard scalar writer (a null one off the chief)."""

    @abc.abstractmethod
    def _write_run_info(self, writer, start_step: int) -> None:
        """The hparams plugin and the config text, at the first step trained."""

    @abc.abstractmethod
    def _describe(self) -> str:
        """The backend's part of the "training from step" line."""

    @abc.abstractmethod
    def _train_chunk(self, num_steps: int) -> Dict[str, float]:
        """Runs `num_steps` steps (fewer on a stop); the chunk's scalars, {} when none ran."""

    @abc.abstractmethod
    def _save(self) -> None:
        """A checkpoint of this step, with the data position; sets `latest`."""

    @abc.abstractmethod
    def _evaluate_batches(self) -> Dict[str, float]:
        """The held-out split's metrics over `num_eval_steps` batches."""

    @abc.abstractmethod
    def _write_eval_results(self, results: Dict[str, float], note) -> None:
        """eval_results.txt and the eval scalars (chief only)."""

    @abc.abstractmethod
    def _export(self) -> Optional[dict]:
        """The export phase: its result, or None when nothing was exported."""

    # --- Hooks a backend may override --------------------------------------------------------------
    def _before_training(self) -> None:
        """After the step-0 save, before the first chunk."""

    def _before_chunk(self) -> None:
        """Before each chunk."""

    def _after_chunk(self) -> None:
        """After each chunk, before its scalars are written."""

    def _end_training(self) -> None:
        """When the loop ends (normally or not)."""

    def close(self) -> None:
        """Releases the run directory's lock (idempotent; the process's exit does too)."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
