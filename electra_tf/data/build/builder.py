"""Builds the pretraining dataset: corpus files -> globally shuffled TFRecord shards + manifest.

The steps, each in its own module:
1. read (`formats`, `corpus`): plain text, gzip/bzip2/xz streams, OpenWebText archives or JSON
   Lines become document lines; bad input is a counted skip (or, with `bad_input="error"`, an
   error) naming the file and line or member;
2. pack (`packing`, `example_builder`): per file, tokenised in batches (`tokenization`, or
   without TensorFlow `portable_tokenization`: the same ids; `tokenizer_choice`) and
   packed by the official state machine, seeded per file, so examples depend only on (file,
   seed, settings);
3. shuffle (`shuffle`): each example's seeded key places it in one global random order; a
   bounded-memory external sort (scatter to bucket files, sort each bucket) writes the shards
   as consecutive key ranges, so every shard, and every stretch of one, is a random sample of
   the corpus: training batches mix like a random draw whatever the shard count;
4. install (`output`, `manifest`): shards renamed into place, `inputs.jsonl` (per input file:
   sizes, documents, examples, problems), `manifest.json` last.
The settings and their defaults are `build_config`'s, the vocabulary (learned first with
`--learn-vocab` or `--learn-spm`) `build_vocab`'s, the shard counts and the split of the work
`build_plan`'s. Work runs in `num_processes` processes (`workers`, `build_worker`): files are
packed in tasks pulled from a queue, then shards are written per unit of buckets.

Differences from the official `build_pretraining_dataset.py` (each one deliberate):
* Determinism: every draw is seeded (`packing`); same inputs and seed give byte-identical
  shards, and the shards do not depend on `num_processes` (the official builder is unseeded).
* Mixing: the official builder writes each job's examples round-robin into its own shards in
  corpus order and relies on its fixed 1000 shards and the reader's shuffles to mix; here the
  examples are shuffled globally (above), for any shard count.
* Shards: `num_out_files` is configurable (official: fixed 1000). Default: one shard per
  `DEFAULT_BYTES_PER_SHARD` of corpus text, at least `MIN_DEFAULT_SHARDS`, at most 1000
  (`build_plan`). Shards that would be empty are not written and the rest are numbered
  consecutively.
* Held-out split: documents keyed by their text and taken until they hold `eval_fraction` of
  the tokens (`split`; a first pass over the corpus) go to `eval_data.tfrecord-{i}-of-{m}`,
  m = ceil(num_out_files * eval_fraction). The official builder has no held-out split.
* Input formats beyond plain text, and counted bad input (`formats`).
* Safety: nothing is replaced without `overwrite`, temporaries are hidden, the manifest is last
  (`output`). The default data is fetched by `build_pretraining_dataset.py`, not here.
"""

from __future__ import annotations

import functools
import logging
import os
import shlex
import shutil
import sys
import time
from datetime import datetime, timezone
from typing import Dict, List, Optional, Sequence, Tuple

from electra_tf import atomic
from electra_tf.data.text import corpus as corpus_lib
from electra_tf.data.build.build_config import BuildConfig, resolve_config
from electra_tf.data.build.build_plan import Plan, make_plan
from electra_tf.data.build.build_vocab import learn_corpus_spm, learn_corpus_vocab, load_build_vocab
from electra_tf.data.build.build_worker import BuildWorker, WorkerSpec, inputs_part_path
from electra_tf.data.text.corpus import (WHOLE_FILE_PROBLEMS, CorpusFile, format_problem,
                                    list_corpus_files)
from electra_tf.data.text.formats import InputSettings, estimated_text_bytes
from electra_tf.data.records.manifest import BuildTotals, build_manifest, merge_pack_results
from electra_tf.data.build.output import (INPUTS_NAME, check_output_dir, install_shards,
                                    remove_temporaries, write_error)
