"""The pretraining run on TensorFlow: `run(config)` is what `run_pretraining.py` calls.

`Trainer` is `run.PretrainingRun`'s TensorFlow backend: the run (its phases, loop, checkpoint
cadence, stops, scalars and evaluation's verdict) is `run.PretrainingRun`'s; this module sets it up
and runs its chunks. The order, as the official `train_or_eval`:

1. Set up (`Trainer.__init__`): strategy (before any other op), the precision ("auto"
   resolved for this device: `electra_tf.precision`), vocab and dataset checks, then the run
   directory (`run_dir.prepare`: config.json written before step 0; an incompatible existing run
   is an error; `overwrite` deletes a previous run only after the checks pass), the model,
   optimizer and metrics under the strategy scope, and the start: the latest checkpoint,
   imported weights, or step 0 (`checkpointing`).
2. Train (`PretrainingRun.train`): run a compiled chunk of `iterations_per_loop` steps
   (`Trainer._train_chunk`: `train_step`), summarize it (TensorBoard and a console line, chief only: `summaries`),
   save a checkpoint every `save_checkpoints_steps` and at the end. A non-finite loss stops the
   run (`TrainingError`) without saving; SIGTERM stops it at the next step boundary after saving
   (`preemption`: `Preempted`, exit status 42).
3. Evaluate on the held-out split (`eval_results.txt`), export SavedModels (`export`).

A resumed run is bit-identical to an uninterrupted one: see `checkpointing` for what a
checkpoint holds and `inputs` for how each worker's data position is saved.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import time
from typing import Dict, Optional

import keras
import tensorflow as tf

from electra_tf import precision
from electra_tf.config import PretrainingConfig
from electra_tf.data.records import integrity
from electra_tf.errors import TrainingError, error_line
from electra_tf.pretraining.metrics import PretrainingMetrics
from electra_tf.training import (board, checkpoint_files, collapse, dataset_checks,
                                 frozen_generator, npz_checkpoint, observers as observers_lib,
                                 optimization, preemption, run_base, run_dir, summaries)
from electra_tf.training.pretrainer import ElectraPretrainer
from electra_tf.training.run import PretrainingRun
from electra_tf.training.tf import checkpointing, graph_leaks, inputs, train_step
from electra_tf.training.tf.strategy import get_strategy, is_chief
from electra_tf.vocab import Vocab

logger = logging.getLogger("electra_tf")


class Trainer(PretrainingRun):
    """The run on TensorFlow (`run.PretrainingRun`'s TensorFlow backend): holds the strategy,
    model, optimizer and checkpoint of one run; its chunk is a compiled `tf.function` loop
    (`train_step.make_train_loop`).

    Construction checks everything that can be wrong with the inputs (vocab, datasets, batch
    split, an existing run's compatibility) before anything is written, then builds the model
    under the strategy and restores the latest checkpoint if there is one.

    Args:
        config: a resolved PretrainingConfig.
        strategy: optional tf.distribute.Strategy; by default from `config.strategy`.
        overwrite: delete an existing run in `config.model_dir` first (after the checks pass);
            refuses a directory that is not a run (see `run_dir.remove_run`).
        profile_steps: int. Trace at least this many steps for TensorBoard's profiler
            (`board.Profiler`; 0: none).
        observers: optional `observers.ObserverFactory` (the pretraining command gives the
            learning probe's, `finetuning.probe.for_run`).

    Raises:
        TrainingError, DataError, VocabError, StrategyError: bad inputs, one-line messages.
    """

    def __init__(self, config: PretrainingConfig, strategy: Optional[tf.distribute.Strategy] = None,
                 overwrite: bool = False, profile_steps: int = 0,
                 observers: Optional[observers_lib.ObserverFactory] = None):
        run_base.check_keras_backend("tensorflow", "the TensorFlow trainer (--backend tensorflow)")
        self.config = config
        self.profile_steps = profile_steps
        self.strategy = strategy or get_strategy(config.strategy, config.tpu_name, config.tpu_zone,
                                                 config.gcp_project, config.inter_op_threads)
        self.chief = is_chief(self.strategy)
        # "auto" becomes this device's precision here; config.json records the outcome.
        self.precision = precision.choose(config.mixed_precision, self.strategy)
        self.config = config = dataclasses.replace(
            config, resolved_mixed_precision=self.precision.policy,
            resolved_mixed_precision_reason=self.precision.reason)
        # Every input is checked before anything is written or deleted.
        self.vocab = self._check_vocab_and_batches()
        self.dataset_summaries = dataset_checks.check_datasets(config, self.vocab)
        # The observer (the learning probe) reads its inputs now; the chief alone runs it.
        self.observer = (observers_lib.build(observers, config, self.vocab,
                                             observers_lib.BATCH_SIZE)
                         if self.chief else None)
        # One writer per run directory, from here until close() (or the process's end).
        self._lock = run_dir.lock(self._checkpoint_dir(), training=config.do_train)
        try:
            self._set_up(overwrite)
        except BaseException:
            self.close()
            raise

    def _set_up(self, overwrite: bool) -> None:
        config = self.config
        self._prepare_run_dir(overwrite)
        if self._lock is not None:  # only the lock holder may tell leftovers from live files
            checkpoint_files.remove_leftovers(self._checkpoint_dir(), os.path.join(
                config.model_dir, run_dir.EXPORT_DIR) if self.chief else None)
        self._build()
        # The data position is checkpointed with the model, so a resumed run continues the data
        # where it stopped; the dropout RNG states (non-trainable) too, so it draws the same masks.
        self.input_split = self.train_iterator = data_key = None
        if config.do_train:
            self.input_split = inputs.input_split(self.strategy, config.train_batch_size)
            data_key = inputs.train_data_key(config, self.input_split, self._record_plan("train"))
            self.train_iterator = self._make_train_iterator(config.seed)
        self.checkpointer = checkpointing.RunCheckpoint(
            self.model, self.optimizer, self._checkpoint_dir(), config.keep_checkpoint_max or None,
            self.train_iterator, data_key)
        self._train_loop = self._eval_loop = None  # tf.functions, traced on first use
        self.stop = preemption.StopRequest(self.strategy)  # SIGTERM, read before every step
        self.skipped_steps = 0  # non-finite steps skipped in this process
        # A discriminator stuck at the base rate: warned once, `disc_collapsed` per loop.
        self.collapse_guard = collapse.CollapseGuard.for_config(config, log=self.chief)
        self.restored_from = None
        self._start()
        if config.do_train and self._lock is not None:
            checkpoint_files.enforce_retention(self._checkpoint_dir(), self.restored_from,
                                               config.keep_checkpoint_max or None)
            # The manager read the state file before: give it the one listing what is on disk.
            self.checkpointer.track_data(self.train_iterator, self.checkpointer.data_key)

    # --- Set-up ------------------------------------------------------------------------------------
    def _check_vocab_and_batches(self) -> Vocab:
        return run_base.check_vocab_and_batches(self.config, self.strategy.num_replicas_in_sync,
                                                "replicas in sync")

    def _prepare_run_dir(self, overwrite: bool) -> None:
        config = self.config
        if overwrite and self.chief:
            run_dir.remove_run(config.model_dir)
        # An eval- or export-only run reads the run's checkpoint and leaves its config alone.
        write = self.chief and config.do_train
        run_dir.prepare(config, config.vocab_file, self.vocab.sha256, write=write)
        manifests = self.dataset_summaries.get("train", {}).get("manifests")
        if write and manifests:
            run_dir.copy_dataset_manifest(config.model_dir, manifests[0])

    def _build(self) -> None:
        config = self.config
        keras.mixed_precision.set_global_policy(self.precision.policy)
        keras.utils.set_random_seed(config.seed)  # weight init and dropout
        with self.strategy.scope():
            self.model = ElectraPretrainer.from_pretraining_config(config, self.vocab.special,
                                                                   self.vocab.tokens, self.vocab.kind)
            self.model.build_from_sequence_length()
            self.optimizer, self.schedule = optimization.create_optimizer(
                config, config.optimizer, generator_variables=self.model.generator_variables())
            if self.precision.policy == "mixed_float16":
                self.optimizer = keras.optimizers.LossScaleOptimizer(self.optimizer)
            self.optimizer.build(self.model.trainable_variables)
            self.metrics = PretrainingMetrics(electra_objective=config.electra_objective,
                                              disc_weight=config.disc_weight)

    def _start(self) -> None:
        """Restores the run's latest checkpoint, else imported weights, else starts at step 0."""
        config = self.config
        found = checkpoint_files.checkpoint_to_read(config.model_dir)
        if found is None and not config.do_train and self._read_portable():
            return
        if found is None and not config.do_train:
            raise TrainingError(f"no checkpoint in {config.model_dir} to "
                                f"{'evaluate' if config.do_eval else 'export'}: train first "
                                "(do_train) or check --data-dir / --model-name")
        if found is not None and found.imported:
            self.checkpointer.restore_imported(found.path)
            self.restored_from = found.path
            logger.info("initialised from the imported checkpoint %s (step %d, fresh optimizer)",
                        found.path, self.step)
        elif found is not None:
            self._restore(found.path)
        if config.two_stage_generator_dir or config.frozen_generator_dir:
            frozen_generator.start(self.model, config, self.vocab.tokens, fresh=found is None)

    def _read_portable(self) -> bool:
        """Evaluation / export of a `--backend jax|torch` run: reads its newest `ckpt-N.npz`
        (the model and step). Returns False if it has none."""
        path = npz_checkpoint.latest_good(self.config.model_dir)
        if path is None:
            return False
        saved = npz_checkpoint.restore(path, self.model, None)
        self.optimizer.iterations.assign(saved.step)
        self.restored_from = path
        logger.info("read %s (step %d), a checkpoint of the %s backend", path, saved.step,
                    npz_checkpoint.read_meta(path).get("backend", "jax or torch"))
        return True

    def _restore(self, latest: str) -> None:
        """Restores the chief's `latest` checkpoint. A non-chief worker restores its own of the
        same step (its data position); without one (killed between the two saves) it takes the
        chief's weights and restarts its data."""
        path, own_data = latest, True
        if not self.chief:
            own = checkpoint_files.latest_good_checkpoint(
                self._checkpoint_dir(), at_step=checkpoint_files.checkpoint_number(latest))
            path, own_data = (own, True) if own is not None else (latest, False)
        same_data = self.checkpointer.restore(path, own_data)
        self.restored_from = path
        if self.train_iterator is not None and not same_data:
            # The saved position belongs to another pipeline (batch size, shards or seed changed,
            # or another worker's): read the data afresh, in an order that does not replay the
            # first steps' batches.
            logger.warning("%s holds no data position for this pipeline (batch size, shards, seed "
                           "or worker changed): the data order restarts, reshuffled for step %d",
                           path, self.step)
            self.train_iterator = self._make_train_iterator(self.config.seed + self.step)
            self.checkpointer.track_data(self.train_iterator, self.checkpointer.data_key)
        logger.info("restored %s (step %d)", path, self.step)

    def _make_train_iterator(self, seed: int):
        return inputs.train_iterator(self.config, self.input_split, seed, self._record_plan("train"))

    def _record_plan(self, split: str) -> Optional[dict]:
        return dataset_checks.record_plan(self.dataset_summaries, split)

    def _checkpoint_dir(self) -> str:
        if self.chief:
            return self.config.model_dir
        # Every worker saves (the save is collective). A non-chief keeps its own checkpoints (same
        # weights, but its own data position) in a private directory, to resume exactly.
        return run_dir.worker_checkpoint_dir(self.config.model_dir,
                                             self.strategy.cluster_resolver.task_id)

    # --- State -------------------------------------------------------------------------------------
    @property
    def step(self) -> int:
        return int(self.optimizer.iterations.numpy())

    @property
    def manager(self) -> tf.train.CheckpointManager:
        return self.checkpointer.manager

    @property
    def latest(self) -> Optional[str]:
        return self.checkpointer.latest

    def _saved_at_step(self) -> bool:
        latest = self.checkpointer.latest
        return latest is not None and checkpoint_files.checkpoint_number(latest) == self.step

    # --- Training ----------------------------------------------------------------------------------
    def _open_writer(self) -> summaries.ScalarWriter:
        return (summaries.TfEventWriter(self.config.model_dir) if self.chief
                else summaries.NullWriter())

    def _write_run_info(self, writer, start_step: int) -> None:
        board.write_run_info(getattr(writer, "summary_writer", None), self.config, start_step)
        self._profiler = board.Profiler(self.config.model_dir, self.profile_steps, self.chief)

    def _describe(self) -> str:
        return f"{self.strategy.num_replicas_in_sync} replica(s)"

    def _before_chunk(self) -> None:
        self._profiler.before_loop(self.step)

    def _after_chunk(self) -> None:
        self._profiler.after_loop(self.step)

    def _end_training(self) -> None:
        profiler = getattr(self, "_profiler", None)
        if profiler is not None:
            profiler.stop(self.step)

    def train_loop(self):
        """The compiled loop `train()` runs, `(iterator, num_steps) -> (done, history)`
        (`train_step.make_train_loop`); traced once per Trainer, reused by later calls."""
        if self._train_loop is None:
            self._train_loop = train_step.make_train_loop(self._step_context())
        return self._train_loop

    def _step_context(self) -> train_step.StepContext:
        return train_step.make_step_context(
            self.model, self.optimizer, self.schedule, self.metrics, self.strategy, self.config,
            functools.partial(inputs.replica_slice, split=self.input_split), stop=self.stop)

    def _train_chunk(self, num_steps: int) -> Dict[str, float]:
        """Runs one compiled chunk; checks it; returns its scalars (`summaries.loop_scalars`)."""
        config, step = self.config, self.step
        self.metrics.reset_state()
        t0 = time.time()
        try:
            done, history = self.train_loop()(self.train_iterator, tf.constant(num_steps))
        except tf.errors.DataLossError as e:
            # tf.data's message has an offset but no file name: find the file.
            found = integrity.find_bad_file(config.pretrain_tfrecords, config.max_seq_length)
            raise TrainingError(
                f"a training record failed to read at step {self.step}: "
                f"{found or error_line(e, limit=200)}. Training stopped; the last good checkpoint "
                f"is {self.checkpointer.latest}") from None
        done = int(done)
        if done == 0:  # a stop was agreed before the first step
            return {}
        history = {k: v.numpy() for k, v in history.items()}
        elapsed = time.time() - t0
        limit = config.max_skipped_nonfinite_steps
        self.skipped_steps = train_step.count_skipped(history, step, self.skipped_steps, limit)
        train_step.check_history(
            history, step, self.skipped_steps, limit,
            isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer), self.checkpointer.latest)
        scalars = summaries.loop_scalars(history, self.metrics.result(), done, elapsed,
                                         config.train_batch_size)
        return self._chunk_scalars(
            scalars, self.skipped_steps,
            self.dataset_summaries.get("train", {}).get("skipped_records"))

    def _save(self) -> None:
        path = self.checkpointer.save(self.step)
        if self.chief:
            logger.info("saved checkpoint %s", path)

    # --- Evaluation --------------------------------------------------------------------------------
    def _evaluate_batches(self) -> Dict[str, float]:
        config = self.config
        dataset = inputs.distributed_dataset(self.strategy, config, config.eval_tfrecords,
                                             config.eval_batch_size, is_training=False,
                                             plan=self._record_plan("eval"))
        self.metrics.reset_state()
        if self._eval_loop is None:
            self._eval_loop = train_step.make_eval_loop(self.model, self.metrics, self.strategy,
                                                        config.seed, stop=self.stop)
        with self.stop:  # SIGTERM: the loop stops before its next batch
            loss = float(self._eval_loop(iter(dataset), tf.constant(config.num_eval_steps)))
        if self.stop.requested:
            raise self.preempted("during the evaluation", "evaluate (no eval results were "
                                                          "written)")
        results = {k: float(v) for k, v in self.metrics.result().items()}
        results["loss"] = loss
        return results

    def _write_eval_results(self, results: Dict[str, float], note) -> None:
        if self.chief:
            summaries.write_eval_results(self.config.model_dir, self.step, results, note=note)

    def _export(self) -> Optional[dict]:
        """The SavedModels (chief only; `export.export_all`)."""
        if not self.chief:
            return None
        # lazy: it imports tensorflow_text, needed only when exporting
        from electra_tf.training.tf import export

        try:
            return export.export_all(self.model, self.vocab, self.config, self.step)
        except preemption.Interrupted:  # the staging directory is already removed
            raise self.preempted("during the export", "export") from None


def run(config: PretrainingConfig, strategy: Optional[tf.distribute.Strategy] = None,
        overwrite: bool = False, profile_steps: int = 0,
        observers: Optional[observers_lib.ObserverFactory] = None) -> dict:
    """Trains, evaluates and exports as the config says.

    Args:
        config: a resolved PretrainingConfig.
        strategy: optional strategy (default: from `config.strategy`).
        overwrite: delete an existing run first (see `Trainer`).
        profile_steps: int. Steps to trace for TensorBoard's profiler (see `Trainer`).
        observers: optional observer factory (see `Trainer`).

    Returns:
        {"train": last loop's scalars, "probe": the observer's results (`RunObserver.results`,
         with the `probe` hparam), "eval": eval results, "export": SavedModel paths,
         "final": {"global_step", "checkpoint", "weights_sha256"}}, for the phases that ran.
    """
    # The run's traced graphs go with it (graph_leaks: TensorFlow's custom-gradient registry
    # would keep them for the life of the process).
    # SIGTERM is watched from here: one received while the trainer is set up stops it at the
    # first step boundary (preemption.SigtermWatch), instead of killing the process.
    with preemption.SigtermWatch(), graph_leaks.custom_gradients_released(), \
            Trainer(config, strategy, overwrite=overwrite, profile_steps=profile_steps,
                    observers=observers) as trainer:
        return trainer.run_phases()
