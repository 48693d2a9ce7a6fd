"""The dataset manifest (`manifest.json`) the builder writes last: settings, counts, provenance.

Readers (`tfrecord_io.read_manifest`, the trainer) need `format_version`, `max_seq_length`,
`vocab` and `splits`; `vocab.sha256` is the checksum of the vocab file or SentencePiece model
(`vocab.kind`: "wordpiece" or "sentencepiece"; a manifest without `kind` is WordPiece); the
rest documents the build. Format 2 (this builder) adds the global shuffle (`shuffle`), the
input format and the input problems; format 1 data was written in corpus order (the trainer
warns). `eval_split` (rule version 2 on, `split`) records how the
held-out documents were chosen and the share of the tokens they hold; a manifest without it
held out a seeded draw of documents keyed by file name (rule version 1), which reads the same.
`tokenizer` names the tokenizer that built the dataset (`tokenizer_choice`: "tensorflow" or
"tokenizers", with its library and version); a manifest without it was built with TensorFlow's.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import re
from datetime import datetime, timezone
from typing import Dict, List, Optional

from electra_tf.data.text.corpus import ReadStats
from electra_tf.data.build.packing import HISTOGRAM_BUCKET_WIDTH, PackStats, SplitStats
from electra_tf.data.records.tfrecord_io import FEATURE_NAMES, MANIFEST_FORMAT_VERSION
from electra_tf.data.text.tokenizer_choice import manifest_entry
from electra_tf.vocab import Vocab

MAX_LISTED_PROBLEMS = 100  # problems listed in the manifest (all are in inputs.jsonl)


def versions() -> dict:
    """Versions of Python, TensorFlow, tensorflow-text and electra_tf (from a checkout too)."""
    from importlib import metadata

    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    electra_tf_version = version("electra-tf")
    if electra_tf_version == "not installed":  # running from a source checkout
        electra_tf_version = _source_tree_version()
    return {"python": platform.python_version(), "tensorflow": version("tensorflow"),
            "tensorflow-text": version("tensorflow-text"), "electra_tf": electra_tf_version}


def _source_tree_version() -> str:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        with open(os.path.join(root, "pyproject.toml"), encoding="utf-8") as f:
            match = re.search(r'^version\s*=\s*"([^"]+)"', f.read(), re.MULTILINE)
        return match.group(1) if match else "unknown"
    except OSError:
        return "unknown"


@dataclasses.dataclass
class BuildTotals:
    """Everything the jobs counted, merged."""

    read: ReadStats
    pack: PackStats
    problems: List[dict]  # at most MAX_LISTED_PROBLEMS, sorted by file and kind
    num_problems: int
    shard_counts: Dict[str, Dict[int, int]]  # split -> shard index -> examples


def merge_pack_results(results: List[dict], max_seq_length: int) -> BuildTotals:
    """Sums the `BuildWorker.pack` results; histograms get their full length."""
    read, pack = ReadStats(), PackStats()
    num_buckets = -(-max_seq_length // HISTOGRAM_BUCKET_WIDTH)
    for split in pack.splits:
        pack.splits[split] = SplitStats(length_histogram=[0] * num_buckets)
    problems, num_problems = [], 0
    for result in results:
        fields = dict(result["read"])
        problems += fields.pop("problems")
        read.add(ReadStats(**fields))
        pack.add(PackStats.from_dict(result["pack"]))
        num_problems += result["problems"]
    problems.sort(key=lambda e: (e["file"], e["problem"]))
    return BuildTotals(read, pack, problems[:MAX_LISTED_PROBLEMS], num_problems, {})


def build_manifest(config, vocab: Vocab, num_files: int, plan, totals: BuildTotals,
                   shards: Dict[str, List[dict]], started_at: datetime, elapsed: float,
                   phases: Dict[str, float], inputs_name: Optional[str],
                   runner: Optional[dict] = None, eval_split: Optional[dict] = None) -> dict:
    """The manifest dict (see the module docstring); `config` is the resolved BuildConfig and
    `plan` the builder's plan (process and shard counts, bucket layouts); `runner` names the
    engine that ran the build (default: the local builder); `eval_split` describes the
    held-out split (`split.SplitPlan.summary`)."""
    splits = totals.pack.splits
    total = _all_splits_stats(splits)
    # The key order is the order manifest.json lists them in; the helpers keep it.
    return {
        "format_version": MANIFEST_FORMAT_VERSION,
        "features": {name: ["int64", config.max_seq_length] for name in FEATURE_NAMES},
        "max_seq_length": config.max_seq_length,
        "vocab": _vocab_entry(config, vocab),
        "tokenizer": manifest_entry(config.tokenizer, vocab.kind),
        **_input_settings(config, eval_split),
        **_run_layout(config, plan, runner),
        "splits": {"train": _split_entry(splits["train"], shards["train"]),
                   "eval": _split_entry(splits["eval"], shards["eval"])},
        "counts": _counts(num_files, totals, total),
        "input_problems": totals.problems,
        "inputs_file": inputs_name,
        "length_histogram": {"bucket_width": HISTOGRAM_BUCKET_WIDTH,
                             "counts": total.length_histogram},
        "single_segment_fraction": total.single_segment / max(total.examples, 1),
        "command": config.command,
        "versions": versions(),
        **_timing(started_at, elapsed, phases, totals, total),
    }


def _all_splits_stats(splits: Dict[str, SplitStats]) -> SplitStats:
    """The per-split stats summed over the splits."""
    total = SplitStats(length_histogram=[0] * len(splits["train"].length_histogram))
    for stats in splits.values():
        total.add(stats)
    return total


def _vocab_entry(config, vocab: Vocab) -> dict:
    """`vocab`: the file, its checksum, size and kind, whether the build learned it, special ids."""
    return {"path": config.vocab_file, "sha256": vocab.sha256, "size": vocab.size,
            "kind": vocab.kind,
            "learned": config.learn_vocab is not None or config.learn_spm is not None,
            "special_ids": vocab.special._asdict()}


def _input_settings(config, eval_split: Optional[dict]) -> dict:
    """How the corpus was read, normalised and split (top-level manifest entries)."""
    return {
        "do_lower_case": config.do_lower_case,
        "strip_accents": config.strip_accents,
        "input_format": config.input_format,
        "blanks_separate_docs": config.blanks_separate_docs,
        "jsonl_text_field": config.jsonl_text_field,
        "bad_input": config.bad_input,
        "seed": config.seed,
        "eval_fraction": config.eval_fraction,
        "eval_split": eval_split,
        "corpus_dir": config.corpus_dir,
    }


def _run_layout(config, plan, runner: Optional[dict]) -> dict:
    """The engine, process and shard counts, and the global shuffle (top-level entries)."""
    return {
        "runner": runner or {"name": "local", "num_processes": plan.num_processes},
        "num_processes": plan.num_processes,
        "num_out_files_requested": plan.num_out_files,
        "num_eval_files_requested": plan.num_eval_files,
        "shuffle": {"method": "global", "memory_bytes": config.shuffle_memory_mb << 20,
                    "buckets": {split: layout.num_buckets
                                for split, layout in plan.layouts.items()}},
    }


def _split_entry(stats: SplitStats, shards: List[dict]) -> dict:
    """One split's `splits` entry: its stats, single-segment share and shard list."""
    entry = dataclasses.asdict(stats)
    entry["single_segment_fraction"] = stats.single_segment / max(stats.examples, 1)
    entry["shards"] = shards
    return entry