from electra_tf.data.build.packing import PackSettings
from electra_tf.data.build.shuffle import ShuffleError
from electra_tf.data.build.split import SplitPlan, no_split_summary, plan_split, split_warning
from electra_tf.data.records.tfrecord_io import MANIFEST_NAME
from electra_tf.data.build.workers import Progress, WorkerFailed, WorkerPool
from electra_tf.errors import BuildError, shown_path
from electra_tf.locking import DirectoryLock
from electra_tf.progress import RateEta
from electra_tf.vocab import Vocab

__all__ = ["build_dataset", "check_train_examples", "log_summary", "format_command"]

logger = logging.getLogger(__name__)

MAX_SHOWN_PROBLEMS = 3  # input problems named in a warning or error line


def _describe_reading(label: str, num_files: int, text_mb: float):
    rate = RateEta("MB", scale=1e6)  # of text read; the ETA is for this pass

    def describe(totals: Dict[str, int]) -> str:
        examples = f", examples {totals.get('examples', 0)}" if label == "progress" else ""
        return (f"{label}: files {totals.get('files', 0)}/{num_files}, "
                f"{totals.get('bytes', 0) / 1e6:.1f}/~{text_mb:.1f} MB of text "
                f"({rate.describe(totals.get('bytes', 0), text_mb * 1e6)}), "
                f"documents {totals.get('documents', 0)}{examples}")
    return describe


def _survey(pool: WorkerPool, config: BuildConfig, plan: Plan, num_files: int,
            text_mb: float) -> Optional[SplitPlan]:
    """The held-out split's first pass (each document's key and tokens) and its plan; None
    without a split."""
    if config.eval_fraction <= 0:
        return None
    logger.info("surveying the documents for the held-out split (--eval-fraction %g of the "
                "tokens)", config.eval_fraction)
    surveys = pool.map("survey", plan.tasks, Progress(
        _describe_reading("survey", num_files, text_mb), config.progress_interval))
    return plan_split([item for task in surveys for item in task], config.eval_fraction)


def build_dataset(config: BuildConfig) -> dict:
    """Builds globally shuffled TFRecord shards, `inputs.jsonl` and `manifest.json`.

    Args:
        config: BuildConfig.

    Returns:
        The manifest (also written to `<output_dir>/manifest.json`).

    Raises:
        BuildError, CorpusError, VocabError: bad input or settings (one-line messages).
        LockError: another process writes to the output dir.
    """
    started_at = datetime.now(timezone.utc)
    start = time.monotonic()
    config = resolve_config(config)
    created = not os.path.isdir(config.output_dir)
    os.makedirs(config.output_dir, exist_ok=True)
    try:
        # One writer per output dir: a second build there stops with one line naming this one.
        with DirectoryLock(config.output_dir, "--output-dir"):
            return _build(config, started_at, start)
    finally:
        if created and os.path.isdir(config.output_dir) and not os.listdir(config.output_dir):
            os.rmdir(config.output_dir)


