"""The builder's output directory: temporary names, safety checks, installing and replacing.

Shards are written under hidden temporary names (`.partial-<pid>-...`) and renamed when all are
complete; the shuffle's bucket files live in a hidden `.partial-<pid>-shuffle/` directory. The
previous dataset's files (manifest, shards, inputs.jsonl; nothing else) are replaced only with
`overwrite`; the manifest is written last, so a directory with our files and no manifest is a
build that was interrupted.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from typing import Dict, List, Optional, Sequence, Tuple

from electra_tf import atomic
from electra_tf.data.records.tfrecord_io import EVAL_PREFIX, MANIFEST_NAME, TRAIN_PREFIX, shard_name
from electra_tf.errors import BuildError, error_line, shown_path
from electra_tf.locking import LOCK_NAME

logger = logging.getLogger(__name__)

TMP_PREFIX = ".partial-"  # hidden: never matched by the trainer's `pretrain_data.tfrecord*` glob
INPUTS_NAME = "inputs.jsonl"  # one line per input file: sizes, documents, examples, problems
_OUR_FILES = re.compile(
    r"^(%s|%s)-\d+-of-\d+$" % (re.escape(TRAIN_PREFIX), re.escape(EVAL_PREFIX)))


def is_our_file(name: str) -> bool:
    return name in (MANIFEST_NAME, INPUTS_NAME) or bool(_OUR_FILES.match(name))


def is_temporary(name: str) -> bool:
    """A build's temporary: a `.partial-*` shard or directory, or an unfinished atomic write
    (`manifest.json`)."""
    return name.startswith(TMP_PREFIX) or atomic.is_temporary(name)


def temp_prefix(output_dir: str) -> str:
    """Prefix of this build's temporary paths (the pid keeps two builds into one dir apart)."""
    return os.path.join(output_dir, f"{TMP_PREFIX}{os.getpid()}-")


def check_output_dir(output_dir: str, overwrite: bool) -> None:
    """Refuses a non-empty output dir without `overwrite`; clears an interrupted build with it."""
    names = [n for n in (os.listdir(output_dir) if os.path.isdir(output_dir) else [])
             if n != LOCK_NAME]  # this build's own lock
    partial = [n for n in names if is_temporary(n)]
    if names and MANIFEST_NAME not in names and all(
            is_temporary(n) or is_our_file(n) for n in names):
        # A build killed before its manifest (written last): its shards are incomplete or
        # unverified, never to be mixed with a new build's.
        if not overwrite:
            raise BuildError(
                f"output dir {shown_path(output_dir)} holds an interrupted build ({len(partial)} "
                f"temporary {TMP_PREFIX}* file(s), {len(names) - len(partial)} shard(s), no "
                f"{MANIFEST_NAME}); pass --overwrite to delete it and build afresh")
        logger.warning("--overwrite: removing an interrupted build in %s (%d temporary files, no "
                       "%s)", output_dir, len(partial), MANIFEST_NAME)
        remove_previous_dataset(output_dir, keep=())
        return
    if names and not overwrite:
        raise BuildError(
            f"output dir {shown_path(output_dir)} exists and is not empty; pass --overwrite to replace "
            f"the dataset in it")


def remove_previous_dataset(output_dir: str, keep: Sequence[str]) -> int:
    """Deletes a previous build's manifest, shards, inputs.jsonl and leftover temporaries.

    Only entries with the builder's own names are touched; `keep` (this build's temporary
    files) survives.
    """
    keep = {os.path.basename(path) for path in keep}
    removed = 0
    for name in sorted(os.listdir(output_dir)):
        if name in keep or not (is_our_file(name) or is_temporary(name)):
            continue
        path = os.path.join(output_dir, name)
        if os.path.isdir(path) and not os.path.islink(path) and is_temporary(name):
            shutil.rmtree(path)
            removed += 1
        elif os.path.isfile(path) or os.path.islink(path):
            os.remove(path)
            removed += 1
    return removed


def install_shards(output_dir: str, overwrite: bool, temp_paths: Sequence[str],
                   shard_tmp: Dict[str, Dict[int, str]],
                   shard_counts: Dict[str, Dict[int, int]]) -> Dict[str, List[dict]]:
    """Replaces the previous dataset (with overwrite) by the new shards; returns their entries.

    Non-empty temporary shards are renamed to consecutive final names (a small corpus never
    yields empty files); empty ones were never created.
    """
    if overwrite:
        removed = remove_previous_dataset(output_dir, keep=temp_paths)
        if removed:
            logger.info("--overwrite: removed %d files of the previous dataset in %s", removed,
                        output_dir)
    entries = {}
    for split, shards in final_shard_names(shard_counts).items():
        entries[split] = []
        for i, name, count in shards:
            path = os.path.join(output_dir, name)
            os.replace(shard_tmp[split][i], path)
            entries[split].append({"file": name, "examples": count,
                                   "bytes": os.path.getsize(path)})
    return entries


def final_shard_names(shard_counts: Dict[str, Dict[int, int]]
                      ) -> Dict[str, List[Tuple[int, str, int]]]:
    """Per split, (planned shard index, final name, examples) of the shards with examples.

    Empty shards are dropped and the rest numbered consecutively (`<prefix>-k-of-m`).
    """
    names = {}
    for split, prefix in (("train", TRAIN_PREFIX), ("eval", EVAL_PREFIX)):
        counts = shard_counts.get(split, {})
        nonempty = [i for i in sorted(counts) if counts[i] > 0]
        names[split] = [(i, shard_name(prefix, k, len(nonempty)), counts[i])
                        for k, i in enumerate(nonempty)]
    return names


def remove_temporaries(paths: Sequence[str]) -> None:
    """Deletes this build's temporary files and directories that exist (after a failure)."""
    for path in paths:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.lexists(path):
            os.remove(path)


def write_error(error: BaseException, what: str, directory: str,
                output_dir: Optional[str] = None) -> BuildError:
    """The one-line BuildError for a failed write (a full disk, a read-only directory; also
    TensorFlow's file errors, which are not OSErrors).

    Args:
        error: what the write raised.
        what: what could not be written ("the train shards").
        directory: where.
        output_dir: the build's --output-dir (default: `directory`); the message advises
            --overwrite only if a rerun needs it there (`rerun_needs_overwrite`).
    """
    advice = " with --overwrite" if rerun_needs_overwrite(output_dir or directory) else ""
    return BuildError(f"cannot write {what} in {shown_path(directory)} ({error_line(error)}); "
                      f"free space there (or choose another --output-dir) and rerun{advice}")


def rerun_needs_overwrite(output_dir: str) -> bool:
    """Whether `output_dir` holds anything but a build's temporaries (removed when it fails)
    and its lock: then a rerun there needs --overwrite (`check_output_dir`)."""
    try:
        if "://" in output_dir:  # the Beam build's gs://...
            import tensorflow as tf

            names = [n.rstrip("/") for n in tf.io.gfile.listdir(output_dir)]
        else:
            names = os.listdir(output_dir)
    except Exception:  # noqa: BLE001 -- gone or unreadable: nothing to replace there
        return False
    return any(name != LOCK_NAME and not is_temporary(name) for name in names)
