"""Pretraining batches from TFRecord shards without TensorFlow (the JAX and PyTorch trainers).

`BatchReader` yields the batches `pipeline.make_dataset` yields, bit for bit and in the same
order, for the same files, seed, batch size, input pipeline and `record_plan`: the file order of
each epoch and the record shuffle are `electra_tf.data.records.order`'s hash permutations, computed here
with numpy; the interleave (`interleave.Interleave`: `MAX_INTERLEAVE_CYCLE` files, one record
from each in turn, a finished file's slot taken by the next file of the stream, across epochs
when repeating), the file or record sharding per input pipeline, the record windows and the
dropped remainder are tf.data's, re-implemented (tests/data/test_record_reader.py compares the
two).

Nothing here imports TensorFlow (the module works with `sys.modules["tensorflow"] = None`).

**Reading.** Records are read with plain file I/O (`record_framing`) and both CRCs are checked
for every record read, as TensorFlow's reader does: the length's when the record is read, the
data's (`record_crc`: google-crc32c) over all records read for a window (or batch) before any of
it is used; the examples of a window are decoded at once (`example_decoding`). Damage is
treated as the TensorFlow path treats it:

- a bad CRC, or a file that ends inside a record's length+data, stops the reader with a
  `DataError` naming the file, the record index and its byte offset, raised where tf.data would
  raise its DataLossError (before any batch of the window that reads it). As TensorFlow's
  reader, a file that ends inside the 12-byte header of a record ends cleanly there.
- a record that does not parse as an example of the three int64 features of length
  `max_seq_length` raises a `DataError` naming it at the batch that holds it (where the TF
  pipeline's parse fails).
- under `skip_bad_records` the trainer passes `record_plan` (`integrity.validate_dataset`):
  only the planned files are read, their first `take` records minus the `skip` indices, so
  the damage is never reached.

**Speed** (one core of an AMD EPYC, ELECTRA records of 128 tokens, ~550 bytes): ~0.2 us per
record for the CRCs and ~17 us to decode; ~45,000 records/s in all on a loaded machine
(`benchmarks/reader_parts.py`; the TF pipeline, in C++ threads: ~200,000), far above what a
training step consumes.

**Position.** `state()` is a small JSON-serialisable dict: the window (chunk) the next record
comes from, the records of it already yielded, and the interleave's position at the window's
start (epoch, next file of the epoch's order, cycle slot, and each open file's record index and
byte offset). `restore(state)` seeks every open file to its offset and re-reads at most that one
window (1,000 records in training; none in evaluation, whose windows are batches), so the next
batch is the one an uninterrupted reader yields.

**Memory** is bounded by one window of records (raw and decoded), the prefetched batches and a
read buffer per open file, whatever the shard sizes.

**Threads.** With `prefetch > 0` a background thread reads and decodes up to `prefetch` batches
ahead (numpy releases the GIL for the vectorised parts, file reads release it too); `state()`
describes the batches the caller has received, not those prefetched. `prefetch=0` reads in the
caller's thread.

grain (not a dependency) is not used: its data loaders shard and shuffle records by index
(random access, per-record global permutations) and could not reproduce the TF pipeline's
sequential interleave of files, which this reader must match record for record.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import threading
from typing import Dict, List, NamedTuple, Optional, Tuple

import numpy as np

from electra_tf.data.records import order
from electra_tf.data.records.example_decoding import decode_examples, parse_error
from electra_tf.data.records.integrity import list_files
from electra_tf.data.records.interleave import Interleave
from electra_tf.data.records.record_framing import Record, damage_message, first_bad_crc
from electra_tf.data.records.tfrecord_io import FEATURE_NAMES
from electra_tf.errors import DataError

STATE_VERSION = 1


class _Chunk(NamedTuple):
    """One window of the post-shuffle stream, decoded and in emission order."""

    index: int
    features: np.ndarray   # int32 [m, 3, L]
    bad: np.ndarray        # bool [m]
    errors: Dict[int, str]  # position -> DataError text
    before: dict           # interleave snapshot at its start
    after: dict            # ... and after it


class _Settings(NamedTuple):
    """What a reader reads, and in which order (`BatchReader`'s arguments, resolved)."""

    files: List[str]          # this pipeline's files
    shard_records: bool       # keep every num_input_pipelines-th record instead
    cycle: int                # files interleaved at once
    batch_size: int
    max_seq_length: int
    is_training: bool
    seed: int
    num_input_pipelines: int
    input_pipeline_id: int
    repeat: bool
    record_plan: Optional[dict]
    chunk_size: int           # records per window (training) or per batch (evaluation)


class _Stream:
    """The reader's pipeline, run by one thread: chunks (windows) -> batches, with the state
    after every batch."""

    def __init__(self, settings: _Settings):
        self.r = settings
        self.interleave = Interleave(settings.files, settings.record_plan, settings.cycle,
                                      settings.is_training, settings.seed, settings.repeat)
        self.next_chunk_index = 0
        self.current: Optional[_Chunk] = None
        self.position = 0  # records of `current` already in batches
        self.ended = False

    def state(self) -> dict:
        c = self.current
        if c is None:
            return {"chunk": self.next_chunk_index, "offset": 0,
                    "interleave": self.interleave.snapshot()}
        if self.position == len(c.features):
            return {"chunk": c.index + 1, "offset": 0, "interleave": c.after}
        return {"chunk": c.index, "offset": self.position, "interleave": c.before}

    def restore(self, state: dict) -> None:
        self.interleave.restore(state["interleave"])
        self.next_chunk_index = int(state["chunk"])
        self.current, self.position, self.ended = None, 0, False
        offset = int(state["offset"])
        if offset:
            chunk = self._read_chunk()
            if chunk is None or offset > len(chunk.features):
                raise ValueError(f"state offset {offset} is past its window")
            self.current, self.position = chunk, offset

    def _read_chunk(self) -> Optional[_Chunk]:
        r = self.r
        before = self.interleave.snapshot()
        read: List[Record] = []
        owned: List[Record] = []
        size = r.chunk_size
        error: Optional[DataError] = None
        try:
            while len(owned) < size:
                record = self.interleave.next_record(read)
                if record is None:
                    break
                if r.shard_records and (self.interleave.emitted - 1) % r.num_input_pipelines \
                        != r.input_pipeline_id:
                    continue
                owned.append(record)
        except DataError as e:
            error = e
        bad_crc = first_bad_crc(read)
        if bad_crc is not None:  # the first damage in read order wins
            rec = read[bad_crc]
            raise DataError(damage_message(r.files[rec.file_index], rec.index, rec.offset,
                                           "corrupted record (data CRC mismatch)"))
        if error is not None:
            raise error
        if not owned:
            return None
        decoded = decode_examples([rec.data for rec in owned], r.max_seq_length)
        features, bad = decoded.features, decoded.bad
        errors = {i: parse_error(r.files[owned[i].file_index], owned[i].index, r.max_seq_length)
                  + f" ({decoded.reasons[i]})" for i in np.flatnonzero(bad).tolist()}
        index = self.next_chunk_index
        if r.is_training:
            perm = order.record_order(r.seed, index, len(owned))
            features, bad = features[perm], bad[perm]
            inverse = np.empty_like(perm)
            inverse[perm] = np.arange(len(perm))
            errors = {int(inverse[i]): text for i, text in errors.items()}
        self.next_chunk_index += 1
        return _Chunk(index, features, bad, errors, before, self.interleave.snapshot())

    def next_batch(self) -> Optional[Tuple[Dict[str, np.ndarray], dict]]:
        """The next batch and the state after it, or None at the end of the data."""
        if self.ended:
            return None
        size = self.r.batch_size
        pieces, need = [], size
        # Remember where the batch starts: a short end leaves the position unchanged.
        start_current, start_position = self.current, self.position
        while need:
            if self.current is None or self.position == len(self.current.features):
                chunk = self._read_chunk()
                if chunk is None:
                    self.ended = True
                    self.current, self.position = start_current, start_position
                    return None
                self.current, self.position = chunk, 0
            c = self.current
            take = min(need, len(c.features) - self.position)
            rows = slice(self.position, self.position + take)
            bad = np.flatnonzero(c.bad[rows])
            if bad.size:
                raise DataError(c.errors[self.position + int(bad[0])])
            pieces.append(c.features[rows])
            self.position += take
            need -= take
        batch = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
        return ({name: np.ascontiguousarray(batch[:, k]) for k, name in enumerate(FEATURE_NAMES)},
                self.state())

    def close(self) -> None:
        self.interleave.close()


_END = object()


def _produce(stream: _Stream):
    """The next (batch, state), `_END`, or the exception to hand to the consumer in order."""
    try:
        item = stream.next_batch()
    except Exception as e:  # noqa: BLE001 (re-raised by the consumer)
        return e
    return _END if item is None else item


def _prefetch(stream: _Stream, out: queue.Queue, stop: threading.Event) -> None:
    """The prefetch thread: batches into `out` until the end, an error, or `stop`."""
    while not stop.is_set():
        item = _produce(stream)
        out.put(item)
        if item is _END or isinstance(item, BaseException):
            return


class BatchReader:
    """The TF pipeline's batches without TensorFlow (see module docstring).

    Args:
        patterns: str. Comma-separated file globs (local files).
        batch_size: int. Batch size of THIS pipeline.
        max_seq_length: int. Feature length the shards were written with.
        is_training: bool. Shuffle files (per epoch) and records (`order`).
        seed: int. Seeds the shuffles.
        num_input_pipelines: int. Input pipelines (workers) reading the data.
        input_pipeline_id: int. This pipeline, in [0, num_input_pipelines).
        repeat: bool. Cycle through the data forever.
        record_plan: optional {path: {"take": n, "skip": [indices]}} from
            `integrity.validate_dataset(..., skip_bad_records=True)`.
        prefetch: int. Batches a background thread prepares ahead (0: no thread).

    Iterating yields {"input_ids", "input_mask", "segment_ids"}: np.int32 [batch_size,
    max_seq_length], the remainder dropped. Raises DataError on damaged data (module docstring).
    """

    def __init__(self, patterns: str, *, batch_size: int, max_seq_length: int, is_training: bool,
                 seed: int = 0, num_input_pipelines: int = 1, input_pipeline_id: int = 0,
                 repeat: bool = True, record_plan: Optional[dict] = None, prefetch: int = 2):
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        all_files = list_files(patterns)
        remote = [f for f in all_files if "://" in f]
        if remote:
            raise DataError(f"{remote[0]}: BatchReader reads local files only (mount the bucket, "
                            "e.g. with gcsfuse, or copy the shards)")
        if record_plan is not None:
            all_files = [f for f in all_files if f in record_plan]
            if not all_files:
                raise DataError(f"record_plan names none of the files of {patterns!r}")
        files, shard_records = order.pipeline_files(all_files, num_input_pipelines,
                                                    input_pipeline_id)
        self.settings = _Settings(
            files, shard_records, order.interleave_cycle(len(all_files)), batch_size,
            max_seq_length, is_training, seed, num_input_pipelines, input_pipeline_id, repeat,
            record_plan,
            # Training: windows of the record shuffle; evaluation: each batch is a window.
            order.RECORD_SHUFFLE_WINDOW if is_training else batch_size)
        self.files = files
        self.prefetch = max(0, int(prefetch))
        self.key = self._key()
        self._stream = _Stream(self.settings)
        self._state = self._stream.state()
        self._thread: Optional[threading.Thread] = None
        self._queue: Optional[queue.Queue] = None
        self._stop = threading.Event()
        self._error: Optional[BaseException] = None
        self._closed = False

    def _key(self) -> str:
        """What a position belongs to: the files read and every setting of the order."""
        key = self.settings._asdict()
        key["files"] = [os.path.basename(f) for f in self.files]
        if self.settings.record_plan is not None:
            key["record_plan"] = {os.path.basename(f): self.settings.record_plan[f]
                                  for f in self.files}
        key["order"] = STATE_VERSION
        return hashlib.sha256(json.dumps(key, sort_keys=True).encode("utf-8")).hexdigest()

    # --- iteration --------------------------------------------------------------------------------
    def __iter__(self) -> "BatchReader":
        return self

    def __next__(self) -> Dict[str, np.ndarray]:
        if self._closed:
            raise ValueError("BatchReader is closed")
        if self._error is not None:
            raise self._error
        if self.prefetch == 0:
            item = self._produce()
        else:
            if self._thread is None:
                self._start_thread()
            item = self._queue.get()
        if item is _END:
            if self.prefetch:
                self._queue.put(_END)  # later calls end too
            raise StopIteration
        if isinstance(item, BaseException):
            self._error = item
            raise item
        batch, self._state = item
        return batch

    def _produce(self):
        return _produce(self._stream)

    def _start_thread(self) -> None:
        self._stop = threading.Event()
        self._queue = queue.Queue(maxsize=self.prefetch)
        # The thread holds the stream, not the reader: an unclosed reader can still be
        # collected, and its __del__ stops the thread.
        self._thread = threading.Thread(target=_prefetch, name="BatchReader", daemon=True,
                                        args=(self._stream, self._queue, self._stop))
        self._thread.start()

    def _stop_thread(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        while self._thread.is_alive():
            try:  # unblock a put on the full queue
                while True:
                    self._queue.get_nowait()
            except queue.Empty:
                pass
            self._thread.join(timeout=0.01)
        self._thread = self._queue = None

    # --- position ---------------------------------------------------------------------------------
    def state(self) -> dict:
        """The position after the last batch returned (JSON-serialisable)."""
        return json.loads(json.dumps({"version": STATE_VERSION, "key": self.key,
                                      "position": self._state}))

    def restore(self, state: dict) -> None:
        """Continues from `state` (from `state()` of a reader with the same files and
        settings): the next batch is the one that followed it.

        Raises:
            ValueError: a state of another version, or of another reader (files, settings).
        """
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"reader state version {state.get('version')} is not "
                             f"{STATE_VERSION}")
        if state.get("key") != self.key:
            raise ValueError("the reader state belongs to another reader (other files, batch "
                             "size, seed, input pipeline or record plan)")
        self._stop_thread()
        self._error = None
        self._stream.restore(state["position"])
        self._state = self._stream.state()

    # --- lifetime ---------------------------------------------------------------------------------
    def close(self) -> None:
        """Stops the prefetch thread and closes the files."""
        if self._closed:
            return
        self._stop_thread()
        self._stream.close()
        self._closed = True

    def __enter__(self) -> "BatchReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
