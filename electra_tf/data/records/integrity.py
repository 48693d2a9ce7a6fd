"""Integrity of pretraining shards: listing, the manifest check, record scans, bad-record plans.

Everything the trainer checks before (and, naming files, after) it reads data, separate from the
input pipeline itself (`pipeline.make_dataset`):

- `list_files`: the shards a comma-separated glob names;
- `validate_dataset`: the builder's manifest beside the shards against the training config
  (vocab checksum, max_seq_length, listed shards and sizes), optionally every record read once
  (`verify_records`) or damaged records planned around (`plan_good_records`, for
  `skip_bad_records`); data written before the builder's global shuffle gets a warning;
- `scan_file` / `find_bad_file`: what is wrong with a file, by name and record index.

TensorFlow is not imported here: a process that has imported it (the TensorFlow trainer, its
tests) lists files with `tf.io.gfile.glob` and reads them with tf.data, as always; a process
without it (the JAX and PyTorch trainers, `record_reader.BatchReader`) lists local files with
`glob` and reads them with `record_scan` (same CRC and parse checks, same results, its own
error texts). Remote paths (`gs://...`) need TensorFlow, which is then imported.
"""

from __future__ import annotations

import concurrent.futures
import glob
import logging
import os
import sys
from typing import Dict, Iterator, List, Optional, Tuple

from electra_tf import atomic, locking
from electra_tf.data.records import record_scan, tfrecord_io
from electra_tf.data.records.record_scan import FileScan
from electra_tf.errors import DataError, error_line

logger = logging.getLogger(__name__)

# Temporary shard names of build_pretraining_dataset.py (electra_tf.data.build.output), whose manifest
# is written last: such files and no manifest mean a build that was killed.
PARTIAL_PREFIX = ".partial-"
# Records per read in `verify_records` (a vectorised parse; the size only sets memory use).
VERIFY_BATCH = 1024
SCAN_THREADS = os.cpu_count() or 1  # files scanned at once by `plan_good_records`


def _split_patterns(patterns: str) -> List[str]:
    """The non-empty globs of a comma-separated list (official `pretrain_tfrecords`)."""
    return [p for p in (p.strip() for p in patterns.split(",")) if p]


def _tensorflow(paths=()):
    """TensorFlow if this process has imported it or `paths` are remote (`scheme://`), else
    None (local files are then read without it; see module docstring)."""
    tf = sys.modules.get("tensorflow")
    if tf is not None:
        return tf
    if any("://" in p for p in paths):
        try:
            import tensorflow as tf
        except ImportError:
            raise DataError(f"{next(p for p in paths if '://' in p)}: remote files are read "
                            "through TensorFlow, which is not installed") from None
        return tf
    return None


def list_files(patterns: str) -> List[str]:
    """Sorted union of the files matched by comma-separated globs (official `pretrain_tfrecords`).

    Raises:
        DataError: no file matches.
    """
    files = set()
    split = _split_patterns(patterns)
    tf = _tensorflow(split)
    for pattern in split:
        if tf is not None:
            files.update(tf.io.gfile.glob(pattern))
        else:  # as tf.io.gfile.glob: hidden names match too
            files.update(glob.glob(pattern, include_hidden=True))
    if not files:
        raise DataError(f"no TFRecord files match {patterns!r} "
                        "(build them with build_pretraining_dataset.py)")
    return sorted(files)


