"""The pretraining TFRecord format: feature names, fast serialisation, parsing and the manifest.

Each record is a `tf.train.Example` with exactly three int64 features of length `max_seq_length`
(official `_make_tf_example` / `pretrain_data._decode_record`): `input_ids`, `input_mask`,
`segment_ids`. There are no masked-LM fields: masking is dynamic, in the training graph.

`serialize_examples` hand-encodes the protobuf wire format with numpy (varints for all tokens of a
batch at once, constant framing precomputed), which is much faster than building
`tf.train.Example` objects; the tests prove its bytes equal
`tf.train.Example.SerializeToString(deterministic=True)` and parse with the official feature spec.

The manifest helpers (`read_manifest`, `check_manifest`, `shard_paths`) let the trainer refuse
data built with another vocab or sequence length. TensorFlow is imported only inside the functions
that need it, so the builder can validate its inputs (and fail fast) without loading it.
"""

from __future__ import annotations

import json
import os
from typing import Dict, Iterable, List, Optional, Sequence

import numpy as np

from electra_tf.data.example_builder import PackedExample

# Official feature names (build_pretraining_dataset._make_tf_example); sorted, which is also the
# order deterministic protobuf serialisation writes map entries in.
FEATURE_NAMES = ("input_ids", "input_mask", "segment_ids")
MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT_VERSION = 1
# Shard name prefixes; the trainer's default globs are `<dir>/pretrain_data.tfrecord*` and
# `<dir>/eval_data.tfrecord*` (official name for the former).
TRAIN_PREFIX = "pretrain_data.tfrecord"
EVAL_PREFIX = "eval_data.tfrecord"

# Protobuf wire-format tags (field_number << 3 | wire_type 2 = length-delimited).
_TAG_FIELD1 = b"\x0a"  # Example.features, Features.feature (map entry), map key, Int64List.value
_TAG_FIELD2 = b"\x12"  # map entry value
_TAG_FIELD3 = b"\x1a"  # Feature.int64_list
_VARINT_MAX_BYTES = 5  # token ids are < 2**35, so at most 5 varint bytes each


class ManifestError(ValueError):
    """A dataset manifest is missing, malformed or does not match what the caller needs."""


def shard_name(prefix: str, index: int, num_shards: int) -> str:
    """Official shard naming: `<prefix>-{i}-of-{n}` (i not zero-padded)."""
    return f"{prefix}-{index}-of-{num_shards}"


def feature_spec(max_seq_length: int) -> dict:
    """The official reader spec: FixedLenFeature([max_seq_length], tf.int64) for each feature."""
    import tensorflow as tf  # lazy: see module docstring

    return {name: tf.io.FixedLenFeature([max_seq_length], tf.int64) for name in FEATURE_NAMES}


def parse_example(serialized, max_seq_length: int) -> Dict[str, "tf.Tensor"]:
    """Parses serialized examples into int32 features (official `_decode_record`).

    Args:
        serialized: string tensor, scalar (one record) or [batch_size] (a batch; faster).
        max_seq_length: int. Length every feature was written with.

    Returns:
        {"input_ids", "input_mask", "segment_ids"}: int32 tensors of shape [max_seq_length] or
        [batch_size, max_seq_length].
    """
    import tensorflow as tf  # lazy: see module docstring

    serialized = tf.convert_to_tensor(serialized, dtype=tf.string)
    spec = feature_spec(max_seq_length)
    if serialized.shape.rank == 0:
        parsed = tf.io.parse_single_example(serialized, spec)
    else:
        parsed = tf.io.parse_example(serialized, spec)
    # int64 on disk (the only integer type tf.train.Example has); int32 everywhere in the model.
    return {name: tf.cast(parsed[name], tf.int32) for name in FEATURE_NAMES}


