"""The plan of a local dataset build: shard counts, packing tasks, shuffle buckets, temporaries.

`make_plan` decides, before any work, how many train and eval shards there are (`num_out_files`
or one per `DEFAULT_BYTES_PER_SHARD` of text), how the corpus files are cut into packing tasks
(consecutive runs of about equal text size, `pack_tasks`), how each split's shuffle is cut into
buckets that fit `shuffle_memory_mb`, and the temporary paths of the shards, the shuffle and
inputs.jsonl. The shard counts (`default_num_out_files`, `num_eval_files`) are the Beam build's
too.
"""

from __future__ import annotations

import math
from typing import Dict, List, NamedTuple, Sequence, Tuple

from electra_tf.data.build.build_config import BuildConfig
from electra_tf.data.text.corpus import CorpusFile
from electra_tf.data.text.formats import estimated_text_bytes
from electra_tf.data.build.output import INPUTS_NAME, temp_prefix
from electra_tf.data.build.shuffle import BucketLayout
from electra_tf.data.records.tfrecord_io import EVAL_PREFIX, TRAIN_PREFIX, shard_name

OFFICIAL_NUM_OUT_FILES = 1000
DEFAULT_BYTES_PER_SHARD = 8 << 20
MIN_DEFAULT_SHARDS = 4
# Record bytes per byte of text, for planning shuffle buckets (~1.1 measured at length 128;
# padding of short examples raises it). Only sets bucket sizes; memory is bounded regardless.
RECORD_BYTES_PER_TEXT_BYTE = 1.25
TASKS_PER_PROCESS = 8  # packing tasks per process: small enough to balance, large to amortise
MAX_TASK_BYTES = 64 << 20


def default_num_out_files(corpus_bytes: int) -> int:
    """Default train shard count: one per 8 MiB of text, >= 4, <= 1000."""
    wanted = max(MIN_DEFAULT_SHARDS, math.ceil(corpus_bytes / DEFAULT_BYTES_PER_SHARD))
    return min(OFFICIAL_NUM_OUT_FILES, wanted)


def num_eval_files(num_out_files: int, eval_fraction: float) -> int:
    """Eval shard count: proportional to the train shards, at least one (0 if no split)."""
    if eval_fraction <= 0:
        return 0
    return max(1, math.ceil(num_out_files * eval_fraction))


class Plan(NamedTuple):
    """How the work is split, and where its temporary files go."""

    num_processes: int
    num_out_files: int
    num_eval_files: int
    tasks: List[Tuple[int, List[CorpusFile]]]  # packing tasks: consecutive files by relpath
    layouts: Dict[str, BucketLayout]  # per split
    shard_tmp: Dict[str, Dict[int, str]]  # per split: shard index -> temporary path
    shuffle_dir: str
    inputs_tmp: str

    def temp_paths(self) -> List[str]:
        return ([p for paths in self.shard_tmp.values() for p in paths.values()]
                + [self.shuffle_dir, self.inputs_tmp])


def pack_tasks(files: Sequence[CorpusFile], num_processes: int) -> List[List[CorpusFile]]:
    """Cuts the files (in relpath order) into consecutive runs of about equal text size.

    About TASKS_PER_PROCESS tasks per process (at most MAX_TASK_BYTES each), so the processes
    pulling them finish together; a file is never split.
    """
    sizes = [estimated_text_bytes(f) for f in files]
    target = max(1, min(MAX_TASK_BYTES, sum(sizes) // (TASKS_PER_PROCESS * num_processes)))
    tasks, current, current_bytes = [], [], 0
    for corpus_file, size in zip(files, sizes):
        current.append(corpus_file)
        current_bytes += size
        if current_bytes >= target:
            tasks.append(current)
            current, current_bytes = [], 0
    if current:
        tasks.append(current)
    return tasks


def make_plan(config: BuildConfig, files: Sequence[CorpusFile]) -> Plan:
    """The plan of building `files` (the corpus, in relpath order) with the resolved `config`."""
    text_bytes = sum(estimated_text_bytes(f) for f in files)
    num_out = config.num_out_files or default_num_out_files(text_bytes)
    num_eval = num_eval_files(num_out, config.eval_fraction)
    tasks = pack_tasks(files, config.num_processes)
    memory = config.shuffle_memory_mb << 20
    record_bytes = text_bytes * RECORD_BYTES_PER_TEXT_BYTE
    layouts = {"train": BucketLayout.plan(num_out, record_bytes * (1 - config.eval_fraction),
                                          memory)}
    if num_eval:
        layouts["eval"] = BucketLayout.plan(num_eval, record_bytes * config.eval_fraction, memory)
    prefix = temp_prefix(config.output_dir)
    shard_tmp = {split: {i: prefix + shard_name(name, i, n) for i in range(n)}
                 for split, name, n in (("train", TRAIN_PREFIX, num_out),
                                        ("eval", EVAL_PREFIX, num_eval)) if n}
    return Plan(max(1, min(config.num_processes, len(tasks))), num_out, num_eval,
                list(enumerate(tasks)), layouts, shard_tmp, prefix + "shuffle",
                prefix + INPUTS_NAME)