def scan_file(path: str, max_seq_length: int, stop_at_first: bool = False) -> FileScan:
    """Reads and parses every record of a file once; never raises on bad records.

    The TFRecord reader checks each record's CRC32C, so a garbled or truncated record ends the
    read (nothing after it can be located); records are parsed a batch at a time, and a batch
    that fails is parsed record by record to find the bad ones.

    Args:
        path: str. A TFRecord file.
        max_seq_length: int. The length every feature must have.
        stop_at_first: bool. Stop at the first record that does not parse (`bad_indices` then
            holds only it and `readable` counts up to its batch): enough to refuse a file,
            without parsing a foreign file record by record.
    """
    tf = _tensorflow([path])
    if tf is None:
        return record_scan.scan_file(path, max_seq_length, stop_at_first, batch=VERIFY_BATCH)
    readable, bad = 0, []

    def check(records):
        try:
            tfrecord_io.parse_example(records, max_seq_length)
        except tf.errors.InvalidArgumentError:
            for i in range(int(records.shape[0])):
                try:
                    tfrecord_io.parse_example(records[i], max_seq_length)
                except tf.errors.InvalidArgumentError:
                    bad.append(readable + i)
                    if stop_at_first:
                        return

    try:
        for records in tf.data.TFRecordDataset(path).batch(VERIFY_BATCH):
            check(records)
            readable += int(records.shape[0])
            if stop_at_first and bad:
                return FileScan(path, readable, tuple(bad), None)
    except tf.errors.DataLossError as e:
        # The failed batch is lost whole: read its records one at a time up to the bad one.
        error = error_line(e, limit=200)
        tail = []
        try:
            for record in tf.data.TFRecordDataset(path).skip(readable):
                tail.append(record)
        except tf.errors.DataLossError:
            pass
        if tail:
            check(tf.stack(tail))
            readable += len(tail)
        return FileScan(path, readable, tuple(bad), error)
    return FileScan(path, readable, tuple(bad), None)


def verify_records(paths: List[str], *, max_seq_length: int,
                   expected_counts: Optional[dict] = None) -> int:
    """Reads and parses every record of each file once; returns the number of records.

    A garbled or truncated shard fails here, named, instead of mid-run; the parse checks the
    feature names and lengths.

    Args:
        paths: TFRecord files.
        max_seq_length: int. The length every feature must have.
        expected_counts: optional {path: number of records} (from the manifest).

    Raises:
        DataError: naming the file, the record index and what is wrong.
    """
    total = 0
    for path in paths:
        scan = scan_file(path, max_seq_length, stop_at_first=True)
        if scan.bad_indices:
            raise DataError(f"{path}: record #{scan.bad_indices[0]} is not an example with the "
                            f"features {', '.join(tfrecord_io.FEATURE_NAMES)} of length "
                            f"{max_seq_length}")
        if scan.error is not None:
            raise DataError(f"{path}: corrupted or truncated TFRecord file after {scan.readable} "
                            f"good records ({scan.error}); rebuild the dataset")
        expected = (expected_counts or {}).get(os.path.abspath(path))
        if expected is not None and scan.readable != expected:
            raise DataError(f"{path} holds {scan.readable} records but its manifest lists "
                            f"{expected}; rebuild the dataset")
        total += scan.readable
    return total


def scan_files(paths: List[str], max_seq_length: int) -> Iterator[FileScan]:
    """`scan_file` of every path, in order, `SCAN_THREADS` files at a time (TensorFlow's
    readers and parsers release the GIL, so a many-shard dataset is scanned on every core)."""
    if len(paths) <= 1 or SCAN_THREADS <= 1:
        yield from (scan_file(path, max_seq_length) for path in paths)
        return
    with concurrent.futures.ThreadPoolExecutor(min(SCAN_THREADS, len(paths))) as pool:
        yield from pool.map(lambda path: scan_file(path, max_seq_length), paths)


def plan_good_records(paths: List[str], *, max_seq_length: int,
                      expected_counts: Optional[dict] = None) -> dict:
    """Scans every file and plans to read only its good records (`skip_bad_records`).

    Args:
        paths: TFRecord files.
        max_seq_length: int. The length every feature must have.
        expected_counts: optional {absolute path: records the manifest lists}: a file cut short
            then counts its missing records as skipped.

    Returns:
        {"files": {path: {"take": records to read, "skip": [indices to drop]}},
         "skipped_records": int, "good_records": int, "problems": [one line per damaged file]}.
        A skipped record is one that exists (or the manifest says should) but cannot be used;
        for a damaged file without a manifest count the unreadable rest counts as 1.
    """
    files, problems = {}, []
    skipped = good = 0
    for scan in scan_files(paths, max_seq_length):
        path = scan.path
        expected = (expected_counts or {}).get(os.path.abspath(path))
        short = expected is not None and scan.readable != expected
        # A read that stopped early loses at least one record, however many the manifest lists.
        missing = max(1 if scan.error else 0, expected - scan.readable if short else 0)
        lost = len(scan.bad_indices) + missing
        what = []
        if scan.bad_indices:
            what.append(f"{len(scan.bad_indices)} record(s) with other features or lengths "
                        f"(first #{scan.bad_indices[0]})")
        if scan.error is not None:
            what.append(f"unreadable after record #{scan.readable - 1} ({scan.error})")
        if short:
            what.append(f"{scan.readable} readable of the {expected} records its manifest lists")
        if what:
            problems.append(f"{path}: {'; '.join(what)}: skipping {lost} record(s)")
        if scan.good:
            files[path] = {"take": scan.readable, "skip": list(scan.bad_indices)}
        skipped += lost
        good += scan.good
    return {"files": files, "skipped_records": skipped, "good_records": good,
            "problems": problems}