def _counts(num_files: int, totals: BuildTotals, total: SplitStats) -> dict:
    """`counts`: what reading, tokenising and packing counted over the whole build."""
    read, tokenized = totals.read, totals.pack.tokenized_tokens
    return {
        "files": num_files,
        "corpus_bytes": read.bytes_read,
        "documents": total.documents,
        "sentences": total.sentences,
        "lines": read.lines,
        "blank_lines": read.blank_lines,
        "examples": total.examples,
        "tokenized_tokens": tokenized,
        "example_tokens": total.tokens,
        "unk_tokens": totals.pack.unk_tokens,
        "unk_rate": totals.pack.unk_tokens / max(tokenized, 1),
        "truncated_tokens": total.truncated_tokens,
        "undecodable_bytes": read.undecodable_bytes,
        "nul_bytes": read.nul_bytes,
        "crlf_line_ends": read.crlf_line_ends,
        "bom_files": read.bom_files,
        "lines_split": read.lines_split,
        "skipped_documents": read.skipped_documents,
        "damaged_files": read.damaged_files,
        "skipped_files": read.skipped_files,
        "input_problems": totals.num_problems,
    }


def _timing(started_at: datetime, elapsed: float, phases: Dict[str, float],
            totals: BuildTotals, total: SplitStats) -> dict:
    """Start and finish times (finish: now), elapsed and per-phase seconds, and throughput."""
    per_second = 1.0 / max(elapsed, 1e-9)
    return {
        "started_at": started_at.isoformat(timespec="seconds"),
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "elapsed_seconds": round(elapsed, 3),
        "phase_seconds": {name: round(seconds, 3) for name, seconds in phases.items()},
        "throughput": {
            "tokens_per_second": round(totals.pack.tokenized_tokens * per_second, 1),
            "examples_per_second": round(total.examples * per_second, 1),
            "megabytes_per_second": round(totals.read.bytes_read / 1e6 * per_second, 3),
        },
    }
