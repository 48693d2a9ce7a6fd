"""Where a pretraining run on JAX or PyTorch starts (`portable_trainer`): the newest checkpoint
every host sees, else the weights `from-google` imported, what a saved data position depends on,
and this host's training reader. Free of TensorFlow."""

from __future__ import annotations

import os
from typing import Optional

from electra_tf.config import PretrainingConfig
from electra_tf.data.records.record_reader import BatchReader
from electra_tf.errors import TrainingError, shown_path
from electra_tf.training import checkpoint_files, npz_checkpoint, run_base
from electra_tf.training.portable import hosts


def train_reader(config: PretrainingConfig, plan: Optional[dict], seed: int,
                 run_hosts: hosts.Hosts = hosts.Hosts(), prefetch: int = 2) -> BatchReader:
    """This host's training batches: input pipeline `index` of `count`, `global / count` rows
    each (one host: the whole global batch), as the TensorFlow worker of that index reads;
    `prefetch` batches decoded ahead by the reader's thread (a call's worth: its
    steps_per_execution)."""
    return BatchReader(config.pretrain_tfrecords,
                       batch_size=config.train_batch_size // run_hosts.count,
                       max_seq_length=config.max_seq_length, is_training=True, seed=seed,
                       num_input_pipelines=run_hosts.count, input_pipeline_id=run_hosts.index,
                       record_plan=plan, prefetch=prefetch)


def same_checkpoint_everywhere(found: Optional[str], run_hosts: hosts.Hosts,
                               model_dir: str) -> Optional[str]:
    """`found` if every host found the same newest checkpoint (one directory they all
    read), else a TrainingError on every host.

    Args:
        found: this host's newest good checkpoint in `model_dir` (None: none).
        run_hosts: the run's hosts (one collective among them).
        model_dir: str. The run directory, named in the error.

    Raises:
        TrainingError: the hosts see different checkpoints.
    """
    step = -1 if found is None else int(npz_checkpoint.NAME_PATTERN.match(
        os.path.basename(found)).group(1))
    steps = [int(s) for s in hosts.gather_ints(run_hosts, [step + 1])[:, 0] - 1]
    if len(set(steps)) > 1:
        seen = ", ".join(f"host {i}: {npz_checkpoint.file_name(s) if s >= 0 else 'none'}"
                         for i, s in enumerate(steps))
        raise TrainingError(
            f"the hosts see different checkpoints in {model_dir} ({seen}): the "
            "model dir must be one directory every host reads (a shared filesystem); host 0 "
            "writes it")
    return found


def imported_start(model_dir: str, backend: str) -> Optional[str]:
    """The weights `from-google` imported into `model_dir` in a form this backend reads
    (`init_checkpoint/ckpt-0.npz`: the model and the imported step), or None without an import.

    Raises:
        TrainingError: an import holding only TensorFlow's checkpoint (written before
            `from-google` wrote the portable copy), or a damaged copy.
    """
    init_dir = os.path.join(model_dir, checkpoint_files.INIT_CHECKPOINT_DIR)
    if not os.path.isdir(init_dir):
        return None
    path = os.path.join(init_dir, checkpoint_files.INIT_PORTABLE_NAME)
    again = ("import the weights again: electra-convert from-google ... --output-dir "
             f"{shown_path(model_dir)} --overwrite (where TensorFlow is installed)")
    if not os.path.exists(path):
        raise TrainingError(
            f"{shown_path(init_dir)} holds TensorFlow's checkpoint only (an import by an older "
            f"electra-tf, without {checkpoint_files.INIT_PORTABLE_NAME}), which --backend "
            f"{backend} cannot read: {again}, or train with --backend tensorflow")
    problem = npz_checkpoint.checkpoint_problem(path)
    if problem is not None:
        raise TrainingError(f"the imported checkpoint {shown_path(path)} is {problem}: {again}")
    return path


def data_key(config: PretrainingConfig, plan: Optional[dict], run_hosts: hosts.Hosts) -> str:
    """What a saved data position depends on (`run_base.data_position_key`, as the TensorFlow
    run's): computed once per run (it stats every shard), saved with every checkpoint.

    Args:
        config: the run's config.
        plan: the training split's record plan (`dataset_checks.record_plan`), or None.
        run_hosts: the run's hosts (several: one reader per host).

    Returns:
        str. The sha256 hex digest of the shards, batch, seed, sequence length, backend, readers
        and plan.
    """
    pipeline = {"backend": config.backend}
    if run_hosts.several:  # one reader per host (one host: the key of before)
        pipeline["input_pipelines"] = run_hosts.count
    return run_base.data_position_key(config, plan, pipeline)
