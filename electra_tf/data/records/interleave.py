"""tf.data's deterministic interleave of the file stream, re-implemented without TensorFlow.

The file stream is each epoch's file order (`order.file_order` in training, the listed order in
evaluation), epoch after epoch when repeating. `Interleave` reads `cycle` files at once
(`order.interleave_cycle`: `order.MAX_INTERLEAVE_CYCLE` at most), one record from each in turn;
a finished file's slot is taken by the next file of the stream, across epochs when repeating, as
tf.data's interleave does. With a record plan (`integrity.validate_dataset(...,
skip_bad_records=True)`) only each file's first `take` records minus its `skip` indices come
out. The position is a few integers (`snapshot` / `restore`): the epoch, the next file of the
epoch's order, the cycle slot, and each open file's record index and byte offset.

Nothing here imports TensorFlow.
"""

from __future__ import annotations

from typing import List, Optional

import numpy as np

from electra_tf.data.records import order
from electra_tf.data.records.record_framing import FileReader, Record
from electra_tf.errors import DataError


class Interleave:
    """tf.data's deterministic interleave of the file stream (see module docstring), with a
    position that is a few integers (`snapshot` / `restore`).

    Args:
        files: this pipeline's files, in their listed order.
        plan: optional {path: {"take": n, "skip": [indices]}} (a record plan) for `files`.
        cycle: int. Files read at once.
        is_training: bool. Each epoch reads the files in `order.file_order` (else as listed).
        seed: int. Seeds the file order.
        repeat: bool. Start the next epoch when the files are done (else end).
    """

    def __init__(self, files: List[str], plan: Optional[dict], cycle: int, is_training: bool,
                 seed: int, repeat: bool):
        self.files = files
        self.takes = [plan[f]["take"] for f in files] if plan is not None else None
        self.skips = [frozenset(plan[f]["skip"]) for f in files] if plan is not None else None
        self.cycle = cycle
        self.is_training = is_training
        self.seed = seed
        self.repeat = repeat
        self.slots: List[Optional[FileReader]] = [None] * cycle
        self.epoch = self.next_file = self.cycle_index = self.emitted = 0
        self.started = False
        self._order: Optional[np.ndarray] = None
        self._order_epoch = -1
        self._opened_since_record = 0

    # -- the file stream ------------------------------------------------------------------------
    def _epoch_order(self) -> np.ndarray:
        if self._order_epoch != self.epoch:
            n = len(self.files)
            self._order = (order.file_order(self.seed, self.epoch, n) if self.is_training
                           else np.arange(n))
            self._order_epoch = self.epoch
        return self._order

    def _open_next(self) -> Optional[FileReader]:
        if self.next_file == len(self.files):
            if not self.repeat:
                return None
            self.epoch += 1
            self.next_file = 0
        file_index = int(self._epoch_order()[self.next_file])
        self.next_file += 1
        self._opened_since_record += 1
        if self._opened_since_record > len(self.files) + self.cycle + 1:
            raise DataError(f"no record in any of the {len(self.files)} file(s) "
                            f"{self.files[0]}...: they are empty")
        return FileReader(self.files[file_index], file_index)

    def _start(self) -> None:
        for k in range(self.cycle):
            self.slots[k] = self._open_next()
            if self.slots[k] is None:
                break
        self.started = True

    # -- records --------------------------------------------------------------------------------
    def _read_slot(self, reader: FileReader, read: List[Record]) -> Optional[Record]:
        """The slot's next record (planned files: within `take`, not skipped), or None."""
        take = self.takes[reader.file_index] if self.takes is not None else None
        skip = self.skips[reader.file_index] if self.skips is not None else ()
        while True:
            if take is not None and reader.index >= take:
                return None
            record = reader.read()
            if record is None:
                return None
            read.append(record)
            if record.index not in skip:
                return record

    def next_record(self, read: List[Record]) -> Optional[Record]:
        """The next record of the interleave, or None at its end. Every record read (skipped
        ones too) is appended to `read`, for the CRC check."""
        if not self.started:
            self._start()
        cycle = self.cycle
        while True:
            for i in range(cycle):
                k = (self.cycle_index + i) % cycle
                if self.slots[k] is not None:
                    self.cycle_index = k
                    break
            else:
                return None
            reader = self.slots[self.cycle_index]
            record = self._read_slot(reader, read)
            if record is not None:
                self.cycle_index = (self.cycle_index + 1) % cycle
                self.emitted += 1
                self._opened_since_record = 0
                return record
            reader.close()
            self.slots[self.cycle_index] = self._open_next()
            self.cycle_index = (self.cycle_index + 1) % cycle

    # -- position -------------------------------------------------------------------------------
    def snapshot(self) -> dict:
        return {"started": self.started, "epoch": self.epoch, "next_file": self.next_file,
                "cycle_index": self.cycle_index, "emitted": self.emitted,
                "slots": [None if s is None else [s.file_index, s.index, s.offset]
                          for s in self.slots]}

    def restore(self, snapshot: dict) -> None:
        self.close()
        self.started = bool(snapshot["started"])
        self.epoch = int(snapshot["epoch"])
        self.next_file = int(snapshot["next_file"])
        self.cycle_index = int(snapshot["cycle_index"])
        self.emitted = int(snapshot["emitted"])
        if len(snapshot["slots"]) != self.cycle:
            raise ValueError(f"state has {len(snapshot['slots'])} interleave slots, this "
                             f"reader {self.cycle}")
        self._opened_since_record = 0
        self.slots = [None if s is None else
                      FileReader(self.files[int(s[0])], int(s[0]), int(s[1]), int(s[2]))
                      for s in snapshot["slots"]]

    def close(self) -> None:
        for reader in self.slots:
            if reader is not None:
                reader.close()
        self.slots = [None] * self.cycle