def _build(config: BuildConfig, started_at: datetime, start: float) -> dict:
    """`build_dataset` once the output dir is locked."""
    check_output_dir(config.output_dir, config.overwrite)
    files, vocab = _corpus_and_vocab(config)
    plan = make_plan(config, files)
    spec = _worker_spec(config, vocab, plan)
    text_mb = sum(estimated_text_bytes(f) for f in files) / 1e6
    logger.info("building from %d files (~%.1f MB of text) in %s with %d process(es) into %s",
                len(files), text_mb, config.corpus_dir, plan.num_processes, config.output_dir)
    os.makedirs(plan.shuffle_dir)
    phases = {}
    try:
        with WorkerPool(plan.num_processes, functools.partial(BuildWorker, spec)) as pool:
            phase_start = time.monotonic()
            split_plan = _survey(pool, config, plan, len(files), text_mb)
            if split_plan is not None:
                phases["survey"] = time.monotonic() - phase_start
                phase_start = time.monotonic()
            totals, long_lines = _pack(pool, config, plan, split_plan, len(files), text_mb)
            phases["pack"] = time.monotonic() - phase_start
            phase_start = time.monotonic()
            total = sum(split.examples for split in totals.pack.splits.values())
            units = [(split, buckets, shards) for split, layout in plan.layouts.items()
                     for buckets, shards in layout.units()]
            logger.info("shuffling %d examples: %d bucket(s) of <= %d MiB in memory", total,
                        sum(layout.num_buckets for layout in plan.layouts.values()),
                        config.shuffle_memory_mb)
            unit_counts = pool.map("gather", units, Progress(
                lambda t: f"shuffle: {t.get('written', 0)}/{total} examples written",
                config.progress_interval))
            phases["shuffle"] = time.monotonic() - phase_start
        for (split, _, _), counts in zip(units, unit_counts):
            totals.shard_counts.setdefault(split, {}).update(counts)
        shards = install_shards(config.output_dir, config.overwrite, plan.temp_paths(),
                                plan.shard_tmp, totals.shard_counts)
        os.replace(plan.inputs_tmp, os.path.join(config.output_dir, INPUTS_NAME))
        shutil.rmtree(plan.shuffle_dir)
    except BaseException as e:
        remove_temporaries(plan.temp_paths())
        if isinstance(e, (WorkerFailed, ShuffleError)):
            raise BuildError(str(e)) from None
        if isinstance(e, OSError):
            raise write_error(e, "the dataset", config.output_dir) from None
        raise
    manifest = build_manifest(config, vocab, len(files), plan, totals, shards, started_at,
                              time.monotonic() - start, phases, INPUTS_NAME,
                              eval_split=split_plan.summary if split_plan else no_split_summary())
    _finish(config, manifest, long_lines)
    return manifest


def _corpus_and_vocab(config: BuildConfig) -> Tuple[List[CorpusFile], Vocab]:
    """The corpus files (not all empty) and the vocabulary, learned first with --learn-vocab or
    --learn-spm."""
    files = list_corpus_files(config.corpus_dir)
    if sum(f.size for f in files) == 0:
        raise BuildError(f"corpus dir {shown_path(config.corpus_dir)} contains only empty files")
    if config.learn_vocab is not None:
        learn_corpus_vocab(config, files)
    if config.learn_spm is not None:
        learn_corpus_spm(config, files)
    return files, load_build_vocab(config)


def _pack(pool: WorkerPool, config: BuildConfig, plan: Plan, split_plan: Optional[SplitPlan],
          num_files: int, text_mb: float) -> Tuple[BuildTotals, List[dict]]:
    """The packing pass: each task's files packed into the shuffle's buckets, its part of
    inputs.jsonl joined into one; returns the totals and the over-long lines met. Raises
    BuildError when no training example was made (`check_train_examples`)."""
    tasks = [(i, task, split_plan and {f.relpath: split_plan.files[f.relpath]
                                       for f in task}) for i, task in plan.tasks]
    results = pool.map("pack", tasks, Progress(
        _describe_reading("progress", num_files, text_mb), config.progress_interval,
        rate_key="tokens", rate_unit="tokens"))
    totals = merge_pack_results(results, config.max_seq_length)
    long_lines = [entry for result in results for entry in result["long_lines"]]
    check_train_examples(config.corpus_dir, totals)
    _join_inputs(plan)
    return totals, long_lines


def check_train_examples(corpus_dir: str, totals) -> None:
    """Raises BuildError when packing made no training example (`totals`: BuildTotals); the
    message names the input problems met (the likely cause: a whole corpus in a format that is
    not read, or given with the wrong --input-format)."""
    if totals.pack.splits["train"].examples == 0:
        causes = ""
        if totals.num_problems:
            causes = (f"; {totals.num_problems} input problem(s), first: "
                      + "; ".join(format_problem(p) for p in totals.problems[:MAX_SHOWN_PROBLEMS]))
        raise BuildError(
            f"no training examples: the corpus in {shown_path(corpus_dir)} has no tokenizable "
            "text" + (" outside the held-out documents" if totals.pack.splits["eval"].examples
                      else "") + causes)


