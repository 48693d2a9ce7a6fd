"""The pretraining run: strategy, model, optimizer, checkpoints, summaries, eval and export.

`run(config)` is what `run_pretraining.py` calls. The order, as the official `train_or_eval`:

1. Set up: strategy (before any other op), vocab and dataset checks (manifest), then the model
   directory (`config.json` written before step 0; an incompatible existing run is an error;
   `overwrite` deletes a previous run only after the checks pass), precision policy.
2. Build the model, optimizer and metrics under the strategy scope; restore the latest checkpoint
   if there is one (same step counter, optimizer slots and learning-rate position).
3. Train in compiled loops of `iterations_per_loop` steps; after each loop write TensorBoard
   scalars and a console line (chief only); save a checkpoint every `save_checkpoints_steps` and
   at the end. A non-finite loss stops the run (`TrainingError`) without saving.
4. Evaluate on the held-out split (`eval_results.txt`), export SavedModels.

What a checkpoint holds, so that a resumed run is bit-identical to an uninterrupted one: the
model (incl. the dropout seed-generator states), the optimizer (incl. the step counter), and the
position of the training data. Per-step randomness (masking, sampling) derives from (seed, global
step). `tf.distribute` iterators over several devices cannot be checkpointed, so each worker reads
its own part of the global batch with a plain `tf.data` iterator (checkpointable) and each
replica slices its rows in the step; a fingerprint of the pipeline (files, batch split, seed) is
saved with the position, and a run resumed with another batch size or other shards restarts the
data (reshuffled) instead of failing. Under MultiWorkerMirroredStrategy every worker saves (the
save is collective); the chief into `model_dir`, the others into `model_dir/workers/worker_<i>`
(their own data positions).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import time
from typing import Dict, List, Optional

import keras
import numpy as np
import tensorflow as tf

from electra_tf.config import ConfigError, PretrainingConfig
from electra_tf.convert.model_dir import INIT_CHECKPOINT_DIR  # imported weights (from-google)
from electra_tf.data import pipeline
from electra_tf.errors import TrainingError
from electra_tf.pretraining.pretrainer import ElectraPretrainer
from electra_tf.pretraining.metrics import PretrainingMetrics
from electra_tf.training import optimization
from electra_tf.training.strategy import get_strategy, is_chief
from electra_tf.vocab import file_sha256, load_vocab

logger = logging.getLogger("electra_tf")

CONFIG_NAME = "config.json"
VOCAB_NAME = "vocab.txt"
EVAL_RESULTS_NAME = "eval_results.txt"
# Hparams that change the model's variables or the data it reads: a run cannot resume with
# different values. Everything else (steps, learning rate, batch size, ...) may change.
STRUCTURAL_HPARAMS = (
    "model_size", "model_hparam_overrides", "embedding_size", "vocab_size", "max_seq_length",
    "electra_objective", "uniform_generator", "untied_generator", "untied_generator_embeddings",
    "generator_layers", "generator_hidden_size", "debug",
)
# Keys every saved config.json has: how `--overwrite` recognises a run directory it may delete.
_RUN_MARKER_KEYS = ("model_name", "model_size", "max_seq_length", "vocab_size")
# Directory (inside model_dir) where a non-chief worker keeps its own checkpoints: its data
# iterator position differs from the chief's, so it needs its own to resume exactly.
WORKER_CHECKPOINT_DIR = "workers"
# Checkpoint entry holding `Trainer._train_data_key()`: the saved data position is only restored
# into the pipeline it came from.
TRAIN_DATA_KEY_NAME = "train_data_key"
# Seed stream for evaluation masks, kept apart from the training steps' streams.
EVAL_SEED_OFFSET = 1 << 40
# tf.train.CheckpointManager's default checkpoint_name: checkpoints are `ckpt-<global step>`.
CHECKPOINT_PREFIX = "ckpt"


# ------------------------------------------------------------------------------------------------
# Model directory
# ------------------------------------------------------------------------------------------------
def prepare_model_dir(config: PretrainingConfig, vocab_path: str, vocab_sha256: str,
                      write: bool) -> None:
    """Checks an existing run in `config.model_dir` is compatible; creates/updates it if `write`.

    Writes the resolved config as `config.json` (before step 0, and again on every resume, so it
    shows the current `num_train_steps`) and a copy of the vocab, which later runs compare with.

    Raises:
        TrainingError: the directory holds a run with other structural hparams or another vocab.
    """
    config_path = os.path.join(config.model_dir, CONFIG_NAME)
    if os.path.exists(config_path):
        try:
            previous = PretrainingConfig.load(config_path)
        except (ConfigError, TypeError) as e:
            raise TrainingError(f"{config_path} is not a readable electra-tf config ({e}); use "
                                "another --model-name, or --overwrite to start afresh") from None
        for key in STRUCTURAL_HPARAMS:
            old, new = getattr(previous, key), getattr(config, key)
            if old != new:
                raise TrainingError(
                    f"{config.model_dir} holds a run with {key}={old!r}; this run has {key}={new!r}. "
                    "Use the run's hparams, another --model-name, or --overwrite to start afresh")
        saved_vocab = os.path.join(config.model_dir, VOCAB_NAME)
        if os.path.exists(saved_vocab) and file_sha256(saved_vocab) != vocab_sha256:
            raise TrainingError(
                f"{config.model_dir} was trained with the vocab saved as {saved_vocab}, which "
                f"differs from {vocab_path}; use that vocab, another --model-name, or --overwrite")
    if write:
        os.makedirs(config.model_dir, exist_ok=True)
        config.save(config_path)
        saved_vocab = os.path.join(config.model_dir, VOCAB_NAME)
        if not os.path.exists(saved_vocab):
            shutil.copyfile(vocab_path, saved_vocab + ".tmp")
            os.replace(saved_vocab + ".tmp", saved_vocab)


def is_run_dir(model_dir: str) -> bool:
    """True if `model_dir` holds an electra-tf run (a `config.json` this project wrote)."""
    try:
        with open(os.path.join(model_dir, CONFIG_NAME), encoding="utf-8") as f:
            saved = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(saved, dict) and all(k in saved for k in _RUN_MARKER_KEYS)


def remove_run(model_dir: str) -> bool:
    """Deletes a previous run's directory (`--overwrite`), refusing one that is not a run.

    Returns:
        True if a directory was deleted.

    Raises:
        TrainingError: `model_dir` is not empty and holds no electra-tf `config.json` (it may be
            user data: nothing is deleted).
    """
    if not os.path.isdir(model_dir):
        if os.path.exists(model_dir):
            raise TrainingError(f"refusing to overwrite {model_dir}: it is a file, not a run directory")
        return False
    if os.listdir(model_dir) and not is_run_dir(model_dir):
        raise TrainingError(f"refusing to delete {model_dir}: it does not look like an electra-tf "
                            f"run directory (no {CONFIG_NAME} written by run_pretraining.py)")
    shutil.rmtree(model_dir)
    logger.info("--overwrite: deleted the previous run in %s", model_dir)
    return True


def weights_fingerprint(variables) -> str:
    """sha256 over the variables' dtypes, shapes and bytes, in the given (fixed) order.

    Two runs with this fingerprint equal hold bit-identical weights (used to check that workers
    end identical and that a resumed run equals an uninterrupted one). Names are left out: Keras
    numbers some of them per process (`seed_generator_7`), which says nothing about the values.
    """
    digest = hashlib.sha256()
    for variable in variables:
        value = np.asarray(variable.numpy())
        digest.update(f"{value.dtype.str}|{value.shape}|".encode("utf-8"))
        digest.update(np.ascontiguousarray(value).tobytes())
    return digest.hexdigest()


# ------------------------------------------------------------------------------------------------
# The run
# ------------------------------------------------------------------------------------------------
class Trainer:
    """Holds the strategy, model, optimizer and checkpoint of one run.

    Construction checks everything that can be wrong with the inputs (vocab, datasets, batch
    split, an existing run's compatibility) before anything is written, then builds the model
    under the strategy and restores the latest checkpoint if there is one.

    Args:
        config: a resolved PretrainingConfig.
        strategy: optional tf.distribute.Strategy; by default from `config.strategy`.
        overwrite: delete an existing run in `config.model_dir` first (after the checks pass);
            refuses a directory that is not a run (see `remove_run`).

    Raises:
        TrainingError, DataError, VocabError, StrategyError: bad inputs, one-line messages.
    """

    def __init__(self, config: PretrainingConfig, strategy: Optional[tf.distribute.Strategy] = None,
                 overwrite: bool = False):
        self.config = config
        self.strategy = strategy or get_strategy(config.strategy, config.tpu_name, config.tpu_zone,
                                                 config.gcp_project, config.inter_op_threads)
        self.chief = is_chief(self.strategy)
        self.vocab = load_vocab(config.vocab_file)
        if self.vocab.size > config.vocab_size:
            raise TrainingError(f"{config.vocab_file} has {self.vocab.size} tokens but vocab_size is "
                                f"{config.vocab_size}: set the vocab_size hparam to {self.vocab.size}")
        replicas = self.strategy.num_replicas_in_sync
        for key in ("train_batch_size", "eval_batch_size"):
            if getattr(config, key) % replicas:
                raise TrainingError(f"{key}={getattr(config, key)} (the global batch) is not a "
                                    f"multiple of the {replicas} replicas in sync")
        # Data checks before anything is written or deleted.
        self.dataset_summaries = {}
        if config.do_train:
            self.dataset_summaries["train"] = pipeline.validate_dataset(
                config.pretrain_tfrecords, max_seq_length=config.max_seq_length,
                vocab_sha256=self.vocab.sha256, vocab_size=config.vocab_size, split="train",
                verify=config.verify_tfrecords, skip_bad_records=config.skip_bad_records)
        if config.do_eval:
            self.dataset_summaries["eval"] = pipeline.validate_dataset(
                config.eval_tfrecords, max_seq_length=config.max_seq_length,
                vocab_sha256=self.vocab.sha256, vocab_size=config.vocab_size, split="eval",
                verify=config.verify_tfrecords, skip_bad_records=config.skip_bad_records)
        for split, summary in self.dataset_summaries.items():
            for problem in summary.get("problems", ()):
                logger.warning("skip_bad_records (%s data): %s", split, problem)
            if summary.get("skipped_records"):
                logger.warning("skip_bad_records: %d %s record(s) skipped, %d used",
                               summary["skipped_records"], split, summary["num_examples"])
        if overwrite and self.chief:
            remove_run(config.model_dir)
        # An eval- or export-only run reads the run's checkpoint and leaves its config alone.
        prepare_model_dir(config, config.vocab_file, self.vocab.sha256,
                          write=self.chief and config.do_train)
        if self.chief and config.do_train and self.dataset_summaries["train"]["manifests"]:
            # Provenance, and how the data was tokenised (the export's serve_text repeats it).
            from electra_tf.training.export import DATASET_MANIFEST_COPY
            _copy_atomically(self.dataset_summaries["train"]["manifests"][0],
                             os.path.join(config.model_dir, DATASET_MANIFEST_COPY))
        keras.mixed_precision.set_global_policy(config.mixed_precision)
        keras.utils.set_random_seed(config.seed)  # weight init and dropout

        with self.strategy.scope():
            self.model = ElectraPretrainer.from_pretraining_config(config, self.vocab.special)
            self.model.build_from_sequence_length()
            self.optimizer, self.schedule = optimization.create_optimizer(config, config.optimizer)
            if config.mixed_precision == "mixed_float16":
                self.optimizer = keras.optimizers.LossScaleOptimizer(self.optimizer)
            self.optimizer.build(self.model.trainable_variables)
            self.metrics = PretrainingMetrics(electra_objective=config.electra_objective,
                                              disc_weight=config.disc_weight)
        # The data position is checkpointed with the model, so a resumed run continues the data
        # where it stopped; the dropout RNG states (non-trainable) too, so it draws the same masks.
        self.train_iterator = None
        self.train_data_key = None
        if config.do_train:
            self._input = self._input_context()
            self.train_data_key = self._train_data_key()
            self.train_iterator = self._make_train_iterator(config.seed)
        self._make_checkpoint()
        self._train_loop = self._eval_loop = None  # tf.functions, traced on first use
        self.skipped_steps = 0  # non-finite steps skipped in this process
        self.restored_from = None
        path, own_data = self._checkpoint_to_restore()
        init_path = tf.train.latest_checkpoint(os.path.join(config.model_dir, INIT_CHECKPOINT_DIR))
        if path:
            self._restore(path, own_data)
        elif init_path:
            self._restore_init(init_path)
        elif not config.do_train:
            raise TrainingError(f"no checkpoint in {config.model_dir} to "
                                f"{'evaluate' if config.do_eval else 'export'}: train first "
                                "(do_train) or check --data-dir / --model-name")
        if config.two_stage_generator_dir:
            self._start_two_stage(fresh=not path and not init_path)

    def _start_two_stage(self, fresh: bool) -> None:
        """Stage 2 of two-stage training: at step 0 the generator (encoder and MLM head) and the
        discriminator are set to the stage-1 MLM model's weights; the generator is frozen on
        every start (trainability is not part of a checkpoint)."""
        from electra_tf.convert.model_dir import load_model_dir
        from electra_tf.convert.names import ConversionError

        source = self.config.two_stage_generator_dir
        model = self.model
        if fresh:
            try:
                stage1 = load_model_dir(source)
            except ConversionError as e:
                raise TrainingError(f"two_stage_generator_dir: {e}") from None
            if stage1.config.electra_objective:
                raise TrainingError(f"two_stage_generator_dir {source} is an ELECTRA run; stage 1 "
                                    "is an MLM-only run (electra_objective: false)")
            encoder = stage1.model.discriminator.get_weights()  # the MLM-only run's encoder
            try:
                model.generator.set_weights(encoder)
                model.generator_head.set_weights(stage1.model.generator_head.get_weights())
                model.discriminator.set_weights(encoder)
            except ValueError as e:
                raise TrainingError(f"two_stage_generator_dir {source} does not match this model's "
                                    f"sizes: {' '.join(str(e).split())[:300]}") from None
            logger.info("two_stage: generator and discriminator start from %s (step %d); the "
                        "generator is frozen", source, stage1.step)
        model.generator.trainable = False
        model.generator_head.trainable = False

    def _checkpoint_to_restore(self):
        """(checkpoint path or None, whether its saved data position is this worker's own).

        The chief's latest checkpoint decides the step. A non-chief worker restores its own
        checkpoint of that same step (which holds its data position); if it has none (killed
        between the two saves), it takes the chief's weights and restarts its data.
        """
        latest = latest_good_checkpoint(self.config.model_dir)
        if self.chief or latest is None:
            return latest, True
        own = latest_good_checkpoint(self._checkpoint_dir(), at_step=_checkpoint_number(latest))
        if own is not None:
            return own, True
        return latest, False

    def _train_data_key(self) -> str:
        """What the saved data position depends on: files, batch split, seed, sequence length.

        A checkpoint's iterator state can only be restored into the same pipeline (a different
        batch size fails at the first step; rebuilt shards would resume mid-record).
        """
        config = self.config
        files = [(os.path.basename(f), tf.io.gfile.stat(f).length)
                 for f in pipeline.list_files(config.pretrain_tfrecords)]
        key = {"files": files, "global_batch": config.train_batch_size,
               "replicas": self._input.num_replicas_in_sync,
               "input_pipelines": self._input.num_input_pipelines,
               "seed": config.seed, "max_seq_length": config.max_seq_length}
        plan = self._record_plan("train")
        if plan is not None:  # other records read = another pipeline
            key["record_plan"] = {os.path.basename(f): v for f, v in plan.items()}
        return hashlib.sha256(json.dumps(key, sort_keys=True).encode("utf-8")).hexdigest()

    def _record_plan(self, split: str) -> Optional[dict]:
        """The good records to read (`skip_bad_records`), or None to read every record."""
        return self.dataset_summaries.get(split, {}).get("record_plan")

    def _input_context(self) -> tf.distribute.InputContext:
        """This worker's input pipeline: its index, the number of pipelines and of replicas."""
        contexts = []

        def capture(input_context):
            contexts.append(input_context)
            return tf.data.Dataset.range(1)

        # The strategy itself says which pipeline this worker is (public API, no data read).
        self.strategy.distribute_datasets_from_function(capture)
        return contexts[0]

    def _make_train_iterator(self, seed: int):
        """A plain (checkpointable) iterator over this worker's batches.

        `tf.distribute` iterators over several devices cannot be checkpointed, so the worker's
        pipeline yields its local part of the global batch (per-replica batch x local replicas,
        the examples the distributed iterator would hand its replicas) and each replica takes
        its slice in the step (`_replica_slice`); the data position is then saved exactly.
        """
        config = self.config
        context = self._input
        self._local_replicas = context.num_replicas_in_sync // context.num_input_pipelines
        self._per_replica_batch = context.get_per_replica_batch_size(config.train_batch_size)
        return iter(pipeline.make_dataset(
            config.pretrain_tfrecords, batch_size=self._per_replica_batch * self._local_replicas,
            max_seq_length=config.max_seq_length, is_training=True, seed=seed,
            input_context=context, record_plan=self._record_plan("train")))

    def _replica_slice(self, local_batch):
        """This replica's [per_replica_batch, L] rows of the worker's local batch."""
        if self._local_replicas == 1:
            return local_batch
        context = tf.distribute.get_replica_context()
        # Replicas are numbered worker-major, so the id modulo the local count is the local index.
        start = (tf.cast(context.replica_id_in_sync_group, tf.int32) % self._local_replicas
                 ) * self._per_replica_batch
        return {k: v[start:start + self._per_replica_batch] for k, v in local_batch.items()}

    def _model_items(self) -> dict:
        return {"model": self.model, "optimizer": self.optimizer,
                "rng_state": list(self.model.non_trainable_variables)}

    def _make_checkpoint(self) -> None:
        items = self._model_items()
        if self.train_iterator is not None:
            items["train_data"] = self.train_iterator
            items[TRAIN_DATA_KEY_NAME] = tf.Variable(self.train_data_key, trainable=False,
                                                     dtype=tf.string)
        self.checkpoint = tf.train.Checkpoint(**items)
        self.manager = tf.train.CheckpointManager(
            self.checkpoint, self._checkpoint_dir(), max_to_keep=self.config.keep_checkpoint_max or None,
            step_counter=self.optimizer.iterations, checkpoint_interval=None)

    def _restore(self, path: str, own_data: bool = True) -> None:
        saved_key = _read_checkpoint_string(path, TRAIN_DATA_KEY_NAME)
        same_data = (self.train_iterator is not None and own_data
                     and saved_key == self.train_data_key)
        checkpoint = self.checkpoint if same_data else tf.train.Checkpoint(**self._model_items())
        try:
            # expect_partial: an eval/export run, or a changed pipeline, leaves the saved data
            # position unread on purpose.
            checkpoint.restore(path).assert_existing_objects_matched().expect_partial()
        except (AssertionError, ValueError, tf.errors.OpError) as e:
            first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise TrainingError(
                f"cannot resume from {path}: it does not match this run's model or optimizer "
                f"({first_line[:300]}). Use the run's hparams, another --model-name, or "
                "--overwrite to start afresh") from None
        self.restored_from = path
        if self.train_iterator is not None and not same_data:
            # The saved position belongs to another pipeline (batch size, shards or seed changed,
            # or another worker's): read the data afresh, in an order that does not replay the
            # first steps' batches.
            logger.warning("%s holds no data position for this pipeline (batch size, shards, seed "
                           "or worker changed): the data order restarts, reshuffled for step %d",
                           path, self.step)
            self.train_iterator = self._make_train_iterator(self.config.seed + self.step)
            self._make_checkpoint()
        logger.info("restored %s (step %d)", path, self.step)

    def _restore_init(self, path: str) -> None:
        """Starts from an imported model-only checkpoint (`python -m electra_tf.convert
        from-google`): weights and step come from it, the optimizer starts fresh."""
        step = tf.Variable(0, dtype=tf.int64)
        try:
            tf.train.Checkpoint(model=self.model, step=step).restore(
                path).assert_existing_objects_matched().expect_partial()
        except (AssertionError, ValueError, tf.errors.OpError) as e:
            first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise TrainingError(f"cannot start from the imported checkpoint {path}: it does not "
                                f"match this run's model ({first_line[:300]}). Use the hparams "
                                "`from-google` printed") from None
        self.optimizer.iterations.assign(step)
        self.restored_from = path
        logger.info("initialised from the imported checkpoint %s (step %d, fresh optimizer)",
                    path, self.step)

    def _checkpoint_dir(self) -> str:
        if self.chief:
            return self.config.model_dir
        # Every worker saves (the save is collective). A non-chief keeps its own checkpoints (same
        # weights, but its own data position) in a private directory, to resume exactly.
        task_id = self.strategy.cluster_resolver.task_id
        return os.path.join(self.config.model_dir, WORKER_CHECKPOINT_DIR, f"worker_{task_id}")

    def weights_fingerprint(self) -> str:
        """sha256 of the model's variables (trainable, then the rest incl. dropout RNG states),
        in the model's fixed order."""
        return weights_fingerprint(list(self.model.trainable_variables)
                                   + list(self.model.non_trainable_variables))

    @property
    def step(self) -> int:
        return int(self.optimizer.iterations.numpy())

    # --------------------------------------------------------------------------------------------
    def _distributed_dataset(self, patterns: str, global_batch: int, is_training: bool,
                             seed: Optional[int] = None, record_plan: Optional[dict] = None):
        config = self.config
        seed = config.seed if seed is None else seed

        def dataset_fn(input_context):
            return pipeline.make_dataset(
                patterns, batch_size=input_context.get_per_replica_batch_size(global_batch),
                max_seq_length=config.max_seq_length, is_training=is_training, seed=seed,
                input_context=input_context, record_plan=record_plan)

        return self.strategy.distribute_datasets_from_function(dataset_fn)

    def _make_train_loop(self):
        config, model, optimizer, strategy = self.config, self.model, self.optimizer, self.strategy
        variables = model.trainable_variables
        loss_scaled = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
        skip_nonfinite = config.max_skipped_nonfinite_steps > 0

        def forward_backward(batch, seed):
            with tf.GradientTape() as tape:
                outputs = model(batch, seed=seed, training=True)
                loss = outputs["total_loss"]
                scaled = optimizer.scale_loss(loss) if loss_scaled else loss
            return outputs, tape.gradient(scaled, variables)

        if config.jit_compile:
            forward_backward = tf.function(forward_backward, jit_compile=True)

        def replica_forward(local_batch):
            """This replica's rows of the batch, the model outputs and the gradients."""
            batch = self._replica_slice(local_batch)
            seed = tf.stack([tf.constant(config.seed, tf.int64),
                             tf.cast(optimizer.iterations, tf.int64)])
            outputs, grads = forward_backward(batch, seed)
            return batch, outputs, grads

        def nonfinite(outputs, grads):
            return diverged(outputs["total_loss"],
                            tf.linalg.global_norm([g for g in grads if g is not None]))

        def reduce_values(per_replica):
            return {k: strategy.reduce(tf.distribute.ReduceOp.SUM if k in summed
                                       else tf.distribute.ReduceOp.MEAN, v, axis=None)
                    for k, v in per_replica.items()}

        def step_fn(local_batch):
            batch, outputs, grads = replica_forward(local_batch)
            lr = self.schedule(optimizer.iterations)
            if not skip_nonfinite:
                grad_norm = optimization.apply_gradients(optimizer, grads, variables)
                self.metrics.update_state(outputs["metric_inputs"])
                skipped = tf.constant(0.0)
            else:
                # A bad batch: neither the weights nor the optimizer (slots, step counter) change;
                # the data iterator has moved past it.
                bad = nonfinite(outputs, grads)

                def apply():
                    norm = optimization.apply_gradients(optimizer, grads, variables)
                    self.metrics.update_state(outputs["metric_inputs"])
                    return norm

                grad_norm = tf.cond(bad, lambda: tf.constant(float("nan")), apply)
                skipped = tf.cast(bad, tf.float32)
            return step_values(outputs, batch, grad_norm, lr, skipped)

        def step_values(outputs, batch, grad_norm, lr, skipped):
            tokens = tf.reduce_sum(tf.cast(batch["input_mask"], tf.float32))
            return {"total_loss": outputs["total_loss"], "masked_lm_loss": outputs["masked_lm_loss"],
                    "disc_loss": outputs["disc_loss"], "tokens": tokens, "grad_norm": grad_norm,
                    "learning_rate": tf.cast(lr, tf.float32), "skipped": skipped}

        summed = ("total_loss", "masked_lm_loss", "disc_loss", "tokens", "skipped")

        # Skipping with several replicas: every replica must take the same branch, and a
        # synchronisation point (the gradient sum) may not sit inside control flow in a replica
        # function. So the step runs in two replica functions with the decision between them,
        # in cross-replica context: skip when any replica's loss or gradient is bad (its NaN
        # would reach every replica through the gradient sum).
        gradient_slots = []  # which variables receive a gradient (known when traced)

        def compute_fn(local_batch):
            batch, outputs, grads = replica_forward(local_batch)
            gradient_slots[:] = [g is not None for g in grads]
            present = [g for g in grads if g is not None]
            bad = tf.cast(nonfinite(outputs, grads), tf.float32)
            values = step_values(outputs, batch, tf.constant(0.0), self.schedule(optimizer.iterations),
                                 tf.constant(0.0))
            return values, outputs["metric_inputs"], present, bad

        def apply_fn(metric_inputs, present):
            remaining = iter(present)
            grads = [next(remaining) if slot else None for slot in gradient_slots]
            norm = optimization.apply_gradients(optimizer, grads, variables)
            self.metrics.update_state(metric_inputs)
            return norm

        def agreed_skip_step(local_batch):
            per_replica, metric_inputs, present, bad = strategy.run(compute_fn, args=(local_batch,))
            any_bad = strategy.reduce(tf.distribute.ReduceOp.SUM, bad, axis=None) > 0
            values = reduce_values(per_replica)
            values["grad_norm"] = tf.cond(
                any_bad, lambda: tf.constant(float("nan")),
                lambda: strategy.reduce(tf.distribute.ReduceOp.MEAN,
                                        strategy.run(apply_fn, args=(metric_inputs, present)),
                                        axis=None))
            values["skipped"] = tf.cast(any_bad, tf.float32)
            return values

        two_phase = skip_nonfinite and strategy.num_replicas_in_sync > 1

        def diverged(loss, grad_norm):
            # A non-finite gradient norm makes the clipped update NaN (the weights are lost even
            # though this step's loss was finite), except under loss scaling, where the
            # LossScaleOptimizer skips such a step and lowers the scale.
            bad = tf.logical_not(tf.math.is_finite(loss))
            if not loss_scaled:
                bad = tf.logical_or(bad, tf.logical_not(tf.math.is_finite(grad_norm)))
            return bad

        @tf.function
        def train_loop(iterator, num_steps):
            # Per-step values, reduced over replicas; the loop stops early at a non-finite loss.
            history = {k: tf.TensorArray(tf.float32, size=num_steps, element_shape=[])
                       for k in summed + ("grad_norm", "learning_rate")}
            done = tf.constant(0)
            for i in tf.range(num_steps):
                if two_phase:
                    values = agreed_skip_step(next(iterator))
                else:
                    values = reduce_values(strategy.run(step_fn, args=(next(iterator),)))
                # Reassign (not mutate) so autograph carries the arrays through the loop.
                history = {k: ta.write(i, values[k]) for k, ta in history.items()}
                done = i + 1
                if values["skipped"] == 0.0 and diverged(values["total_loss"], values["grad_norm"]):
                    break
            return done, {k: ta.stack()[:done] for k, ta in history.items()}

        return train_loop

    def train(self, stop_at_step: Optional[int] = None) -> Dict[str, float]:
        """Trains to `num_train_steps` (or `stop_at_step`, for tests and staged runs), resuming
        from the current step. Returns the last loop's averaged scalars."""
        config = self.config
        start_step = self.step
        end_step = min(config.num_train_steps, stop_at_step or config.num_train_steps)
        if start_step >= end_step:
            logger.info("already at step %d >= num_train_steps %d: nothing to train", start_step,
                        config.num_train_steps)
            return {}
        iterator = self.train_iterator
        if self._train_loop is None:  # traced once per Trainer, reused by later train() calls
            self._train_loop = self._make_train_loop()
        train_loop = self._train_loop
        writer = tf.summary.create_file_writer(config.model_dir) if self.chief else None
        if start_step == 0:
            self._save()  # step-0 checkpoint: a crash in the first loop loses nothing
        logger.info("training from step %d to %d (global batch %d, %d replica(s))", start_step,
                    config.num_train_steps, config.train_batch_size,
                    self.strategy.num_replicas_in_sync)
        scalars: Dict[str, float] = {}
        run_start, run_start_step = time.time(), start_step
        try:
            while self.step < end_step:
                step = self.step
                to_checkpoint = config.save_checkpoints_steps - step % config.save_checkpoints_steps
                num_steps = min(config.iterations_per_loop, to_checkpoint, end_step - step)
                self.metrics.reset_state()
                t0 = time.time()
                try:
                    done, history = train_loop(iterator, tf.constant(num_steps))
                except tf.errors.DataLossError as e:
                    # tf.data's message has an offset but no file name: find the file.
                    found = pipeline.find_bad_file(config.pretrain_tfrecords, config.max_seq_length)
                    raise TrainingError(
                        f"a training record failed to read at step {self.step}: "
                        f"{found or str(e).strip().splitlines()[0][:200]}. Training stopped; the "
                        f"last good checkpoint is {self.manager.latest_checkpoint}") from None
                done = int(done)
                history = {k: v.numpy() for k, v in history.items()}
                elapsed = time.time() - t0
                self._count_skipped(history, step)
                self._check_finite(history, step + done - 1)
                applied = history["skipped"] == 0  # the loop's scalars cover applied steps only
                scalars = {k: float(history[k][applied].mean()) if applied.any() else float("nan")
                           for k in ("total_loss", "masked_lm_loss", "disc_loss", "grad_norm")}
                # The rate of the loop's last update, lr(step - 1) at summary step `step`.
                scalars["learning_rate"] = float(history["learning_rate"][-1])
                scalars.update({k: float(v) for k, v in self.metrics.result().items()
                                if k not in ("masked_lm_loss", "disc_loss")})
                scalars["examples_per_second"] = done * config.train_batch_size / elapsed
                scalars["tokens_per_second"] = float(history["tokens"].sum()) / elapsed
                if config.max_skipped_nonfinite_steps:
                    scalars["skipped_steps"] = float(self.skipped_steps)
                if config.skip_bad_records:
                    scalars["skipped_records"] = float(
                        self.dataset_summaries["train"]["skipped_records"])
                if self.chief:
                    with writer.as_default(step=self.step):
                        for name, value in scalars.items():
                            tf.summary.scalar(name, value)
                    writer.flush()
                self._log_progress(scalars, run_start, run_start_step)
                if self.step % config.save_checkpoints_steps == 0 or self.step >= end_step:
                    self._save()
        finally:
            if writer is not None:
                writer.close()
        elapsed = time.time() - run_start
        if self.chief:
            logger.info(
                "training done: steps %d-%d in %s (%.1f ex/s incl. compilation); last loop: loss "
                "%.4f mlm %.4f disc %.4f; checkpoint %s", start_step, self.step,
                _format_seconds(elapsed),
                (self.step - start_step) * config.train_batch_size / max(elapsed, 1e-9),
                scalars["total_loss"], scalars["masked_lm_loss"], scalars["disc_loss"],
                self.manager.latest_checkpoint)
        return scalars

    def _count_skipped(self, history: Dict[str, np.ndarray], first_step: int) -> None:
        """Logs each skipped non-finite step (`max_skipped_nonfinite_steps`); raises TrainingError
        once more than that many were skipped in this process (a run that truly diverged)."""
        limit = self.config.max_skipped_nonfinite_steps
        for index in np.flatnonzero(history["skipped"]):
            self.skipped_steps += 1
            terms = ", ".join(f"{k}={float(history[k][index])}" for k in
                              ("total_loss", "masked_lm_loss", "disc_loss")
                              if not math.isfinite(float(history[k][index])))
            logger.warning("non-finite step at step %d (%s): batch skipped, no update applied "
                           "(%d of at most %d skipped)",
                           first_step + int(np.sum(history["skipped"][:index] == 0)),
                           terms or "gradient norm", self.skipped_steps, limit)
        if self.skipped_steps > limit:
            raise TrainingError(
                f"{self.skipped_steps} non-finite steps skipped, more than "
                f"max_skipped_nonfinite_steps={limit}: the run has diverged. Training stopped "
                f"without saving; the last good checkpoint is {self.manager.latest_checkpoint}")

    def _check_finite(self, history: Dict[str, np.ndarray], last_step: int) -> None:
        """Raises TrainingError if the loop's last step diverged (see `diverged` in the loop)."""
        if history["skipped"].size and history["skipped"][-1]:
            return  # skipped, not applied (`_count_skipped`)
        names = ["total_loss", "masked_lm_loss", "disc_loss"]
        if not isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer):
            names.append("grad_norm")
        bad = [k for k in names if not math.isfinite(float(history[k][-1]))]
        if not bad:
            return
        values = ", ".join(f"{k}={float(history[k][-1])}" for k in bad)
        raise TrainingError(
            f"non-finite {'loss' if bad[0] == 'total_loss' else bad[0]} at step {last_step} "
            f"({values}). Training stopped without saving; the last good checkpoint is "
            f"{self.manager.latest_checkpoint}")

    def _save(self) -> None:
        """Saves `ckpt-<step>`; a failed save (disk full, unwritable directory) is a TrainingError.

        TensorFlow writes the data under a temporary name and the `checkpoint` state file last,
        so a failed save never becomes the latest checkpoint; its temporary files are removed
        (they hold the space a retry needs) and a restart resumes from the last complete one.
        """
        directory = self._checkpoint_dir()
        try:
            path = self.manager.save(checkpoint_number=self.step)
        except (tf.errors.OpError, OSError) as e:
            name = os.path.join(directory, f"{CHECKPOINT_PREFIX}-{self.step}")
            shutil.rmtree(name + "_temp", ignore_errors=True)
            text = str(e).strip()
            reason = (text.splitlines()[0] if text else type(e).__name__)
            reason = reason.split("; ", 1)[-1] if "; " in reason else reason
            raise TrainingError(
                f"cannot save checkpoint {name} ({reason[:200]}): training stopped. The last "
                f"complete checkpoint is {self.manager.latest_checkpoint}; free space or fix the "
                f"permissions of {directory} and rerun to resume from it") from None
        if self.chief:
            logger.info("saved checkpoint %s", path)

    def _log_progress(self, scalars: Dict[str, float], run_start: float, run_start_step: int) -> None:
        if not self.chief:
            return
        config, step = self.config, self.step
        rate = (step - run_start_step) / max(time.time() - run_start, 1e-9)
        eta = (config.num_train_steps - step) / rate if rate > 0 else float("inf")
        logger.info(
            "step %d/%d (%.1f%%) loss %.4f mlm %.4f disc %.4f lr %.3g | %.1f ex/s %.0f tok/s | ETA %s",
            step, config.num_train_steps, 100.0 * step / config.num_train_steps,
            scalars["total_loss"], scalars["masked_lm_loss"], scalars["disc_loss"],
            scalars["learning_rate"], scalars["examples_per_second"],
            scalars["tokens_per_second"], _format_seconds(eta))

    # --------------------------------------------------------------------------------------------
    def _make_eval_loop(self):
        config, model, strategy = self.config, self.model, self.strategy

        def eval_fn(batch, index):
            # Eval masks come from their own seed stream, keyed by the batch index: the same
            # checkpoint always gives the same results.
            seed = tf.stack([tf.constant(config.seed, tf.int64),
                             tf.cast(index, tf.int64) + EVAL_SEED_OFFSET])
            outputs = model(batch, seed=seed, training=False)
            self.metrics.update_state(outputs["metric_inputs"])
            return outputs["total_loss"]

        @tf.function
        def eval_loop(iterator, num_steps):
            total = tf.constant(0.0)
            for i in tf.range(num_steps):
                per_replica = strategy.run(eval_fn, args=(next(iterator), i))
                total += strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
            return total / tf.cast(num_steps, tf.float32)

        return eval_loop

    def evaluate(self) -> Dict[str, float]:
        """Runs `num_eval_steps` batches of the held-out split in eval mode (no dropout).

        Writes `eval_results.txt` (sorted `name = value` lines, the official printout) and
        TensorBoard scalars under `model_dir/eval`.
        """
        config = self.config
        dataset = self._distributed_dataset(config.eval_tfrecords, config.eval_batch_size,
                                            is_training=False, record_plan=self._record_plan("eval"))
        iterator = iter(dataset)
        self.metrics.reset_state()
        if self._eval_loop is None:
            self._eval_loop = self._make_eval_loop()
        loss = float(self._eval_loop(iterator, tf.constant(config.num_eval_steps)))
        results = {k: float(v) for k, v in self.metrics.result().items()}
        results["loss"] = loss
        results["global_step"] = self.step
        if self.chief:
            path = os.path.join(config.model_dir, EVAL_RESULTS_NAME)
            with open(path + ".tmp", "w", encoding="utf-8") as f:
                for key in sorted(results):
                    f.write(f"{key} = {results[key]}\n")
            os.replace(path + ".tmp", path)
            writer = tf.summary.create_file_writer(os.path.join(config.model_dir, "eval"))
            with writer.as_default(step=self.step):
                for key, value in results.items():
                    if key != "global_step":
                        tf.summary.scalar(key, value)
            writer.close()
            logger.info("eval at step %d: %s", self.step,
                        ", ".join(f"{k} {results[k]:.4f}" for k in sorted(results) if k != "global_step"))
        return results