def find_bad_file(patterns: str, max_seq_length: int) -> Optional[str]:
    """The DataError message for the first unreadable file of `patterns`, or None (used to name
    the file after a record fails mid-run: tf.data's own message has no file name)."""
    for path in list_files(patterns):
        try:
            verify_records([path], max_seq_length=max_seq_length)
        except DataError as e:
            return str(e)
    return None


def validate_dataset(patterns: str, *, max_seq_length: int, vocab_sha256: str, vocab_size: int,
                     split: str = "train", verify: bool = False,
                     skip_bad_records: bool = False) -> Optional[dict]:
    """Checks the builder's manifest beside the matched shards against the training config.

    Every directory holding matched files must have a `manifest.json` whose vocab checksum and
    max_seq_length agree, and the matched shards must be the manifest's (sizes included). Train
    data written before the builder's global shuffle (manifest format 1) is accepted with a
    warning.

    With `verify`, every record is also read once (`verify_records`: CRC, features, counts).
    With `skip_bad_records`, every record is read once too, but damaged records (and shards
    whose size differs from the manifest's) are planned around instead of refused
    (`plan_good_records`).

    Returns:
        A summary {"num_examples": int or None, "manifests": [paths]}; num_examples is None when
        a directory has no manifest (data built by another tool: checked only by parsing). With
        `skip_bad_records` also "record_plan" (for `make_dataset`) and "skipped_records", and
        num_examples counts the good records.

    Raises:
        DataError: a mismatch, naming the manifest and both values; with `skip_bad_records`,
            no good record at all.
    """
    files = _matched_files(patterns)
    total, manifests, expected_counts = 0, [], {}
    for directory in sorted({os.path.dirname(f) for f in files}):
        matched = sorted(f for f in files if os.path.dirname(f) == directory)
        manifest_path, counts = _check_directory(
            directory, matched, split, max_seq_length=max_seq_length, vocab_sha256=vocab_sha256,
            vocab_size=vocab_size, verify=verify, skip_bad_records=skip_bad_records)
        if manifest_path is None:
            total = None  # data built by another tool: its size is unknown
            continue
        manifests.append(manifest_path)
        expected_counts.update(counts)
        if total is not None:
            total += sum(counts.values())
    summary = {"num_examples": total, "manifests": manifests}
    if skip_bad_records:
        summary.update(_good_records_summary(files, patterns, split, max_seq_length,
                                             expected_counts))
    return summary


def _matched_files(patterns: str) -> List[str]:
    """`list_files(patterns)`; when nothing matches, a directory a builder is still writing is
    named as such."""
    try:
        return list_files(patterns)
    except DataError:
        # A builder that has taken the directory but not yet written a file: say so, rather
        # than "no files match", which sends the user to build data that is being built.
        for directory in _literal_directories(patterns):
            _check_not_being_built(directory)
        raise


def _check_directory(directory: str, matched: List[str], split: str, *, max_seq_length: int,
                     vocab_sha256: str, vocab_size: int, verify: bool,
                     skip_bad_records: bool) -> Tuple[Optional[str], Dict[str, int]]:
    """Checks one directory of matched shards (`validate_dataset`'s loop body).

    Returns:
        (its manifest's path, {shard path: example count}), or (None, {}) when the directory
        has no manifest (then only parsed, with `verify`).
    """
    _check_not_being_built(directory)
    manifest_path = os.path.join(directory, tfrecord_io.MANIFEST_NAME)
    verify_each = verify and not skip_bad_records  # skip_bad_records reads every record anyway
    if not os.path.exists(manifest_path):
        _check_not_interrupted(directory)
        if verify_each:
            verify_records(matched, max_seq_length=max_seq_length)
        return None, {}
    counts = _check_manifest(manifest_path, matched, split, max_seq_length=max_seq_length,
                             vocab_sha256=vocab_sha256, vocab_size=vocab_size,
                             check_sizes=not skip_bad_records)
    if verify_each:
        verify_records(matched, max_seq_length=max_seq_length, expected_counts=counts)
    return manifest_path, counts


