"""Checkpoints of a run on the JAX or PyTorch backend (no TensorFlow): `ckpt-N.npz` files.

TensorFlow's checkpoint format (`ckpt-N.index` + data) cannot be written without TensorFlow, so
a run on another Keras backend saves one NumPy archive per checkpoint, in the same run directory
and under the same numbering:

    ckpt-N.npz    model/<i>: the model's variables (trainable, then non-trainable: the dropout
                  seed states included, which `model.weights` leaves out);
                  optimizer/<i>: the optimizer's (`optimizer.variables`: iterations, Adam moments);
                  meta: a JSON object {"format", "step", "backend", "model_paths",
                  "optimizer_paths", "data_state", "data_key"}.
    init_checkpoint/ckpt-0.npz
                  weights imported by `from-google` (beside TensorFlow's `ckpt-0`): the model
                  and the imported step, no optimizer (`optimizer_paths` empty), no data position.

Each file is written whole under a temporary name, synced and renamed (`electra_tf.atomic`), so a
SIGKILL at any moment leaves the previous checkpoints intact and at most a hidden temporary file,
which the next run removes. The variables' paths are stored and compared on restore: a file of
another architecture is refused with a line naming the first differing variable (the paths are
compared without what Keras numbers per process: the model's own name, `electra_pretrainer_1`,
and its seed generators', `seed_generator_7`). The newest
intact file wins: every member is read back and its CRC-32 checked before a checkpoint is chosen
(`checkpoint_problem`), so one cut short by a full disk, or with a member damaged by bit rot or a
bad copy, is skipped with a warning naming it; a directory whose checkpoints are all damaged is
an error (never a silent fresh start over them).
"""

from __future__ import annotations

import json
import logging
import os
import re
import zipfile
import zlib
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import keras
import numpy as np

from electra_tf import atomic
from electra_tf.errors import TrainingError, error_line, shown_path
from electra_tf.training.checkpoint_files import CHECKPOINT_PREFIX

logger = logging.getLogger("electra_tf")

FORMAT = "electra-tf portable checkpoint 1"
SUFFIX = ".npz"
NAME_PATTERN = re.compile(rf"^{re.escape(CHECKPOINT_PREFIX)}-(\d+){re.escape(SUFFIX)}$")


class Saved(NamedTuple):
    """What a checkpoint holds besides the variables.

    Attributes:
        path: str. The file.
        step: int. The optimizer step it was saved at.
        data_state: dict or None. The training reader's position (`BatchReader.state()`).
        data_key: str or None. The fingerprint of the data pipeline the position belongs to.
    """

    path: str
    step: int
    data_state: Optional[dict]
    data_key: Optional[str]


def file_name(step: int) -> str:
    """`ckpt-<step>.npz`: the TensorFlow checkpoints' prefix and step, this format's suffix."""
    return f"{CHECKPOINT_PREFIX}-{step}{SUFFIX}"


def path_for(directory: str, step: int) -> str:
    return os.path.join(directory, file_name(step))


def checkpoints(directory: str) -> List[str]:
    """The `ckpt-N.npz` files of `directory`, newest (highest N) first."""
    if not os.path.isdir(directory):
        return []
    found = [(int(m.group(1)), name) for name in os.listdir(directory)
             if (m := NAME_PATTERN.match(name))]
    return [os.path.join(directory, name) for _, name in sorted(found, reverse=True)]


def model_variables(model) -> list:
    """What a checkpoint holds of the model, in order: its trainable variables, then the rest
    (the seed states of dropout included: a resumed run draws the same masks)."""
    return list(model.trainable_variables) + list(model.non_trainable_variables)


def canonical_path(path: str, model_name: str) -> str:
    """`path` without the parts Keras numbers per process (see the module docstring)."""
    if path.startswith(model_name + "/"):
        path = path[len(model_name) + 1:]
    return _NUMBERED_SEED.sub("seed_generator", path)


_NUMBERED_SEED = re.compile(r"seed_generator_\d+")
# What reading a damaged archive raises (zip: a bad CRC or header; numpy: a bad array header).
_READ_ERRORS = (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError, zlib.error)