def _copy_atomically(source: str, target: str) -> None:
    shutil.copyfile(source, target + ".tmp")
    os.replace(target + ".tmp", target)


def _checkpoint_number(path: str) -> int:
    """N of a CheckpointManager path `.../ckpt-N` (the global step it was saved at)."""
    return int(os.path.basename(path).rsplit("-", 1)[1])


def checkpoint_problem(path: str) -> Optional[str]:
    """Why the checkpoint `path` (a prefix `.../ckpt-N`) cannot be restored, or None if it can.

    Reads every tensor back: the bundle reader checks each tensor's CRC32C, so a truncated or
    garbled `.data` file, a garbled `.index` or a missing file is found here, before any
    variable is assigned (costs one extra read of the checkpoint at start-up).
    """
    try:
        reader = tf.train.load_checkpoint(path)
        for name, dtype in reader.get_variable_to_dtype_map().items():
            if dtype == tf.variant:  # the data iterator's state: not convertible to numpy
                tf.raw_ops.RestoreV2(prefix=path, tensor_names=[name], shape_and_slices=[""],
                                     dtypes=[tf.variant])
            else:
                reader.get_tensor(name)
    except (tf.errors.OpError, ValueError, OSError, IndexError, RuntimeError, TypeError) as e:
        # (the reader raises IndexError for a data file cut short)
        text = str(e).strip()
        return (text.splitlines()[0] if text else type(e).__name__)[:300]
    return None