def make_tf_example(features: Dict[str, Sequence[int]]):
    """Reference (slow) encoder: a `tf.train.Example` from the three feature lists."""
    import tensorflow as tf  # lazy: see module docstring

    return tf.train.Example(features=tf.train.Features(feature={
        name: tf.train.Feature(int64_list=tf.train.Int64List(value=list(features[name])))
        for name in FEATURE_NAMES
    }))


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _varint_batch(values: np.ndarray):
    """Varint-encodes non-negative ints. Returns (bytes of all values, bytes-per-value array)."""
    values = values.astype(np.uint64, copy=False)
    num_bytes = np.ones(values.shape, dtype=np.int64)
    for k in range(1, _VARINT_MAX_BYTES):
        num_bytes += values >= (1 << (7 * k))
    shifts = np.arange(_VARINT_MAX_BYTES, dtype=np.uint64) * np.uint64(7)
    groups = ((values[:, None] >> shifts) & np.uint64(0x7F)).astype(np.uint8)
    position = np.arange(_VARINT_MAX_BYTES)
    groups[position[None, :] < (num_bytes[:, None] - 1)] |= 0x80  # continuation bits
    return groups[position[None, :] < num_bytes[:, None]].tobytes(), num_bytes


def _entry(name: str, packed_length: int) -> bytes:
    """Framing of one map entry of `Features.feature` up to (excluding) its packed values."""
    int64_list_len = 1 + len(_varint(packed_length)) + packed_length
    feature_len = 1 + len(_varint(int64_list_len)) + int64_list_len
    key = name.encode()
    body = (_TAG_FIELD1 + _varint(len(key)) + key + _TAG_FIELD2 + _varint(feature_len)
            + _TAG_FIELD3 + _varint(int64_list_len) + _TAG_FIELD1 + _varint(packed_length))
    entry_len = len(body) + packed_length
    return _TAG_FIELD1 + _varint(entry_len) + body


class ExampleSerializer:
    """Fast `tf.train.Example` encoder for packed examples of one `max_seq_length`.

    Args:
        max_seq_length: int. Feature length (padding with 0).
        cls_id: int. Id of [CLS].
        sep_id: int. Id of [SEP].
    """

    def __init__(self, max_seq_length: int, cls_id: int, sep_id: int):
        self.max_seq_length = max_seq_length
        self.cls_id = cls_id
        self.sep_id = sep_id
        # input_mask and segment_ids values are 0/1, one varint byte each: their packed payload is
        # always max_seq_length bytes, so their framing is a constant.
        self._mask_head = _entry("input_mask", max_seq_length)
        self._segment_head = _entry("segment_ids", max_seq_length)
        self._ones = b"\x01" * max_seq_length
        self._zeros = b"\x00" * max_seq_length
        self._ids_heads: Dict[int, bytes] = {}  # memo: packed input_ids length -> framing

    def serialize(self, examples: Sequence[PackedExample]) -> List[bytes]:
        """Serialises a batch of examples; returns one `tf.train.Example` byte string each."""
        if not examples:
            return []
        length = self.max_seq_length
        flat: List[int] = []
        num_real = []
        num_first = []  # [CLS] + first + [SEP]
        for first, second, _ in examples:
            flat.append(self.cls_id)
            flat += first
            flat.append(self.sep_id)
            n = len(first) + 2
            num_first.append(n)
            if second:
                flat += second
                flat.append(self.sep_id)
                n += len(second) + 1
            if n > length:
                raise ValueError(f"example of {n} ids exceeds max_seq_length {length}")
            num_real.append(n)
        encoded, bytes_per_id = _varint_batch(np.asarray(flat, dtype=np.int64))
        ends = np.cumsum(bytes_per_id)
        example_ends = ends[np.cumsum(num_real) - 1].tolist()

        out = []
        start = 0
        zeros, ones = self._zeros, self._ones
        ids_heads = self._ids_heads
        mask_head, segment_head = self._mask_head, self._segment_head
        for n, n_first, end in zip(num_real, num_first, example_ends):
            pad = length - n
            packed_ids_len = end - start + pad
            ids_head = ids_heads.get(packed_ids_len)
            if ids_head is None:
                ids_head = ids_heads[packed_ids_len] = _entry("input_ids", packed_ids_len)
            features = b"".join((
                ids_head, encoded[start:end], zeros[:pad],
                mask_head, ones[:n], zeros[:pad],
                segment_head, zeros[:n_first], ones[:n - n_first], zeros[:pad],
            ))
            out.append(_TAG_FIELD1 + _varint(len(features)) + features)
            start = end
        return out


