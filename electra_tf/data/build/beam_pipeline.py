"""The Apache Beam pipeline of the dataset build: corpus files -> packed, keyed records -> shards.

The graph (`add_build`), each step Beam's own work except the per-file packing, which is the
local builder's (`build_worker.FilePacker`), so the two engines cannot drift apart:

    Create(files) -> Reshuffle -> ParDo(PackFile) -> GroupByKey((split, shard)) -> ParDo(WriteShard)
                         |             ^     `-> per-file results -> WriteToText
                         |             | side input: the held-out split (with --eval-fraction > 0)
                         `-> ParDo(SurveyFile) -> ToList -> Map(plan_split) -> WriteToText

1. `Create` + `Reshuffle`: the corpus files (listed by the launcher, `beam_build`) are spread
   over the workers; the Reshuffle is a fusion break, so files are read in parallel on every
   worker instead of on the one that created the list.
2. `PackFile` (one file per element): reads it through Beam's `FileSystems` (local, gs://,
   s3://, hdfs://, ...; compressed streams, OpenWebText archives and JSON Lines as in
   `formats`), tokenises with a tokenizer built once per DoFn instance in `setup`, packs with
   the per-file seeds (`packing`), serialises, and keys each record with its global shuffle key
   (`shuffle.shuffle_key`), emitting ((split, shard_of(key)), key + record). Its progress goes
   to Beam counters (namespace `COUNTER_NAMESPACE`), which runners show live; its per-file
   counts and problems go out as data (the `FILES_TAG` output), which is exact under retries
   on every runner (counters are not: Flink and Spark report attempted values only).
   With a held-out split, `SurveyFile` first reads every file for its documents' keys and
   token counts (`split.survey_file`, `FilePacker.survey`), one small record per document;
   the records are gathered on one worker (16 bytes per document), where `split.plan_split`
   chooses the held-out documents, as the local builder does; `PackFile` gets that plan as a
   side input (per file: the indices of its held-out documents).
3. `GroupByKey` on (split, shard): Beam's distributed shuffle brings each shard's records to
   one worker.
4. `WriteShard`: sorts the shard's records by (key, record bytes) and writes them in that
   order to a temporary TFRecord file (`tf.io.TFRecordWriter`: local paths and gs://). Beam's
   `WriteToTFRecord` is not used for shards because it assigns records to shards round-robin
   and writes them in arrival order; the build's output must be each shard's key range in key
   order (as TFDS's Beam writer also sorts each bucket itself), which is what makes it globally
   mixed and byte-identical to the local builder's. Memory per worker: one shard.

Everything is a pure function of the inputs, settings and seed, so every runner writes the same
bytes; the launcher renames the shards into place and writes `inputs.jsonl` and the manifest.
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
from typing import Dict, Iterator, List, Optional, Tuple

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from electra_tf.data.build.build_worker import FilePacker, file_summary
from electra_tf.data.text.corpus import CorpusFile, ReadStats
from electra_tf.data.text.formats import InputSettings
from electra_tf.data.build.output import write_error
from electra_tf.data.build.packing import PackSettings, PackStats
from electra_tf.data.build.shuffle import shard_of
from electra_tf.data.build.split import FileSurvey, SplitPlan, plan_split
from electra_tf.data.records.tfrecord_io import EVAL_PREFIX, TRAIN_PREFIX, shard_name
from electra_tf.vocab import Vocab

COUNTER_NAMESPACE = "electra_tf.build"
# Counters PackFile and WriteShard increment (the manifest's names where they exist).
COUNTERS = ("files", "bytes", "documents", "tokens", "examples", "problems", "written",
            "surveyed_files")
FILES_TAG = "files"
SPLIT_PREFIXES = {"train": TRAIN_PREFIX, "eval": EVAL_PREFIX}
_KEY_BYTES = 8  # records travel as (8-byte big-endian key) + record: bytes order = key order


def open_raw(path: str):
    """A corpus file's raw bytes through Beam's FileSystems (any scheme Beam knows)."""
    return FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)


def temp_shard_path(work_dir: str, split: str, shard: int, num_shards: int) -> str:
    """Where WriteShard writes shard `shard` of a split (renamed by the launcher)."""
    return f"{work_dir}/{shard_name(SPLIT_PREFIXES[split], shard, num_shards)}"


@dataclasses.dataclass(frozen=True)
class PackSpec:
    """What PackFile needs (pickled to every worker)."""

    vocab: Vocab
    do_lower_case: bool
    strip_accents: bool
    input: InputSettings
    pack: PackSettings
    strict_input: bool
    num_shards: Dict[str, int]  # per split
    tokenizer: str = "tensorflow"  # resolved (`tokenizer_choice`)


class _Counters:
    """Beam counters, called like the local builder's progress reporter (`report(name=n)`)."""

    def __init__(self):
        self.counters = {name: Metrics.counter(COUNTER_NAMESPACE, name) for name in COUNTERS}

    def __call__(self, **counts: int) -> None:
        for name, value in counts.items():
            if value:
                self.counters[name].inc(value)