def checkpoint_candidates(directory: str) -> List[str]:
    """Checkpoint prefixes `ckpt-N` in `directory`, newest (highest N) first: every one with an
    index file, and those the `checkpoint` state file names (even if their files are gone)."""
    prefixes = {path[:-len(".index")] for path in
                tf.io.gfile.glob(os.path.join(directory, f"{CHECKPOINT_PREFIX}-*.index"))}
    try:
        state = tf.train.get_checkpoint_state(directory)
    except (tf.errors.OpError, ValueError):  # a garbled state file: the index files decide
        state = None
    if state is not None:
        for path in list(state.all_model_checkpoint_paths) + [state.model_checkpoint_path]:
            if path:
                prefixes.add(path if os.path.isabs(path) else os.path.join(directory, path))
    numbered = []
    for prefix in prefixes:
        try:
            numbered.append((_checkpoint_number(prefix), prefix))
        except ValueError:
            continue
    return [prefix for _, prefix in sorted(numbered, reverse=True)]


def latest_good_checkpoint(directory: str, at_step: Optional[int] = None) -> Optional[str]:
    """The newest checkpoint in `directory` that reads back intact (see `checkpoint_problem`).

    A corrupted, truncated or missing newer checkpoint (a crash or full disk mid-save, bit rot)
    is skipped with a warning naming it; the run resumes from the previous good one.

    Args:
        directory: a model (or worker checkpoint) directory.
        at_step: only consider the checkpoint of this step.

    Returns:
        The checkpoint prefix, or None if the directory holds no checkpoint at all.

    Raises:
        TrainingError: there are checkpoints but none is readable (never trains from garbage).
    """
    candidates = checkpoint_candidates(directory) if tf.io.gfile.isdir(directory) else []
    if at_step is not None:
        candidates = [c for c in candidates if _checkpoint_number(c) == at_step]
    bad = []
    for path in candidates:
        problem = checkpoint_problem(path)
        if problem is None:
            if bad:
                logger.warning("resuming from %s, the newest intact checkpoint", path)
            return path
        logger.warning("checkpoint %s is corrupted or incomplete, skipping it: %s", path, problem)
        bad.append(path)
    if bad and at_step is None:
        raise TrainingError(
            f"no readable checkpoint in {directory}: {', '.join(bad)} are corrupted or incomplete. "
            "Restore them from a backup, or use --overwrite to start afresh")
    return None


