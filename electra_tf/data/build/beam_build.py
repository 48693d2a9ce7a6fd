"""The dataset build on Apache Beam: the same shards on the DirectRunner, Dataflow, Spark or Flink.

`build_pretraining_dataset.py --runner RUNNER [Beam pipeline options]` calls `build_dataset_beam`,
which does what the local builder (`builder.build_dataset`) does, with Beam as the engine:

1. here, in the launcher: check the settings (`build_config.resolve_config`) and the output dir,
   list the corpus (a local dir as the local builder does; a URL such as gs://bucket/corpus
   through Beam's FileSystems), load the vocab, plan the shard counts (`builder`'s defaults);
2. on the runner: the pipeline of `beam_pipeline` (read and pack files in parallel, key each
   example, group by shard, write each shard's key range in key order);
3. here again: rename the shards into place (consecutive names, as the local builder), write
   `inputs.jsonl` and `manifest.json` (with `runner`: the runner, Beam's version, the pipeline
   options and the Beam counters).

Same inputs, settings and seed give byte-identical shards, inputs.jsonl and manifest counts to
the local builder's, on every runner: every example's content and place is a pure function of
(file, seed, settings), and each shard is sorted in full before it is written. Output-dir files
go through `tf.io.gfile` (local paths and gs://), corpus files through Beam's FileSystems.

Apache Beam is optional (the `[beam]` extra); asking for a runner without it is a one-line error.
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import tempfile
import time
from datetime import datetime, timezone
from typing import Dict, List, NamedTuple, Optional, Sequence

from electra_tf.data.build import (beam_runner, build_config, build_plan, build_vocab,
                                   builder as local_builder)
from electra_tf.data.build.output import (INPUTS_NAME, TMP_PREFIX, final_shard_names, is_our_file,
                                          temp_prefix, write_error)
from electra_tf.data.build.packing import PackSettings
from electra_tf.data.build.split import no_split_summary
from electra_tf.data.records.manifest import build_manifest, merge_pack_results
from electra_tf.data.records.tfrecord_io import MANIFEST_NAME
from electra_tf.data.text.corpus import CorpusError, CorpusFile, list_corpus_files
from electra_tf.data.text.formats import InputSettings, estimated_text_bytes
from electra_tf.errors import BuildError
from electra_tf.vocab import Vocab, VocabError, load_vocab

__all__ = ["LOCAL_RUNNER", "build_dataset_beam"]

logger = logging.getLogger(__name__)

LOCAL_RUNNER = "local"  # --runner default: the local multiprocessing builder, not Beam


def is_url(path: str) -> bool:
    return "://" in path


class BeamPlan(NamedTuple):
    """The shard counts (and, for the manifest, what stands in for the local builder's plan)."""

    num_out_files: int
    num_eval_files: int
    work_dir: str  # hidden temporary dir in the output dir: shards and results until installed
    num_processes: Optional[int] = None  # the runner decides
    layouts: Dict = {}

    @property
    def num_shards(self) -> Dict[str, int]:
        shards = {"train": self.num_out_files}
        if self.num_eval_files:
            shards["eval"] = self.num_eval_files
        return shards


def build_dataset_beam(config: build_config.BuildConfig, runner: str,
                       beam_args: Sequence[str] = ()) -> dict:
    """Builds the dataset of `builder.build_dataset(config)` with a Beam runner.

    Args:
        config: BuildConfig (`num_processes` and `shuffle_memory_mb` are the local builder's:
            the runner's own options set parallelism; a worker sorts one shard in memory).
        runner: a Beam runner name (DirectRunner, DataflowRunner, SparkRunner, FlinkRunner, ...).
        beam_args: Beam pipeline options, e.g. ["--project", "p", "--temp_location", "gs://t"].

    Returns:
        The manifest (also written to `<output_dir>/manifest.json`).

    Raises:
        BuildError, CorpusError, VocabError: bad input or settings (one-line messages).
    """
    beam = beam_runner.import_beam(runner)
    started_at = datetime.now(timezone.utc)
    start = time.monotonic()
    config = build_config.resolve_config(config)
    options = beam_runner.pipeline_options(runner, beam_args)
    if config.num_processes != 1:
        raise BuildError(f"--num-processes is the local builder's; with --runner {runner} the "
                         f"runner's options set the parallelism (e.g. --direct_num_workers)")
    import tensorflow as tf

    gfile = tf.io.gfile
    _check_output_dir(gfile, config.output_dir, config.overwrite)
    files, vocab, plan = _prepare(gfile, config)
    result, phases, totals, shards, eval_split = _build_shards(
        beam, runner, options, gfile, config, files, _pack_spec(config, vocab, plan), plan)
    runner_entry = beam_runner.runner_entry(beam, runner, beam_args, result, totals, len(files))
    manifest = build_manifest(config, vocab, len(files), plan, totals, shards, started_at,
                              time.monotonic() - start, phases, INPUTS_NAME, runner=runner_entry,
                              eval_split=eval_split)
    manifest["shuffle"] = {"method": "global", "engine": "beam",
                           "sort": "GroupByKey per shard, each shard sorted in worker memory"}
    try:
        _write_atomic(gfile, config.output_dir, MANIFEST_NAME,
                      json.dumps(manifest, indent=2) + "\n")
    except (OSError, tf.errors.OpError) as e:
        raise write_error(e, MANIFEST_NAME, config.output_dir) from None
    local_builder.log_summary(config, manifest)
    return manifest


def _build_shards(beam, runner: str, options, gfile, config, files: List[CorpusFile], spec,
                  plan: BeamPlan):
    """Runs the pipeline and installs the shards (on failure: removes the work dir and an output
    dir it made). Returns (Beam result, phase seconds, totals, shards, eval split summary)."""
    import tensorflow as tf

    logger.info("building from %d files (~%.1f MB of text) in %s with Beam's %s into %s",
                len(files), sum(estimated_text_bytes(f) for f in files) / 1e6,
                config.corpus_dir, runner, config.output_dir)
    created_dir = not gfile.isdir(config.output_dir)
    try:
        gfile.makedirs(plan.work_dir)
        phase_start = time.monotonic()
        result = _run(beam, options, files, spec, plan.work_dir)
        phases = {"pipeline": time.monotonic() - phase_start}
        entries, totals, shard_counts, eval_split = _read_results(gfile, plan.work_dir, config)
        local_builder.check_train_examples(config.corpus_dir, totals)
        shards = _install(gfile, config, plan, shard_counts, entries)
    except BaseException as e:
        if gfile.exists(plan.work_dir):
            gfile.rmtree(plan.work_dir)
        if created_dir and gfile.isdir(config.output_dir) and not gfile.listdir(config.output_dir):
            gfile.rmtree(config.output_dir)
        if isinstance(e, (OSError, tf.errors.OpError)):  # here, in the launcher: a full disk
            raise write_error(e, "the dataset", config.output_dir) from None
        raise
    gfile.rmtree(plan.work_dir)
    return result, phases, totals, shards, eval_split


def _prepare(gfile, config):
    """The corpus files, the vocab (learned first with --learn-vocab) and the shard plan."""
    files = list_files(config.corpus_dir)
    if sum(f.size for f in files) == 0:
        raise BuildError(f"corpus dir {config.corpus_dir} contains only empty files")
    if config.learn_vocab is not None:
        if is_url(config.corpus_dir):
            raise BuildError("--learn-vocab reads a local corpus; learn the vocab from a local "
                             "copy and pass it with --vocab-file")
        build_vocab.learn_corpus_vocab(config, files)
    if config.learn_spm is not None:
        if is_url(config.corpus_dir):
            raise BuildError("--learn-spm reads a local corpus; train the model on a local "
                             "copy and pass it with --spm-model")
        build_vocab.learn_corpus_spm(config, files)
    vocab = read_vocab(gfile, config.vocab_file)
    if config.spm_model is not None and vocab.kind != "sentencepiece":
        raise BuildError(f"--spm-model {config.spm_model} is not a SentencePiece model (a "
                         "WordPiece vocab.txt goes to --vocab-file)")
    text_bytes = sum(estimated_text_bytes(f) for f in files)
    num_out = config.num_out_files or build_plan.default_num_out_files(text_bytes)
    plan = BeamPlan(num_out, build_plan.num_eval_files(num_out, config.eval_fraction),
                    temp_prefix(config.output_dir) + "beam")
    return files, vocab, plan


def _pack_spec(config, vocab: Vocab, plan: BeamPlan):
    # lazy: Apache Beam is optional (only a --runner build needs it)
    from electra_tf.data.build.beam_pipeline import PackSpec

    return PackSpec(vocab=vocab, do_lower_case=config.do_lower_case,
                    strip_accents=config.strip_accents,
                    input=InputSettings(config.input_format, config.blanks_separate_docs,
                                        config.jsonl_text_field),
                    pack=PackSettings(config.max_seq_length, config.seed, config.eval_fraction,
                                      vocab.special.unk_id),
                    strict_input=config.bad_input == "error", num_shards=plan.num_shards,
                    tokenizer=config.tokenizer)


def _run(beam, options, files: List[CorpusFile], spec, work_dir: str):
    """Runs the pipeline to the end; a user error raised on a worker becomes one BuildError."""
    # lazy: Apache Beam is optional (only a --runner build needs it)
    from electra_tf.data.build.beam_pipeline import add_build

    pipeline = beam.Pipeline(options=options)
    add_build(pipeline, [tuple(f) for f in files], spec, work_dir)
    try:
        with beam_runner.quiet_worker_errors():
            result = pipeline.run()
            state = result.wait_until_finish()
    except Exception as e:  # noqa: BLE001 -- runners wrap worker errors in their own types
        message = beam_runner.user_error(e)
        if message is not None:
            raise BuildError(message) from None
        failed = beam_runner.failed_write(e)
        if failed is None:
            raise
        # Beam's own writes (WriteToText of the results) into the work dir.
        raise write_error(failed, "the dataset", posixpath.dirname(work_dir)) from None
    if state != beam.runners.runner.PipelineState.DONE:
        raise BuildError(f"the Beam pipeline ended in state {state}")
    return result


def list_files(corpus_dir: str) -> List[CorpusFile]:
    """The corpus files: as the local builder lists them, or (a URL) through Beam's FileSystems
    with the same rules (recursive, hidden names skipped, sorted by relative path)."""
    if not is_url(corpus_dir):
        return list_corpus_files(corpus_dir)
    from apache_beam.io.filesystems import FileSystems

    base = corpus_dir.rstrip("/")
    try:
        matches = FileSystems.match([base + "/**"])[0].metadata_list
    except Exception as e:  # noqa: BLE001 -- each filesystem raises its own errors
        raise CorpusError(f"cannot list corpus dir {corpus_dir}: {e}".splitlines()[0]) from e
    files = []
    for metadata in matches:
        relpath = metadata.path[len(base) + 1:]
        if relpath and not relpath.endswith("/") and not any(
                part.startswith(".") for part in relpath.split("/")):
            files.append(CorpusFile(relpath, metadata.path, metadata.size_in_bytes))
    if not files:
        raise CorpusError(f"corpus dir {corpus_dir} contains no files")
    return sorted(files, key=lambda f: f.relpath)


def read_vocab(gfile, vocab_file: str) -> Vocab:
    """`load_vocab`, also for a URL (copied to a local temporary file first)."""
    if not is_url(vocab_file):
        return load_vocab(vocab_file)
    if not gfile.exists(vocab_file):
        raise VocabError(f"vocab file not found: {vocab_file}")
    with tempfile.TemporaryDirectory() as tmp:
        local = os.path.join(tmp, "vocab.txt")
        gfile.copy(vocab_file, local)
        return load_vocab(local)._replace(path=vocab_file)


# ------------------------------------------------------------------------------------------------
# The output dir (through tf.io.gfile: the same rules as `output` for local dirs, also on gs://)
# ------------------------------------------------------------------------------------------------
def _names(gfile, directory: str) -> List[str]:
    if not gfile.isdir(directory):
        return []
    return sorted(name.rstrip("/") for name in gfile.listdir(directory))


def _check_output_dir(gfile, output_dir: str, overwrite: bool) -> None:
    """`output.check_output_dir`'s rules: nothing is replaced without --overwrite."""
    if gfile.exists(output_dir) and not gfile.isdir(output_dir):
        raise BuildError(f"--output-dir {output_dir} exists and is not a directory")
    names = _names(gfile, output_dir)
    if names and not overwrite:
        interrupted = MANIFEST_NAME not in names and all(
            n.startswith(TMP_PREFIX) or is_our_file(n) for n in names)
        raise BuildError(
            f"output dir {output_dir} " + ("holds an interrupted build (no manifest.json)"
                                           if interrupted else "exists and is not empty")
            + "; pass --overwrite to replace the dataset in it")


def _remove_previous_dataset(gfile, output_dir: str, work_dir: str) -> int:
    removed = 0
    for name in _names(gfile, output_dir):
        path = f"{output_dir.rstrip('/')}/{name}"
        if path == work_dir or not (is_our_file(name) or name.startswith(TMP_PREFIX)):
            continue
        if gfile.isdir(path):
            gfile.rmtree(path)
        else:
            gfile.remove(path)
        removed += 1
    return removed


def _write_atomic(gfile, directory: str, name: str, text: str) -> None:
    tmp = f"{directory.rstrip('/')}/{TMP_PREFIX}{os.getpid()}-{name}"
    with gfile.GFile(tmp, "w") as f:
        f.write(text)
    gfile.rename(tmp, f"{directory.rstrip('/')}/{name}", overwrite=True)


def _read_results(gfile, work_dir: str, config):
    """The pipeline's result files -> (inputs.jsonl entries, BuildTotals, shard counts, the
    manifest's `eval_split`)."""
    with gfile.GFile(f"{work_dir}/files.jsonl") as f:
        per_file = sorted((json.loads(line) for line in f if line.strip()),
                          key=lambda r: r["entry"]["file"])
    totals = merge_pack_results([r["result"] for r in per_file], config.max_seq_length)
    shard_counts: Dict[str, Dict[int, int]] = {}
    with gfile.GFile(f"{work_dir}/shards.jsonl") as f:
        for line in f:
            if line.strip():
                shard = json.loads(line)
                shard_counts.setdefault(shard["split"], {})[shard["shard"]] = shard["examples"]
    totals.shard_counts.update(shard_counts)
    eval_split = no_split_summary()
    if config.eval_fraction > 0:
        with gfile.GFile(f"{work_dir}/split.json") as f:
            eval_split = json.loads(f.read())
    return [r["entry"] for r in per_file], totals, shard_counts, eval_split


def _install(gfile, config, plan: BeamPlan, shard_counts: Dict[str, Dict[int, int]],
             entries: List[dict]) -> Dict[str, List[dict]]:
    """Replaces the previous dataset (with --overwrite) by the new shards and inputs.jsonl."""
    # lazy: Apache Beam is optional (only a --runner build needs it)
    from electra_tf.data.build.beam_pipeline import temp_shard_path

    output_dir = config.output_dir.rstrip("/")
    if config.overwrite:
        removed = _remove_previous_dataset(gfile, output_dir, plan.work_dir)
        if removed:
            logger.info("--overwrite: removed %d files of the previous dataset in %s", removed,
                        output_dir)
    installed = {}
    for split, shards in final_shard_names(shard_counts).items():
        installed[split] = []
        for i, name, count in shards:
            path = f"{output_dir}/{name}"
            gfile.rename(temp_shard_path(plan.work_dir, split, i, plan.num_shards[split]), path,
                         overwrite=True)
            installed[split].append({"file": name, "examples": count,
                                     "bytes": gfile.stat(path).length})
    _write_atomic(gfile, output_dir, INPUTS_NAME,
                  "".join(json.dumps(entry) + "\n" for entry in entries))
    return installed