def _variable_arrays(variables: Sequence) -> List[np.ndarray]:
    from keras import ops

    return [np.asarray(ops.convert_to_numpy(v.value)) for v in variables]


def save(directory: str, step: int, model, optimizer, data_state: Optional[dict],
         data_key: Optional[str], name: Optional[str] = None) -> str:
    """Writes `ckpt-<step>.npz` (or `name`) atomically; returns its path.

    `optimizer` None writes the model alone: `from-google`'s import, `ckpt-0.npz` holding the
    imported step, which a run starts from with a fresh optimizer whose step counter is `step`.

    Raises:
        TrainingError: the file cannot be written (a full disk, a read-only directory).
    """
    path = os.path.join(directory, name) if name else path_for(directory, step)
    optimizer_variables = list(optimizer.variables) if optimizer is not None else []
    meta = {"format": FORMAT, "step": int(step),
            "backend": keras.backend.backend(),
            "model_name": model.name,
            "model_paths": [v.path for v in model_variables(model)],
            "optimizer_paths": [v.path for v in optimizer_variables],
            "data_state": data_state, "data_key": data_key}
    arrays: Dict[str, np.ndarray] = {"meta": np.array(json.dumps(meta))}
    arrays.update({f"model/{i}": a
                   for i, a in enumerate(_variable_arrays(model_variables(model)))})
    arrays.update({f"optimizer/{i}": a
                   for i, a in enumerate(_variable_arrays(optimizer_variables))})
    try:
        with atomic.atomic_path(path) as tmp:
            with open(tmp, "wb") as f:
                np.savez(f, **arrays)
    except OSError as e:
        raise TrainingError(f"cannot write the checkpoint {shown_path(path)} ({error_line(e)}): "
                            "training stopped; free space and rerun to resume from the last "
                            "checkpoint") from None
    return path


def read_meta(path: str) -> dict:
    """The checkpoint's meta object.

    Raises:
        TrainingError: the file is not a readable checkpoint of this format.
    """
    meta, problem = _meta_or_problem(path)
    if problem is not None:
        raise TrainingError(f"checkpoint {shown_path(path)} is {problem}")
    return meta