class PackFile(beam.DoFn):
    """(relpath, path, size) -> ((split, shard), key + record) and, tagged, the file's results."""

    def __init__(self, spec: PackSpec):
        self.spec = spec
        self.packer = None
        self.report = None

    def setup(self):
        spec = self.spec
        self.packer = FilePacker(spec.vocab, spec.do_lower_case, spec.strip_accents, spec.input,
                                 spec.pack, spec.strict_input, opener=open_raw,
                                 tokenizer=spec.tokenizer)
        self.packer.tokenizer  # noqa: B018 -- built here: once per DoFn instance, not per file
        self.report = _Counters()

    def process(self, element: Tuple[str, str, int], split_plan: Optional[SplitPlan] = None
                ) -> Iterator:
        corpus_file = CorpusFile(*element)
        read, stats = ReadStats(), PackStats()
        file_split = split_plan.files[corpus_file.relpath] if split_plan is not None else None
        for split, batch in self.packer.keyed_records(corpus_file, read, stats, self.report,
                                                      file_split):
            num_shards = self.spec.num_shards[split]
            for key, record in batch:
                yield (split, shard_of(key, num_shards)), key.to_bytes(_KEY_BYTES, "big") + record
        entry, problems = file_summary(corpus_file, read, stats)
        self.report(files=1, problems=len(problems))
        read_fields = dataclasses.asdict(read)
        read_fields["problems"] = problems
        yield beam.pvalue.TaggedOutput(FILES_TAG, json.dumps(
            {"entry": entry, "result": {"read": read_fields, "problems": len(problems),
                                        "pack": stats.to_dict()}}))


class SurveyFile(PackFile):
    """(relpath, path, size) -> (relpath, keys bytes, tokens bytes): the held-out split's first
    pass over a file (`FilePacker.survey`; counted in `surveyed_files` only, so the counters
    of the packing pass stay exact)."""

    def process(self, element: Tuple[str, str, int], split_plan=None) -> Iterator:
        corpus_file = CorpusFile(*element)
        survey = self.packer.survey(corpus_file, lambda **counts: None)
        self.report(surveyed_files=1)
        yield (corpus_file.relpath,) + survey.to_bytes()


def _plan(surveys: List[Tuple[str, bytes, bytes]], fraction: float) -> SplitPlan:
    return plan_split([(relpath, FileSurvey.from_bytes(keys, tokens))
                       for relpath, keys, tokens in surveys], fraction)


class WriteShard(beam.DoFn):
    """((split, shard), records) -> the shard's file, records in key order; yields its count."""

    def __init__(self, work_dir: str, num_shards: Dict[str, int]):
        self.work_dir, self.num_shards = work_dir, num_shards
        self.written = None

    def setup(self):
        self.written = Metrics.counter(COUNTER_NAMESPACE, "written")

    def process(self, element) -> Iterator[str]:
        import tensorflow as tf  # only the workers that write shards need it

        (split, shard), values = element
        records: List[bytes] = sorted(values)  # key, then record bytes: the local builder's order
        path = temp_shard_path(self.work_dir, split, shard, self.num_shards[split])
        try:
            with tf.io.TFRecordWriter(path) as writer:
                for record in records:
                    writer.write(record[_KEY_BYTES:])
        except (OSError, tf.errors.OpError) as e:  # a full disk: ResourceExhaustedError
            output_dir = posixpath.dirname(self.work_dir)
            raise write_error(e, f"the {split} shards", output_dir) from None
        self.written.inc(len(records))
        yield json.dumps({"split": split, "shard": shard, "examples": len(records)})


def add_build(pipeline: beam.Pipeline, files: List[Tuple[str, str, int]], spec: PackSpec,
              work_dir: str) -> None:
    """Adds the build to `pipeline`: shards and two result files (`files.jsonl`,
    `shards.jsonl`, one JSON line per corpus file and per written shard; with a held-out
    split also `split.json`, the manifest's `eval_split`) under `work_dir`."""
    spread = (pipeline
              | "ListFiles" >> beam.Create(files)
              | "SpreadFiles" >> beam.Reshuffle())
    side_inputs = []
    if spec.pack.eval_fraction > 0:
        split_plan = (spread
                      | "SurveyFiles" >> beam.ParDo(SurveyFile(spec))
                      | "GatherSurveys" >> beam.combiners.ToList()
                      | "PlanSplit" >> beam.Map(_plan, spec.pack.eval_fraction))
        _ = (split_plan
             | "SplitSummary" >> beam.Map(lambda plan: json.dumps(plan.summary))
             | "SplitResult" >> beam.io.WriteToText(f"{work_dir}/split.json",
                                                    shard_name_template=""))
        side_inputs.append(beam.pvalue.AsSingleton(split_plan))
    packed = spread | "PackFiles" >> beam.ParDo(PackFile(spec), *side_inputs).with_outputs(
        FILES_TAG, main="records")
    _ = (packed.records
         | "GroupByShard" >> beam.GroupByKey()
         | "WriteShards" >> beam.ParDo(WriteShard(work_dir, spec.num_shards))
         | "ShardResults" >> beam.io.WriteToText(f"{work_dir}/shards.jsonl",
                                                 shard_name_template=""))
    _ = (packed[FILES_TAG]
         | "FileResults" >> beam.io.WriteToText(f"{work_dir}/files.jsonl",
                                                shard_name_template=""))