def _finish(config: BuildConfig, manifest: dict, long_lines: List[dict]) -> None:
    """Writes manifest.json (last: its presence marks a complete dataset), then the warnings
    and the summary."""
    try:
        atomic.write_json(os.path.join(config.output_dir, MANIFEST_NAME), manifest)
    except OSError as e:
        raise write_error(e, MANIFEST_NAME, config.output_dir) from None
    corpus_lib.warn_long_lines(manifest["counts"], long_lines, config.max_seq_length)
    log_summary(config, manifest)


def _worker_spec(config: BuildConfig, vocab, plan: Plan) -> WorkerSpec:
    """What every build process needs to know (picklable)."""
    return WorkerSpec(
        vocab_file=config.vocab_file, vocab_sha256=vocab.sha256,
        do_lower_case=config.do_lower_case, strip_accents=config.strip_accents,
        tokenizer=config.tokenizer,
        input=InputSettings(config.input_format, config.blanks_separate_docs,
                            config.jsonl_text_field),
        pack=PackSettings(config.max_seq_length, config.seed, config.eval_fraction,
                          vocab.special.unk_id),
        strict_input=config.bad_input == "error", shuffle_dir=plan.shuffle_dir,
        layouts=plan.layouts, shard_paths=plan.shard_tmp,
        memory_bytes=config.shuffle_memory_mb << 20, num_writers=plan.num_processes)


def _join_inputs(plan: Plan) -> None:
    """Concatenates the tasks' parts of inputs.jsonl (tasks are consecutive runs by relpath)."""
    with open(plan.inputs_tmp, "wb") as out:
        for task_index, _ in plan.tasks:
            part = inputs_part_path(plan.shuffle_dir, task_index)
            with open(part, "rb") as f:
                shutil.copyfileobj(f, out)
            os.remove(part)


def log_summary(config: BuildConfig, manifest: dict) -> None:
    train, evals = manifest["splits"]["train"], manifest["splits"]["eval"]
    counts = manifest["counts"]
    if config.eval_fraction > 0 and not evals["examples"]:
        logger.warning("no document was held out for eval (%d documents, --eval-fraction %g): "
                       "there are no eval shards", counts["documents"], config.eval_fraction)
    elif split_warning(manifest["eval_split"]):
        logger.warning("%s", split_warning(manifest["eval_split"]))
    skipped = [p for p in manifest["input_problems"] if p["problem"] in WHOLE_FILE_PROBLEMS]
    if counts["skipped_files"]:
        # On a line of its own: a whole file of the corpus is not in the dataset.
        logger.warning(
            "%d file(s) NOT READ (binary data, or a format that is not read: listed in %s and "
            "%s); first: %s", counts["skipped_files"], MANIFEST_NAME, INPUTS_NAME,
            "; ".join(format_problem(p) for p in skipped[:MAX_SHOWN_PROBLEMS]))
    if counts["input_problems"]:
        logger.warning(
            "%d input problem(s) skipped or repaired (%d documents skipped, %d damaged files): "
            "listed in %s and %s; first: %s", counts["input_problems"], counts["skipped_documents"],
            counts["damaged_files"], MANIFEST_NAME, INPUTS_NAME,
            "; ".join(format_problem(p) for p in manifest["input_problems"][:MAX_SHOWN_PROBLEMS]))
    logger.info(
        "done: %d train examples in %d shards, %d eval examples in %d shards, %d documents, "
        "%d tokens in %.1f s (%.0f tokens/s) -> %s", train["examples"], len(train["shards"]),
        evals["examples"], len(evals["shards"]), counts["documents"],
        counts["tokenized_tokens"], manifest["elapsed_seconds"],
        manifest["throughput"]["tokens_per_second"],
        os.path.join(config.output_dir, MANIFEST_NAME))


def format_command(argv: Sequence[str]) -> str:
    """The command line as one shell-quoted string (recorded in the manifest)."""
    return shlex.join([os.path.basename(sys.executable)] + list(argv))