def _good_records_summary(files: List[str], patterns: str, split: str, max_seq_length: int,
                          expected_counts: Dict[str, int]) -> dict:
    """`validate_dataset`'s summary entries with `skip_bad_records`: the plan around damaged
    records (`plan_good_records`), or a DataError when no record is readable."""
    plan = plan_good_records(files, max_seq_length=max_seq_length,
                             expected_counts=expected_counts)
    if not plan["files"]:
        raise DataError(f"no readable example in {patterns!r} ({split} data): "
                        + "; ".join(plan["problems"][:3]))
    return {"num_examples": plan["good_records"], "record_plan": plan["files"],
            "skipped_records": plan["skipped_records"], "problems": plan["problems"]}


def _literal_directories(patterns: str) -> List[str]:
    """The existing local directories named without wildcards by comma-separated globs."""
    directories = set()
    for pattern in _split_patterns(patterns):
        directory = os.path.dirname(pattern) or "."
        if not any(c in directory for c in "*?[") and os.path.isdir(directory):
            directories.add(directory)
    return sorted(directories)


def _check_not_being_built(directory: str) -> None:
    """Refuses shards a builder is writing right now (it holds the directory's lock)."""
    holder = locking.current_holder(directory)
    if holder is not None:
        raise DataError(f"{directory} is being written right now by {locking.describe(holder)}: "
                        "wait for the build to finish")


def _check_not_interrupted(directory: str) -> None:
    """Refuses shards beside the temporaries of a build that never wrote its manifest."""
    partial = sorted(n for n in os.listdir(directory)
                     if n.startswith(PARTIAL_PREFIX) or atomic.is_temporary(n))
    if partial:
        raise DataError(f"{directory} holds an interrupted dataset build ({partial[0]}, no "
                        f"{tfrecord_io.MANIFEST_NAME}): rerun build_pretraining_dataset.py "
                        "with --overwrite")


def _check_manifest(manifest_path: str, matched: List[str], split: str, *, max_seq_length: int,
                    vocab_sha256: str, vocab_size: int, check_sizes: bool) -> dict:
    """Checks one directory's manifest against the config and the matched shards.

    Returns:
        {absolute path: examples the manifest lists} for the matched shards.
    """
    directory = os.path.dirname(manifest_path)
    try:
        manifest = tfrecord_io.read_manifest(manifest_path)
        tfrecord_io.check_manifest(manifest, max_seq_length=max_seq_length,
                                   vocab_sha256=vocab_sha256, vocab_size=vocab_size)
        listed = {os.path.abspath(p) for p in tfrecord_io.shard_paths(
            manifest, directory, split, verify=check_sizes)}
    except tfrecord_io.ManifestError as e:
        raise DataError(f"{manifest_path}: {e}") from None
    matched = {os.path.abspath(f) for f in matched}
    stray = sorted(matched - listed)
    if stray:
        raise DataError(f"{stray[0]} matches the {split} file pattern but is not listed in "
                        f"{manifest_path} (a leftover or foreign shard?)")
    if split == "train" and not tfrecord_io.is_globally_shuffled(manifest):
        logger.warning(
            "%s: this dataset was written in corpus order (manifest format %s, before the "
            "builder's global shuffle): batches will follow the corpus order, mixing only "
            "within the reader's shuffle buffer; rebuild it with build_pretraining_dataset.py",
            manifest_path, manifest["format_version"])
    counts = {os.path.abspath(os.path.join(directory, sh["file"])): sh["examples"]
              for sh in manifest["splits"][split]["shards"]}
    return {path: n for path, n in counts.items() if path in matched}
