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
from typing import Dict, List, Sequence

from electra_tf.data.build_worker import BuildError
from electra_tf.data.tfrecord_io import EVAL_PREFIX, MANIFEST_NAME, TRAIN_PREFIX, shard_name

logger = logging.getLogger(__name__)

TMP_PREFIX = ".partial-"  # hidden: never matched by the trainer's `pretrain_data.tfrecord*` glob
INPUTS_NAME = "inputs.jsonl"  # one line per input file: sizes, documents, examples, problems
_OUR_FILES = re.compile(
    r"^(%s|%s)-\d+-of-\d+$" % (re.escape(TRAIN_PREFIX), re.escape(EVAL_PREFIX)))


def is_our_file(name: str) -> bool:
    return name in (MANIFEST_NAME, INPUTS_NAME) or bool(_OUR_FILES.match(name))


def temp_prefix(output_dir: str) -> str:
    """Prefix of this build's temporary paths (the pid keeps two builds into one dir apart)."""
    return os.path.join(output_dir, f"{TMP_PREFIX}{os.getpid()}-")


def check_output_dir(output_dir: str, overwrite: bool) -> None:
    """Refuses a non-empty output dir without `overwrite`; clears an interrupted build with it."""
    names = os.listdir(output_dir) if os.path.isdir(output_dir) else []
    partial = [n for n in names if n.startswith(TMP_PREFIX)]
    if names and MANIFEST_NAME not in names and all(
            n.startswith(TMP_PREFIX) or is_our_file(n) for n in names):
        # A build killed before its manifest (written last): its shards are incomplete or
        # unverified, never to be mixed with a new build's.
        if not overwrite:
            raise BuildError(
                f"output dir {output_dir} holds an interrupted build ({len(partial)} "
                f"temporary {TMP_PREFIX}* file(s), {len(names) - len(partial)} shard(s), no "
                f"{MANIFEST_NAME}); pass --overwrite to delete it and build afresh")
        logger.warning("--overwrite: removing an interrupted build in %s (%d temporary files, no "
                       "%s)", output_dir, len(partial), MANIFEST_NAME)
        remove_previous_dataset(output_dir, keep=())
        return
    if names and not overwrite:
        raise BuildError(
            f"output dir {output_dir} exists and is not empty; pass --overwrite to replace "
            f"the dataset in it")


def remove_previous_dataset(output_dir: str, keep: Sequence[str]) -> int:
    """Deletes a previous build's manifest, shards, inputs.jsonl and leftover temporaries.

    Only entries with the builder's own names are touched; `keep` (this build's temporary
    files) survives.
    """
    keep = {os.path.basename(path) for path in keep}
    removed = 0
    for name in sorted(os.listdir(output_dir)):
        if name in keep or not (is_our_file(name) or name.startswith(TMP_PREFIX)):
            continue
        path = os.path.join(output_dir, name)
        if os.path.isdir(path) and not os.path.islink(path) and name.startswith(TMP_PREFIX):
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
    for split, prefix in (("train", TRAIN_PREFIX), ("eval", EVAL_PREFIX)):
        counts = shard_counts.get(split, {})
        nonempty = [i for i in sorted(counts) if counts[i] > 0]
        entries[split] = []
        for k, i in enumerate(nonempty):
            name = shard_name(prefix, k, len(nonempty))
            path = os.path.join(output_dir, name)
            os.replace(shard_tmp[split][i], path)
            entries[split].append({"file": name, "examples": counts[i],
                                   "bytes": os.path.getsize(path)})
    return entries


def remove_temporaries(paths: Sequence[str]) -> None:
    """Deletes this build's temporary files and directories that exist (after a failure)."""
    for path in paths:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.lexists(path):
            os.remove(path)