def _manifest_path(path: str) -> str:
    return os.path.join(path, MANIFEST_NAME) if os.path.isdir(path) else path


def read_manifest(path: str) -> dict:
    """Reads a dataset's `manifest.json`.

    Args:
        path: str. The dataset (output) directory or the manifest file itself.

    Raises:
        ManifestError: missing, unreadable, not JSON, or lacking required keys (message names
            the file).
    """
    path = _manifest_path(path)
    if not os.path.isfile(path):
        raise ManifestError(
            f"no dataset manifest at {path} (build the data with build_pretraining_dataset.py)")
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError) as e:
        raise ManifestError(f"cannot read dataset manifest {path}: {e}") from e
    required = ("format_version", "max_seq_length", "vocab", "splits")
    missing = [k for k in required if not isinstance(manifest, dict) or k not in manifest]
    if missing:
        raise ManifestError(f"dataset manifest {path} lacks key(s): {', '.join(missing)}")
    if manifest["format_version"] != MANIFEST_FORMAT_VERSION:
        raise ManifestError(
            f"dataset manifest {path} has format_version {manifest['format_version']}, "
            f"expected {MANIFEST_FORMAT_VERSION}")
    return manifest


def check_manifest(manifest: dict, *, max_seq_length: Optional[int] = None,
                   vocab_sha256: Optional[str] = None, vocab_size: Optional[int] = None) -> None:
    """Raises ManifestError if the dataset was built with other settings than the caller's.

    Args:
        manifest: dict from `read_manifest`.
        max_seq_length: the trainer's max_seq_length (must be equal), or None to skip.
        vocab_sha256: sha256 of the trainer's vocab file (must be equal), or None to skip.
        vocab_size: the model's vocab_size (must be >= the dataset vocab's size), or None.
    """
    if max_seq_length is not None and manifest["max_seq_length"] != max_seq_length:
        raise ManifestError(
            f"dataset was built with max_seq_length {manifest['max_seq_length']}, "
            f"but max_seq_length is {max_seq_length}")
    vocab = manifest["vocab"]
    if vocab_sha256 is not None and vocab["sha256"] != vocab_sha256:
        raise ManifestError(
            f"dataset was built with vocab {vocab['path']} (sha256 {vocab['sha256'][:12]}...), "
            f"which differs from the given vocab (sha256 {vocab_sha256[:12]}...)")
    if vocab_size is not None and vocab["size"] > vocab_size:
        raise ManifestError(
            f"dataset vocab has {vocab['size']} tokens, more than vocab_size {vocab_size}")


def shard_paths(manifest: dict, data_dir: str, split: str = "train",
                verify: bool = True) -> List[str]:
    """Paths of a split's shards, optionally checking each exists with the recorded size.

    Args:
        manifest: dict from `read_manifest`.
        data_dir: str. Directory holding the shards (the manifest's directory).
        split: "train" or "eval".
        verify: check existence and byte size of every shard.

    Raises:
        ManifestError: unknown split, or a shard is missing or has another size.
    """
    if split not in manifest["splits"]:
        raise ManifestError(f"dataset manifest has no split {split!r}")
    paths = []
    for shard in manifest["splits"][split]["shards"]:
        path = os.path.join(data_dir, shard["file"])
        if verify:
            if not os.path.isfile(path):
                raise ManifestError(f"shard listed in the manifest is missing: {path}")
            size = os.path.getsize(path)
            if size != shard["bytes"]:
                raise ManifestError(
                    f"shard {path} has {size} bytes, the manifest says {shard['bytes']}")
        paths.append(path)
    return paths


def count_records(paths: Iterable[str]) -> int:
    """Counts the records in TFRecord files (reads them; for validation and tests)."""
    import tensorflow as tf  # lazy: see module docstring

    return sum(1 for path in paths for _ in tf.data.TFRecordDataset(path))
