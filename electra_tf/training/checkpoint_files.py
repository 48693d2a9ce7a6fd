"""The checkpoint files of a run directory: which `ckpt-N` to read, whether it is intact, the
`checkpoint` state file's repair, and the leftovers of interrupted saves.

Readers (the trainer's resume, export, the converters, fine-tuning) go through
`checkpoint_to_read` / `latest_good_checkpoint`, so a damaged newer checkpoint is skipped with a
warning naming it (and the tensor that is damaged) everywhere alike. What a checkpoint holds, under
which keys, is `run_checkpoint`'s.

TensorFlow is imported only by the functions that read checkpoints.
"""

from __future__ import annotations

import logging
import os
import re
from typing import List, NamedTuple, Optional

from electra_tf import atomic
from electra_tf.errors import TrainingError, error_line, shown_path

logger = logging.getLogger("electra_tf")

# tf.train.CheckpointManager's checkpoint_name: checkpoints are `ckpt-<global step>`.
CHECKPOINT_PREFIX = "ckpt"
CHECKPOINT_STATE_NAME = "checkpoint"  # TensorFlow's state file: the latest and kept checkpoints
# Where `from-google` puts the imported weights (`tf.train.Checkpoint(model=..., step=...)`); a run
# starts from them when it has no checkpoint of its own.
INIT_CHECKPOINT_DIR = "init_checkpoint"
# Beside it, the same weights and step in `npz_checkpoint`'s format (no TensorFlow needed):
# what a run on JAX or PyTorch starts from.
INIT_PORTABLE_NAME = f"{CHECKPOINT_PREFIX}-0.npz"
# Checkpoint keys of the step counter: the trainer's optimizer, or from-google's `step`.
_STEP_KEYS = ("optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE",
              "optimizer/iterations/.ATTRIBUTES/VARIABLE_VALUE",
              "step/.ATTRIBUTES/VARIABLE_VALUE")


def run_checkpoint(model, *, step=None, **state):
    """A `tf.train.Checkpoint` of the run's layout: the pretrainer under `model`, and either the
    imported step counter under `step` (`from-google`, `_STEP_KEYS`) or the trainer's `state`
    (optimizer, RNG states, data position).

    Every writer and reader of a run's checkpoints builds it here, so their keys agree; a reader
    given only `model` reads the weights of any of them (with `expect_partial`).
    """
    import tensorflow as tf

    items = {"model": model, **state}
    if step is not None:
        items["step"] = step
    return tf.train.Checkpoint(**items)


def checkpoint_number(path: str) -> int:
    """N of a checkpoint prefix `.../ckpt-N` (the global step it was saved at)."""
    return int(os.path.basename(path).rsplit("-", 1)[1])


def checkpoint_problem(path: str) -> Optional[str]:
    """Why the checkpoint `path` (a prefix `.../ckpt-N`) must not be restored, or None.

    Reads every tensor back: the bundle reader checks each tensor's CRC32C, so a truncated or
    garbled `.data` file, a garbled `.index` or a missing file is found here, before any
    variable is assigned (costs one extra read of the checkpoint), and the damaged tensor is
    named. A floating-point tensor holding NaN or Inf (weights that diverged, saved by an older
    version or another tool) makes the checkpoint unusable too: resuming from it could only
    fail again.

    Returns:
        None, "corrupted or incomplete: <reason>" (naming the tensor when one is damaged) or
        "non-finite: NaN or Inf in <tensor>".
    """
    import numpy as np
    import tensorflow as tf

    errors = (tf.errors.OpError, ValueError, OSError, IndexError, RuntimeError, TypeError)
    # (the reader raises IndexError for a data file cut short)
    try:
        reader = tf.train.load_checkpoint(path)
        tensors = sorted(reader.get_variable_to_dtype_map().items())
        names = _variable_names(reader)
    except errors as e:
        return f"corrupted or incomplete: {error_line(e)}"
    for key, dtype in tensors:
        name = f"{names[key]} ({key})" if names.get(key, key) != key else key
        try:
            if dtype == tf.variant:  # the data iterator's state: not convertible to numpy
                tf.raw_ops.RestoreV2(prefix=path, tensor_names=[key], shape_and_slices=[""],
                                     dtypes=[tf.variant])
                continue
            value = reader.get_tensor(key)
        except errors as e:
            return f"corrupted or incomplete: tensor {name} is damaged ({error_line(e)})"
        if dtype.is_floating and not np.isfinite(value).all():
            return f"non-finite: NaN or Inf in {name}"
    return None


