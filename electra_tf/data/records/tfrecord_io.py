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
from typing import Dict, List, Optional, Sequence

import numpy as np

from electra_tf.data.build.example_builder import PackedExample
from electra_tf.errors import ElectraError

# Official feature names (build_pretraining_dataset._make_tf_example); sorted, which is also the
# order deterministic protobuf serialisation writes map entries in.
FEATURE_NAMES = ("input_ids", "input_mask", "segment_ids")
MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT_VERSION = 2
# Versions `read_manifest` accepts. 1: written in corpus order (before the builder's global
# shuffle); readers may warn about it (`is_globally_shuffled`).
READABLE_MANIFEST_VERSIONS = (1, 2)
# Shard name prefixes; the trainer's default globs are `<dir>/pretrain_data.tfrecord*` and
# `<dir>/eval_data.tfrecord*` (official name for the former).
TRAIN_PREFIX = "pretrain_data.tfrecord"
EVAL_PREFIX = "eval_data.tfrecord"

# Protobuf wire-format tags (field_number << 3 | wire_type 2 = length-delimited).
_TAG_FIELD1 = b"\x0a"  # Example.features, Features.feature (map entry), map key, Int64List.value
_TAG_FIELD2 = b"\x12"  # map entry value
_TAG_FIELD3 = b"\x1a"  # Feature.int64_list


class ManifestError(ElectraError, ValueError):
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


def feature_entry(name: str, packed_length: int) -> bytes:
    """Framing of one map entry of `Features.feature` up to (excluding) its packed values."""
    int64_list_len = 1 + len(_varint(packed_length)) + packed_length
    feature_len = 1 + len(_varint(int64_list_len)) + int64_list_len
    key = name.encode()
    body = (_TAG_FIELD1 + _varint(len(key)) + key + _TAG_FIELD2 + _varint(feature_len)
            + _TAG_FIELD3 + _varint(int64_list_len) + _TAG_FIELD1 + _varint(packed_length))
    entry_len = len(body) + packed_length
    return _TAG_FIELD1 + _varint(entry_len) + body


def _varint_batch(values: np.ndarray):
    """Varint-encodes ids in [0, 2**32), vectorised (a few ns per id).

    Returns:
        (bytes of all varints, in order; int64 [n] byte count of each value).
    """
    if values.size and (values.min() < 0 or values.max() >= 1 << 32):
        raise ValueError(f"token ids must be in [0, 2**32), got {values.min()}..{values.max()}")
    values = values.astype(np.uint32, copy=False)
    top = int(values.max()) if values.size else 0
    width = 1
    while top >= 1 << (7 * width):
        width += 1
    groups = np.empty((values.shape[0], width), np.uint8)
    num_bytes = np.ones(values.shape[0], np.int64)
    for b in range(width):
        group = (values >> np.uint32(7 * b)) & np.uint32(0x7F)
        if b + 1 < width:
            more = values >= np.uint32(1 << (7 * (b + 1)))
            num_bytes += more
            group |= more.astype(np.uint32) << np.uint32(7)  # continuation bit
        groups[:, b] = group
    keep = np.arange(width) < num_bytes[:, None]
    return groups[keep].tobytes(), num_bytes


class ExampleSerializer:
    """Fast `tf.train.Example` encoder for packed examples of one `max_seq_length`.

    The varints of all ids of a batch are computed at once with numpy; each record is then one
    `bytes.join` of a memoised prefix (Example and input_ids framing, which depends only on the
    packed input_ids length), the id bytes, and the input_mask / segment_ids payloads, whose
    values are 0/1 (one varint byte each) so their framing is constant.

    Args:
        max_seq_length: int. Feature length (padding with 0).
        cls_id: int. Id of [CLS].
        sep_id: int. Id of [SEP].
    """

    def __init__(self, max_seq_length: int, cls_id: int, sep_id: int):
        self.max_seq_length = max_seq_length
        self.cls_id = cls_id
        self.sep_id = sep_id
        self._mask_head = feature_entry("input_mask", max_seq_length)
        self._segment_head = feature_entry("segment_ids", max_seq_length)
        self._tail_len = len(self._mask_head) + len(self._segment_head) + 2 * max_seq_length
        self._ones = b"\x01" * max_seq_length
        self._zeros = b"\x00" * max_seq_length
        self._prefixes: Dict[int, bytes] = {}  # memo: packed input_ids length -> record prefix

    def _prefix(self, packed_ids_len: int) -> bytes:
        ids_entry = feature_entry("input_ids", packed_ids_len)
        features_len = len(ids_entry) + packed_ids_len + self._tail_len
        prefix = _TAG_FIELD1 + _varint(features_len) + ids_entry
        self._prefixes[packed_ids_len] = prefix
        return prefix

    def serialize(self, examples: Sequence[PackedExample]) -> List[bytes]:
        """Serialises a batch of examples; returns one `tf.train.Example` byte string each."""
        if not examples:
            return []
        length = self.max_seq_length
        cls_id, sep_id = self.cls_id, self.sep_id
        flat: List[int] = []
        num_real = []
        num_first = []  # [CLS] + first + [SEP]
        for first, second, _ in examples:
            flat.append(cls_id)
            flat += first
            flat.append(sep_id)
            n = len(first) + 2
            num_first.append(n)
            if second:
                flat += second
                flat.append(sep_id)
                n += len(second) + 1
            if n > length:
                raise ValueError(f"example of {n} ids exceeds max_seq_length {length}")
            num_real.append(n)
        encoded, bytes_per_id = _varint_batch(np.asarray(flat, dtype=np.int64))
        ends = np.cumsum(bytes_per_id)[np.cumsum(num_real) - 1].tolist()

        out = []
        start = 0
        zeros, ones = self._zeros, self._ones
        prefixes = self._prefixes
        mask_head, segment_head = self._mask_head, self._segment_head
        for n, n_first, end in zip(num_real, num_first, ends):
            pad = length - n
            packed_ids_len = end - start + pad
            prefix = prefixes.get(packed_ids_len) or self._prefix(packed_ids_len)
            out.append(b"".join((
                prefix, encoded[start:end], zeros[:pad],
                mask_head, ones[:n], zeros[:pad],
                segment_head, zeros[:n_first], ones[:n - n_first], zeros[:pad],
            )))
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
    if manifest["format_version"] not in READABLE_MANIFEST_VERSIONS:
        raise ManifestError(
            f"dataset manifest {path} has format_version {manifest['format_version']}, "
            f"expected one of {', '.join(map(str, READABLE_MANIFEST_VERSIONS))}")
    return manifest


def is_globally_shuffled(manifest: dict) -> bool:
    """Whether the builder shuffled the examples globally (format 2 on), so that any stretch of
    any shard is a random sample of the corpus."""
    return manifest["format_version"] >= 2


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