def _meta_or_problem(path: str) -> Tuple[Optional[dict], Optional[str]]:
    """(the meta object, None), or (None, why it cannot be read: "unreadable (...)")."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            meta = json.loads(str(archive["meta"]))
    except _READ_ERRORS as e:
        return None, f"unreadable ({error_line(e)})"
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else None
        return None, f"not an electra-tf portable checkpoint (format {found!r})"
    return meta, None


def checkpoint_problem(path: str) -> Optional[str]:
    """Why the checkpoint at `path` cannot be read whole, or None if it can.

    Reads every member back (zip checks each one's CRC-32) and checks that the members the
    meta lists are all there, before any variable is assigned (costs one extra read of the
    file).

    Returns:
        None, or "unreadable (<reason>)", "damaged (<reason>)", "incomplete (<reason>)".
    """
    meta, problem = _meta_or_problem(path)
    if problem is not None:
        return problem
    try:
        with zipfile.ZipFile(path) as archive:
            names = set(archive.namelist())
            damaged = archive.testzip()
    except _READ_ERRORS as e:
        return f"damaged ({error_line(e)})"
    if damaged is not None:
        return f"damaged (member {damaged} fails its CRC-32 check: bit rot or a bad copy)"
    expected = [f"{prefix}/{i}.npy" for prefix in ("model", "optimizer")
                for i in range(len(meta.get(f"{prefix}_paths") or ()))]
    missing = [name for name in expected if name not in names]
    if missing:
        return f"incomplete (member {missing[0]} missing)"
    return None


def latest_good(directory: str) -> Optional[str]:
    """The newest checkpoint of `directory` that reads back whole (`checkpoint_problem`);
    damaged newer ones are skipped with a warning (their files are kept for inspection).

    Returns:
        The path, or None if the directory holds no checkpoint.

    Raises:
        TrainingError: there are checkpoints but none is intact (never a fresh start over them).
    """
    bad = []
    for path in checkpoints(directory):
        problem = checkpoint_problem(path)
        if problem is None:
            if bad:
                logger.warning("using %s, the newest intact checkpoint", shown_path(path))
            return path
        logger.warning("checkpoint %s is %s; trying an older checkpoint", shown_path(path),
                       problem)
        bad.append(f"{os.path.basename(path)} {problem}")
    if bad:
        raise TrainingError(f"no intact checkpoint in {shown_path(directory)}: "
                            f"{'; '.join(bad)}. Restore them from a backup, or use --overwrite "
                            "to start afresh")
    return None


def check_named(path: str) -> None:
    """A checkpoint asked for by name (`--checkpoint ckpt-N.npz`): no fallback, but a damaged
    one is a one-line error naming the intact ones beside it.

    Raises:
        TrainingError: `path` is damaged.
    """
    problem = checkpoint_problem(path)
    if problem is None:
        return
    beside = [os.path.basename(p) for p in checkpoints(os.path.dirname(path) or ".")
              if os.path.basename(p) != os.path.basename(path) and checkpoint_problem(p) is None]
    raise TrainingError(f"checkpoint {shown_path(path)} is {problem}; " + (
        f"intact checkpoints beside it: {', '.join(beside)}" if beside
        else "no intact checkpoint beside it"))


def _assign(variables: Sequence, archive, prefix: str, saved: List[str], built: List[str],
            path: str) -> None:
    if len(saved) != len(built) or saved != built:
        for i, (theirs, mine) in enumerate(zip(saved + [None] * len(built),
                                               built + [None] * len(saved))):
            if mine != theirs:
                raise TrainingError(
                    f"checkpoint {shown_path(path)} holds other {prefix} variables than this run "
                    f"builds ({prefix} variable {i}: saved {theirs!r}, built {mine!r}): another "
                    "architecture; use the run's hparams or another --model-name")
    for i, variable in enumerate(variables):
        value = archive[f"{prefix}/{i}"]
        if tuple(value.shape) != tuple(variable.shape):
            raise TrainingError(f"checkpoint {shown_path(path)}: {variable.path} has shape "
                                f"{value.shape}, the model {tuple(variable.shape)}")
        variable.assign(value)


def restore(path: str, model, optimizer) -> Saved:
    """Assigns the checkpoint's variables to `model` and `optimizer` (None: the model's only).

    Raises:
        TrainingError: unreadable, or of another architecture.
    """
    meta = read_meta(path)
    variables = model_variables(model)
    saved_name = meta.get("model_name", model.name)
    try:
        _restore_variables(path, meta, model, variables, saved_name, optimizer)
    except _READ_ERRORS as e:  # damaged since `latest_good` read it whole
        raise TrainingError(f"checkpoint {shown_path(path)} is damaged ({error_line(e)}); "
                            "rerun to fall back to an older intact checkpoint") from None
    return Saved(path, int(meta["step"]), meta.get("data_state"), meta.get("data_key"))


def _restore_variables(path: str, meta: dict, model, variables: list, saved_name: str,
                       optimizer) -> None:
    with np.load(path, allow_pickle=False) as archive:
        _assign(variables, archive, "model",
                [canonical_path(p, saved_name) for p in meta["model_paths"]],
                [canonical_path(v.path, model.name) for v in variables], path)
        if optimizer is not None:
            # The optimizer's variable names embed the model's (numbered) names: its variables
            # follow the model's, so their count and shapes are what is checked.
            count = len(meta["optimizer_paths"])
            _assign(optimizer.variables, archive, "optimizer", [str(i) for i in range(count)],
                    [str(i) for i in range(len(optimizer.variables))], path)


def enforce_retention(directory: str, keep: Optional[int]) -> List[str]:
    """Deletes all but the newest `keep` checkpoints (None or 0: keep all); returns the deleted."""
    if not keep:
        return []
    deleted = []
    for path in checkpoints(directory)[keep:]:
        try:
            os.remove(path)
            deleted.append(path)
        except FileNotFoundError:
            pass
    return deleted