def _variable_names(reader) -> dict:
    """{checkpoint key: the variable's name} from a TF2 checkpoint's object graph (keras 3
    keeps the model's weights under `optimizer/_trainable_variables/N`; the graph records
    that N is, say, `electra/layer_1/feedforward_output_dense/kernel`). Empty for a TF1
    checkpoint or a damaged graph (the keys are then the names)."""
    from tensorflow.core.protobuf import trackable_object_graph_pb2

    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    try:
        graph.ParseFromString(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
    except Exception:  # noqa: BLE001 (absent: TF1; damaged: its CRC error comes per tensor)
        return {}
    return {attribute.checkpoint_key: attribute.full_name for node in graph.nodes
            for attribute in node.attributes if attribute.full_name}


def checkpoint_candidates(directory: str) -> List[str]:
    """Checkpoint prefixes `ckpt-N` in `directory`, newest (highest N) first: every one with an
    index file, and those the `checkpoint` state file names (even if their files are gone)."""
    import tensorflow as tf

    prefixes = {path[:-len(".index")] for path in
                tf.io.gfile.glob(os.path.join(directory, f"{CHECKPOINT_PREFIX}-*.index"))}
    try:
        state = tf.train.get_checkpoint_state(directory)
    except (tf.errors.OpError, ValueError):  # a garbled state file: the index files decide
        state = None
    if state is not None:
        # get_checkpoint_state has already joined relative entries with `directory` (joining
        # again named `models/x/models/x/ckpt-N`, "corrupted", when `directory` is relative).
        prefixes.update(path for path in list(state.all_model_checkpoint_paths)
                        + [state.model_checkpoint_path] if path)
    numbered = []
    for prefix in prefixes:
        try:
            numbered.append((checkpoint_number(prefix), prefix))
        except ValueError:
            continue
    return [prefix for _, prefix in sorted(numbered, reverse=True)]


def checkpoint_state_problem(directory: str) -> Optional[str]:
    """What is wrong with `directory`'s `checkpoint` state file, or None (also when absent).

    A power loss after an unsynced rename leaves it empty; bit rot leaves bytes TensorFlow
    cannot parse (a ValueError, or a UnicodeDecodeError, from every reader of the directory).
    """
    import tensorflow as tf

    path = os.path.join(directory, CHECKPOINT_STATE_NAME)
    if not os.path.exists(path):
        return None
    if os.path.getsize(path) == 0:
        return "it is empty (0 bytes)"
    try:
        state = tf.train.get_checkpoint_state(directory)
    except (tf.errors.OpError, ValueError) as e:
        return f"unreadable: {error_line(e, limit=120)}"
    if state is None or not state.model_checkpoint_path:
        return "it names no checkpoint"
    return None


def repair_checkpoint_state(directory: str) -> Optional[str]:
    """Rewrites a damaged `checkpoint` state file from the `ckpt-N` files on disk.

    The rewritten file lists every checkpoint with an index file and names the newest as the
    latest (whether it is intact is checked when it is read, `latest_good_checkpoint`). It is
    written atomically and synced. Call only while holding the directory's lock.

    Returns:
        The problem found (and repaired), or None if the state file was fine or absent.

    Raises:
        TrainingError: the file is damaged and cannot be rewritten (a read-only directory).
    """
    problem = checkpoint_state_problem(directory)
    if problem is None:
        return None
    prefixes = _indexed_checkpoints(directory)
    path = os.path.join(directory, CHECKPOINT_STATE_NAME)
    try:
        if prefixes:
            _write_state(directory, prefixes[-1], prefixes)
        else:
            os.remove(path)
    except OSError as e:
        raise TrainingError(f"the checkpoint state file {shown_path(path)} is damaged ({problem}) "
                            f"and cannot be rewritten: {error_line(e)}") from None
    logger.warning("the checkpoint state file %s was damaged (%s): rewritten from the %d "
                   "checkpoint(s) on disk", shown_path(path), problem, len(prefixes))
    return problem


def _write_state(directory: str, latest: str, listed: List[str]) -> None:
    """Writes the `checkpoint` state file (atomically, synced) naming `latest` and `listed`
    (prefixes, oldest first) by their base names, as TensorFlow does.

    Each listed checkpoint gets its index file's time as its timestamp, and the "last preserved"
    time is before all of them: TensorFlow's CheckpointManager deletes (beyond max_to_keep)
    only checkpoints with a timestamp after that time, so without them it never would.
    """
    names = [os.path.basename(prefix) for prefix in listed]
    times = [os.path.getmtime(prefix + ".index") for prefix in listed]
    atomic.write_text(os.path.join(directory, CHECKPOINT_STATE_NAME),
                      f'model_checkpoint_path: "{os.path.basename(latest)}"\n'
                      + "".join(f'all_model_checkpoint_paths: "{name}"\n' for name in names)
                      + "".join(f"all_model_checkpoint_timestamps: {t!r}\n" for t in times)
                      + f"last_preserved_timestamp: {min(times, default=1.0) - 1.0!r}\n")


def _indexed_checkpoints(directory: str) -> List[str]:
    """Prefixes of the `ckpt-N` with an index file in `directory`, oldest (lowest N) first."""
    pattern = re.compile(rf"^{CHECKPOINT_PREFIX}-(\d+)\.index$")
    found = []
    for name in os.listdir(directory):
        match = pattern.match(name)
        if match:
            found.append((int(match.group(1)), os.path.join(directory, name[:-len(".index")])))
    return [prefix for _, prefix in sorted(found)]


def latest_good_checkpoint(directory: str, at_step: Optional[int] = None) -> Optional[str]:
    """The newest checkpoint in `directory` that reads back intact (see `checkpoint_problem`).

    A corrupted, truncated or missing newer checkpoint (a crash or full disk mid-save, bit rot)
    is skipped with a warning naming it; the run resumes from the previous good one.

    Args:
        directory: a run (or worker checkpoint) directory.
        at_step: only consider the checkpoint of this step.

    Returns:
        The checkpoint prefix, or None if the directory holds no checkpoint at all.

    Raises:
        TrainingError: there are checkpoints but none is readable (never trains from garbage).
    """
    import tensorflow as tf

    candidates = checkpoint_candidates(directory) if tf.io.gfile.isdir(directory) else []
    if at_step is not None:
        candidates = [c for c in candidates if checkpoint_number(c) == at_step]
    bad = []
    for path in candidates:
        problem = checkpoint_problem(path)
        if problem is None:
            if bad:
                logger.warning("resuming from %s, the newest intact checkpoint", path)
            return path
        kind, detail = problem.split(": ", 1)
        logger.warning("checkpoint %s is %s, skipping it: %s", path, kind, detail)
        bad.append(f"{os.path.basename(path)} ({problem})")
    if bad and at_step is None:
        raise TrainingError(
            f"no readable checkpoint in {directory}: {'; '.join(bad)}. Restore them from a "
            "backup, or use --overwrite to start afresh")
    return None


class CheckpointToRead(NamedTuple):
    """Which checkpoint a run starts from, or an export / conversion / fine-tuning reads.

    Attributes:
        path: str. The checkpoint prefix.
        imported: bool. True for `init_checkpoint/` (`from-google`: model and step only).
    """

    path: str
    imported: bool


def checkpoint_to_read(model_dir: str, checkpoint: Optional[str] = None) -> Optional[CheckpointToRead]:
    """The checkpoint to read, in this order: `checkpoint` if given (a prefix, or a directory's
    latest), else the run's newest intact checkpoint (`latest_good_checkpoint`), else the imported
    `init_checkpoint/`; None if the run has none.

    Raises:
        TrainingError: `checkpoint` names no checkpoint, or the run's are all unreadable.
    """
    import tensorflow as tf

    if checkpoint:
        if os.path.isdir(checkpoint):
            found = latest_good_checkpoint(checkpoint)
            if found is None:
                raise TrainingError(f"--checkpoint {checkpoint}: directory has no checkpoint")
            return CheckpointToRead(found, imported=False)
        if not tf.io.gfile.exists(checkpoint + ".index"):
            raise TrainingError(f"--checkpoint {checkpoint}: no such checkpoint "
                                f"({checkpoint}.index missing)")
        problem = checkpoint_problem(checkpoint)
        if problem is not None:  # asked for by name: no fallback, but say what else there is
            older = [os.path.basename(c) for c in checkpoint_candidates(os.path.dirname(checkpoint))
                     if c != checkpoint and checkpoint_problem(c) is None]
            raise TrainingError(f"checkpoint {checkpoint} is {problem}; " + (
                f"intact checkpoints beside it: {', '.join(older)}" if older else
                "no intact checkpoint beside it"))
        return CheckpointToRead(checkpoint, imported=False)
    own = latest_good_checkpoint(model_dir)
    if own is not None:
        return CheckpointToRead(own, imported=False)
    init_dir = os.path.join(model_dir, INIT_CHECKPOINT_DIR)
    imported = latest_good_checkpoint(init_dir)
    return CheckpointToRead(imported, imported=True) if imported else None


def checkpoint_step(path: str) -> int:
    """The step stored in an electra-tf checkpoint (optimizer iterations or `step`), else the
    number in its name (`ckpt-1000`), else 0."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(path)
    for key in _STEP_KEYS:
        if reader.has_tensor(key):
            return int(reader.get_tensor(key))
    match = re.search(r"-(\d+)$", path)
    return int(match.group(1)) if match else 0


# What an interrupted save leaves: TensorFlow's per-save staging directory (`ckpt-N_temp/`, the
# shards before they are merged) and its temporary state file (`checkpoint.tmp<hex>`).
_SAVE_LEFTOVER = re.compile(rf"^({CHECKPOINT_PREFIX}-\d+_temp|{CHECKPOINT_STATE_NAME}\.tmp[0-9a-f]*)$")


def remove_leftovers(directory: str, export_dir: Optional[str] = None) -> List[str]:
    """Deletes what interrupted saves and exports left behind (a SIGKILL, SIGTERM or power loss
    mid-write): `ckpt-N_temp/` and `checkpoint.tmp*` in `directory`, the temporaries of
    interrupted atomic writes (`.config.json.tmp-*`, ...) there, in `export_dir` and in its
    network folders (an export's staging directory `export/discriminator/.<step>.tmp-*`). Logs one warning listing them.

    Only safe while holding the directory's lock: a live writer's files look the same.

    Returns:
        The paths removed.
    """
    import shutil

    removed = []
    for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:
        if _SAVE_LEFTOVER.match(name):
            path = os.path.join(directory, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.remove(path)
            removed.append(path)
    removed += atomic.remove_temporaries(directory)
    if export_dir:
        removed += atomic.remove_temporaries(export_dir)
        # Versioned exports (export/<network>/<step>/) stage beside their version folder.
        for name in sorted(os.listdir(export_dir)) if os.path.isdir(export_dir) else []:
            network_dir = os.path.join(export_dir, name)
            if not atomic.is_temporary(name) and os.path.isdir(network_dir):
                removed += atomic.remove_temporaries(network_dir)
    if removed:
        logger.warning("removed %d leftover(s) of interrupted saves or exports: %s", len(removed),
                       ", ".join(shown_path(p) for p in removed))
    return removed


def enforce_retention(directory: str, restored: Optional[str], max_to_keep: Optional[int]
                      ) -> List[str]:
    """Keeps at most `max_to_keep` checkpoints, counting the `ckpt-N` files on disk (not only
    those the `checkpoint` state file lists: a save interrupted after its files were written
    but before the state file was updated is on disk too), and rewrites the state file to list
    the kept ones with `restored` as the latest, so TensorFlow's manager deletes the oldest
    from then on.

    Only checkpoints up to `restored` (the one the run resumed from) count; newer ones were
    skipped as damaged and are left for the run to overwrite. Call while holding the lock.

    Returns:
        The checkpoint prefixes deleted.
    """
    import tensorflow as tf

    if (not max_to_keep or restored is None
            or os.path.dirname(os.path.abspath(restored)) != os.path.abspath(directory)):
        return []
    limit = checkpoint_number(restored)
    older = [p for p in _indexed_checkpoints(directory) if checkpoint_number(p) <= limit]
    doomed, kept = older[:-max_to_keep], older[-max_to_keep:]
    for prefix in doomed:
        for path in tf.io.gfile.glob(prefix + ".*"):
            os.remove(path)
    state = tf.train.get_checkpoint_state(directory)
    names = [os.path.basename(p) for p in kept]
    listed = ([os.path.basename(p) for p in state.all_model_checkpoint_paths],
              os.path.basename(state.model_checkpoint_path)) if state else None
    if listed != (names, os.path.basename(restored)):
        _write_state(directory, restored, kept)
    if doomed:
        logger.warning("keep_checkpoint_max=%d: deleted %d older checkpoint(s) found on disk "
                       "(left by interrupted runs): %s", max_to_keep, len(doomed),
                       ", ".join(os.path.basename(p) for p in doomed))
    return doomed