def _read_checkpoint_string(path: str, name: str) -> Optional[str]:
    """A string variable saved at the checkpoint's top level, or None if absent."""
    try:
        value = tf.train.load_checkpoint(path).get_tensor(f"{name}/.ATTRIBUTES/VARIABLE_VALUE")
    except (tf.errors.OpError, ValueError):
        return None
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _format_seconds(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m{seconds % 60:02d}s"


def run(config: PretrainingConfig, strategy: Optional[tf.distribute.Strategy] = None,
        overwrite: bool = False) -> dict:
    """Trains, evaluates and exports as the config says.

    Args:
        config: a resolved PretrainingConfig.
        strategy: optional strategy (default: from `config.strategy`).
        overwrite: delete an existing run first (see `Trainer`).

    Returns:
        {"train": last loop's scalars, "eval": eval results, "export": SavedModel paths,
         "final": {"global_step", "checkpoint", "weights_sha256"}}, for the phases that ran.
    """
    trainer = Trainer(config, strategy, overwrite=overwrite)
    results = {}
    if config.do_train:
        results["train"] = trainer.train()
    if config.do_eval:
        results["eval"] = trainer.evaluate()
    if config.do_export and trainer.chief:
        from electra_tf.training import export
        results["export"] = export.export_all(trainer.model, trainer.vocab, config)
    results["final"] = {"global_step": trainer.step,
                        "checkpoint": trainer.manager.latest_checkpoint,
                        "weights_sha256": trainer.weights_fingerprint()}
    logger.info("final: step %d, checkpoint %s, weights sha256 %s", trainer.step,
                results["final"]["checkpoint"], results["final"]["weights_sha256"])
    return results
