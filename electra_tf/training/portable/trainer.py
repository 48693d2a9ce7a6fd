"""The pretraining run on the JAX or PyTorch backend: `run(config)` for `--backend jax|torch`.

`PortableTrainer` is `run.PretrainingRun`'s backend for both: the run's loop, checkpoint cadence,
stops, scalars and evaluation's verdict are `run.PretrainingRun`'s; this module sets the run up
and runs its chunks (one `fit()` call each).

The TensorFlow trainer (`trainer`) is the default and the fidelity reference; this one runs the
same model, objective, optimizer and step (`ElectraPretrainer.fit`, `portable_fit`) where
TensorFlow is absent (a TPU VM or a GPU box with JAX or PyTorch), with the same command line,
hparams and run directory:

1. Set up: what these backends cannot run refused (`portable_support`, `capabilities`), the
   distribution (JAX: `keras.distribution.DataParallel` over every local device when there are
   several, so the global batch is split as the TensorFlow path splits it over replicas; with
   strategy multi_worker, over every device of several hosts, each reading its part of the
   global batch: `hosts`), the precision ("auto" resolved for this device; no
   mixed_float16, whose loss scaling this step does not do), vocab and dataset checks, the run
   directory (config.json, the lock), the model and optimizer, then the start: the latest
   `ckpt-N.npz` (`npz_checkpoint`; the same on every host, with the reader's position when
   its data key matches: `portable_resume`), else the weights and step `from-google` imported
   (`init_checkpoint/ckpt-0.npz`, fresh optimizer), or step 0; at step 0 a frozen generator's
   source (`two_stage_generator_dir`, `frozen_generator_dir`: a JAX / PyTorch run) is copied in
   (`frozen_generator`).
2. Train: chunks of `iterations_per_loop` steps, each one `fit()` call over the TensorFlow-free
   reader's batches (`data.record_reader.BatchReader`: the TensorFlow pipeline's examples in its
   order, decoded ahead in a thread), `steps_per_execution` steps per compiled call on JAX
   (`portable_support.steps_per_execution`: it divides the loop and the checkpoint interval, so
   they end at a call's end); after each chunk the TensorBoard scalars (TensorBoard's own
   writer: `portable_board`) and the progress line; a checkpoint every
   `save_checkpoints_steps` and at the end. A non-finite loss stops the run without saving;
   with `max_skipped_nonfinite_steps` such a step is skipped instead (no update, its batch
   consumed, `skipped_steps` counted) and more than that many in one process stop the run.
   SIGTERM stops it at the end of a call (at most `steps_per_execution` steps after the signal,
   plus the calls already dispatched), saves, and raises `Preempted` (exit status 42).
3. Evaluate on the held-out split (`eval_results.txt`, `eval/` scalars).

A checkpoint holds the weights (dropout and sampling seed states included), the optimizer (its
step counter is the step seed) and the reader's position (every host's, under several hosts),
so a resumed run equals an uninterrupted one bit for bit. Under several hosts host 0 alone
writes the run directory and the hosts agree on a stop after every chunk (`hosts`). The
SavedModel export needs TensorFlow: on a machine with it the TensorFlow trainer evaluates and
exports such a run (do_train false), and the converters read it.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
import warnings
from typing import Dict, List, Optional

import keras

from electra_tf import atomic, precision
from electra_tf.config import PretrainingConfig
from electra_tf.data.records.record_reader import BatchReader
from electra_tf.errors import TrainingError
from electra_tf.modeling import deferred_init
from electra_tf.training import (board, collapse, dataset_checks, frozen_generator, npz_checkpoint,
                                 observers as observers_lib, optimization, preemption, run_base,
                                 run_dir, summaries)
from electra_tf.training.portable import (board as portable_board, hosts, resume as portable_resume,
                                          support as portable_support)
from electra_tf.training.pretrainer import ElectraPretrainer
from electra_tf.training.run import PretrainingRun
from electra_tf.vocab import Vocab

logger = logging.getLogger("electra_tf")

class PortableTrainer(PretrainingRun):
    """The run on JAX or PyTorch (`run.PretrainingRun`'s backend for both): holds the model,
    optimizer, reader and checkpoints of one run; its chunk is one `fit()` call.

    Args:
        config: a resolved PretrainingConfig with `backend` "jax" or "torch".
        overwrite: delete an existing run in `config.model_dir` first (after the checks pass).

    Raises:
        TrainingError, DataError, VocabError: bad inputs, one-line messages.
    """

    def __init__(self, config: PretrainingConfig, overwrite: bool = False,
                 observers: Optional[observers_lib.ObserverFactory] = None,
                 profile_steps: int = 0):
        portable_support.check_supported(config, profile_steps)
        self._observers = observers
        self.profile_steps = profile_steps
        self.hosts = hosts.join(config)
        self.reader: Optional[BatchReader] = None
        try:
            with hosts.all_or_none(self.hosts, "checking the inputs"):
                self._check(config)
            with hosts.all_or_none(self.hosts, "preparing the run directory"):
                if self.hosts.writer:  # one writer of the run directory
                    self._lock = run_dir.lock(self.config.model_dir,
                                              training=self.config.do_train)
                    self._prepare(overwrite)
            with hosts.all_or_none(self.hosts, "setting up"):
                self._set_up()
        except BaseException:
            self.close()
            raise

    def _check(self, config: PretrainingConfig) -> None:
        if self.hosts.several:
            self.devices = hosts.global_devices()
        else:
            self.devices = (portable_support.local_devices() if config.strategy != "one_device"
                            else [])
        facts = precision.detect_keras_backend(config.backend)
        self.precision = precision.choose(config.mixed_precision,
                                          allowed=portable_support.PORTABLE_POLICIES, facts=facts)
        self.config = config = dataclasses.replace(
            config, resolved_mixed_precision=self.precision.policy,
            resolved_mixed_precision_reason=self.precision.reason)
        self.vocab = self._check_vocab_and_batches()
        self.dataset_summaries = dataset_checks.check_datasets(config, self.vocab)
        # The observer (the learning probe) reads its inputs now (host 0 runs it).
        self.observer = observers_lib.build(self._observers, config, self.vocab,
                                            observers_lib.BATCH_SIZE * self.num_devices,
                                            several_hosts=self.hosts.several)

    @property
    def num_devices(self) -> int:
        return max(1, len(self.devices))

    def _check_vocab_and_batches(self) -> Vocab:
        return run_base.check_vocab_and_batches(self.config, self.num_devices,
                                                "devices data-parallel")

    def _prepare(self, overwrite: bool) -> None:
        """The run directory: removed first with --overwrite, config.json and vocab written or
        checked, the dataset manifest kept, interrupted writes cleaned (host 0 only)."""
        config = self.config
        if overwrite:
            run_dir.remove_run(config.model_dir)
        run_dir.prepare(config, config.vocab_file, self.vocab.sha256, write=config.do_train)
        manifests = self.dataset_summaries.get("train", {}).get("manifests")
        if config.do_train and manifests:
            run_dir.copy_dataset_manifest(config.model_dir, manifests[0])
        if self._lock is not None:
            for leftover in atomic.remove_temporaries(config.model_dir):
                logger.info("removed %s (a write interrupted before)", leftover)

    def _set_up(self) -> None:
        self.chief = self.hosts.writer  # host 0 writes the run directory and logs the progress
        self._build()
        self.stop = (hosts.HostsStop(self.hosts) if self.hosts.several
                     else preemption.HostStop())
        self.data_key = portable_resume.data_key(
            self.config, dataset_checks.record_plan(self.dataset_summaries, "train"), self.hosts)
        self.latest: Optional[str] = None
        self.restored_from: Optional[str] = None
        self.skipped_steps = 0  # non-finite steps skipped in this process (as TensorFlow's)
        # A discriminator stuck at the base rate: warned once (host 0), `disc_collapsed` per loop.
        self.collapse_guard = collapse.CollapseGuard.for_config(self.config,
                                                                log=self.hosts.writer)
        self._start()

    def _build(self) -> None:
        config = self.config
        if len(self.devices) > 1:
            # Several hosts: each reader yields its host's part already (`hosts`), which Keras
            # assembles into the global batch; its auto-sharding is for tf.data only.
            keras.distribution.set_distribution(keras.distribution.DataParallel(
                devices=self.devices, auto_shard_dataset=not self.hosts.several))
            logger.info("data-parallel over %d devices: %s", len(self.devices),
                        ", ".join(str(d) for d in self.devices))
        keras.mixed_precision.set_global_policy(self.precision.policy)
        portable_support.use_compilation_cache(config.backend)
        keras.utils.set_random_seed(config.seed)  # weight init
        # JAX: every variable built from shapes, initialized in a few compiled calls on leaving.
        with deferred_init.deferred_variables():
            self.model = ElectraPretrainer.from_pretraining_config(
                config, self.vocab.special, self.vocab.tokens, self.vocab.kind)
            self.model.build_from_sequence_length()
        self.optimizer, self.schedule = optimization.create_optimizer(
            config, config.optimizer, generator_variables=self.model.generator_variables())
        self.steps_per_execution = portable_support.steps_per_execution(config)
        self.model.compile(optimizer=self.optimizer,
                           gradient_accumulation_steps=config.gradient_accumulation_steps,
                           disc_auc_include_padding=False,
                           skip_nonfinite=config.max_skipped_nonfinite_steps > 0,
                           steps_per_execution=self.steps_per_execution)
        self.optimizer.build(self.model.trainable_variables)

    def _start(self) -> None:
        """Restores the newest checkpoint, else the weights `from-google` imported (at their
        step, with a fresh optimizer: as the TensorFlow trainer), else starts at step 0 (a
        fresh reader either way when the saved position belongs to another pipeline)."""
        config = self.config
        found = npz_checkpoint.latest_good(config.model_dir)
        if self.hosts.several:
            found = portable_resume.same_checkpoint_everywhere(found, self.hosts,
                                                               config.model_dir)
        if found is None:
            imported = portable_resume.imported_start(config.model_dir, config.backend)
            if imported is not None:
                saved = npz_checkpoint.restore(imported, self.model, None)
                self.optimizer.iterations.assign(saved.step)
                self.restored_from = imported
                logger.info("initialised from the imported checkpoint %s (step %d, fresh "
                            "optimizer)", imported, self.step)
        if found is None and self.restored_from is None and not config.do_train:
            raise TrainingError(f"no checkpoint in {config.model_dir} to evaluate: train first "
                                "(do_train) or check --data-dir / --model-name")
        data_state = None
        if found is not None:
            saved = npz_checkpoint.restore(found, self.model, self.optimizer)
            self.latest = self.restored_from = found
            data_state = (hosts.host_state(saved.data_state, self.hosts)
                          if saved.data_key == self.data_key else None)
            if config.do_train and saved.data_state is not None and data_state is None:
                logger.warning("%s holds no data position for this pipeline (batch size, shards "
                               "or seed changed): the data order restarts, reshuffled for step "
                               "%d", found, self.step)
            logger.info("restored %s (step %d)", found, self.step)
        if config.two_stage_generator_dir or config.frozen_generator_dir:
            # The source's masked LM at step 0 (a resumed run has it in its own checkpoint).
            frozen_generator.start(self.model, config, self.vocab.tokens,
                                   fresh=found is None and self.restored_from is None)
        if config.do_train:
            # A restart without a position reshuffles (seed + step): the first steps' batches
            # are not replayed.
            seed = config.seed + (self.step if found is not None and data_state is None else 0)
            self.reader = self._train_reader(seed)
            if data_state is not None:
                self.reader.restore(data_state)
            npz_checkpoint.enforce_retention(config.model_dir,
                                                  config.keep_checkpoint_max or None)

    def _train_reader(self, seed: int) -> BatchReader:
        return portable_resume.train_reader(self.config,
                            dataset_checks.record_plan(self.dataset_summaries, "train"), seed,
                            self.hosts, prefetch=max(2, self.steps_per_execution))

    def close(self) -> None:
        """Releases the reader and the run directory's lock (idempotent)."""
        if self.reader is not None:
            self.reader.close()
            self.reader = None
        super().close()

    # --- State -------------------------------------------------------------------------------------
    @property
    def step(self) -> int:
        return int(keras.ops.convert_to_numpy(self.optimizer.iterations))

    def _saved_at_step(self) -> bool:
        return (self.latest is not None
                and self.latest.endswith(npz_checkpoint.file_name(self.step)))

    # --- Training ----------------------------------------------------------------------------------
    def _open_writer(self) -> summaries.ScalarWriter:
        return (portable_board.EventWriter(self.config.model_dir) if self.hosts.writer
                else summaries.NullWriter())

    def _write_run_info(self, writer, start_step: int) -> None:
        portable_board.write_run_info(writer, self.config, start_step)
        self._profiler = board.Profiler(self.config.model_dir, self.profile_steps,
                                        self.hosts.writer, backend=self.config.backend)

    def _describe(self) -> str:
        return (f"{self.num_devices} device(s), backend {self.config.backend}, "
                f"{self.steps_per_execution} step(s) per call")

    def _before_training(self) -> None:
        self.stop.agree()  # a SIGTERM during the set-up, on any host

    def _before_chunk(self) -> None:
        if self.stop.requested:
            self._stop_preempted()
        self._profiler.before_loop(self.step)

    def _after_chunk(self) -> None:
        self.stop.agree()
        self._profiler.after_loop(self.step)

    def _end_training(self) -> None:
        profiler = getattr(self, "_profiler", None)
        if profiler is not None:
            profiler.stop(self.step)

    def _train_chunk(self, num_steps: int) -> Dict[str, float]:
        """One `fit()` call of `num_steps` steps; returns its scalars (as `loop_scalars`).

        A SIGTERM ends the chunk at a call's end: the batches stop at a multiple of
        `steps_per_execution` (one host; several hosts train every chunk whole and stop together
        after it). No callback reads the step's logs, so Keras never waits for the device
        between calls: the host reads and dispatches ahead while the device computes.
        """
        step = self.step
        states: List[dict] = []
        tokens: List[int] = []
        reader = iter(self.reader)
        per_call = self.steps_per_execution
        may_stop = not self.hosts.several

        def batches():
            for i in range(num_steps):
                if may_stop and i and i % per_call == 0 and self.stop.requested:
                    return  # the end of a call: fit() ends after the calls of the batches so far
                states.append(self.reader.state())
                batch = next(reader)
                tokens.append(int(batch["input_mask"].sum()))
                yield (batch,)  # Keras takes tuples from generators: (inputs,)

        t0 = time.time()
        with warnings.catch_warnings():  # a stop ends the batches early, as it should
            warnings.filterwarnings("ignore", message="Your input ran out of data")
            history = self.model.fit(batches(), steps_per_epoch=num_steps, epochs=1, verbose=0,
                                     shuffle=False)
        elapsed = time.time() - t0
        fit_state = self.model._fit_state
        applied = self.step - step
        # A skipped step consumed its batch without moving the step counter (as TensorFlow's
        # loop, whose iterator moved past it): the batches trained are the applied steps and
        # the skipped ones, counted in the compiled step.
        skipped = int(keras.ops.convert_to_numpy(fit_state.skipped.result()))
        done = applied + skipped
        # Keras reads ahead of the step it runs: put the reader back after the last trained
        # batch, so the checkpoint's position is the next batch to train on.
        if done < len(states):
            self.reader.restore(states[done])
        if done == 0:
            return {}
        limit = self.config.max_skipped_nonfinite_steps
        if skipped:
            self.skipped_steps += skipped
            logger.warning("%d non-finite step(s) among the %d batches after step %d: skipped, "
                           "no update applied (%d of at most %d skipped)", skipped, done, step,
                           self.skipped_steps, limit)
            run_base.check_skipped(self.skipped_steps, limit, self.latest)
        # As the TensorFlow run's: the chunk's mean of each applied step's loss terms and
        # gradient norm, and the official metrics over them (`summaries.chunk_scalars`).
        logs = {k: float(v[-1]) for k, v in history.history.items()}
        terms = {"total_loss": logs.pop("loss"),
                 **{k: float(keras.ops.convert_to_numpy(mean.result()))
                    for k, mean in fit_state.step_terms.items()}}
        if applied == 0:  # every step skipped: no mean (TensorFlow's NaN)
            terms = {k: float("nan") for k in terms}
        elif not all(math.isfinite(terms[k]) for k in ("total_loss", "masked_lm_loss",
                                                       "disc_loss")):
            raise TrainingError(
                f"non-finite loss in steps {step + 1}-{self.step} (loss {terms['total_loss']}):"
                f" training stopped; the last good checkpoint is {self.latest}. Lower "
                "learning_rate or check the data")
        learning_rate = float(keras.ops.convert_to_numpy(self.schedule(self.step - 1)))
        # Every host's tokens (one collective; several hosts train every chunk whole).
        all_tokens = hosts.gather_ints(self.hosts, [sum(tokens[:done])]).sum()
        scalars = summaries.chunk_scalars(terms, learning_rate, logs, done, elapsed,
                                          self.config.train_batch_size, float(all_tokens))
        return self._chunk_scalars(scalars, self.skipped_steps if limit else None)

    def _stop_callbacks(self) -> list:
        """Stops `evaluate()` after the batch under way on SIGTERM; none under several hosts,
        which stop together between chunks (one host leaving a step would leave the others
        waiting in its collective)."""
        return [] if self.hosts.several else [_StopCallback(self.stop)]

    def _save(self) -> None:
        """Writes ckpt-<step>.npz (host 0, with every host's reader position)."""
        config = self.config
        state = self.reader.state() if self.reader is not None else None
        if self.hosts.several and state is not None:
            state = {"hosts": hosts.gather_json(self.hosts, state)}
        path = npz_checkpoint.path_for(config.model_dir, self.step)
        with hosts.all_or_none(self.hosts, f"saving {os.path.basename(path)}"):
            if self.hosts.writer:
                npz_checkpoint.save(config.model_dir, self.step, self.model,
                                         self.optimizer, state, self.data_key)
                npz_checkpoint.enforce_retention(config.model_dir,
                                                      config.keep_checkpoint_max or None)
                logger.info("saved checkpoint %s", path)
        self.latest = path

    # --- Evaluation --------------------------------------------------------------------------------
    def _evaluate_batches(self) -> Dict[str, float]:
        config = self.config
        if self.stop.agree():
            raise self.preempted("before the evaluation", "evaluate")
        # Several hosts: each reads its part of the eval batch (as the TensorFlow workers).
        reader = BatchReader(config.eval_tfrecords,
                             batch_size=config.eval_batch_size // self.hosts.count,
                             max_seq_length=config.max_seq_length, is_training=False,
                             num_input_pipelines=self.hosts.count,
                             input_pipeline_id=self.hosts.index,
                             record_plan=dataset_checks.record_plan(self.dataset_summaries, "eval"))
        with reader, self.stop:
            logs = self.model.evaluate(((batch,) for batch in reader),
                                       steps=config.num_eval_steps, verbose=0, return_dict=True,
                                       callbacks=self._stop_callbacks())
        if self.stop.agree():
            raise self.preempted("during the evaluation", "evaluate (no eval results were "
                                                          "written)")
        return {k: float(v) for k, v in logs.items()}

    def _write_eval_results(self, results: Dict[str, float], note) -> None:
        with hosts.all_or_none(self.hosts, "writing the eval results"):
            if self.hosts.writer:
                summaries.write_eval_results(self.config.model_dir, self.step, results,
                                             event_writer=portable_board.write_scalars, note=note)

    def _export(self) -> None:
        """A SavedModel needs TensorFlow: the way to one, in one warning."""
        logger.warning(
            "do_export skipped: a SavedModel needs TensorFlow. On a machine with it, run "
            "this command with --backend tensorflow and --hparams "
            "'{\"do_train\": false, \"do_export\": true}' (it reads %s's checkpoint), "
            "or electra-convert to-hf / to-keras-hub / to-google", self.config.model_dir)
        return None


class _StopCallback(keras.callbacks.Callback):
    """Ends `evaluate()` after the batch under way once a stop is requested (training stops
    between calls: `_train_chunk`)."""

    def __init__(self, stop: preemption.HostStop):
        super().__init__()
        self.stop = stop

    def on_test_batch_end(self, batch, logs=None):
        if self.stop.requested:
            self.model.stop_evaluating = True


def run(config: PretrainingConfig, overwrite: bool = False,
        observers: Optional[observers_lib.ObserverFactory] = None,
        profile_steps: int = 0) -> dict:
    """Trains and evaluates as the config says, on `config.backend` (jax or torch).

    Returns:
        {"train": last chunk's scalars, "eval": eval results, "final": {"global_step",
         "checkpoint", "weights_sha256"}}, for the phases that ran.
    """
    with preemption.SigtermWatch(), hosts.stop_if_lost(config), \
            PortableTrainer(config, overwrite=overwrite, observers=observers,
                            profile_steps=profile_steps) as trainer:
        return trainer.run_phases()
