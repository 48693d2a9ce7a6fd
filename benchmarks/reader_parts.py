"""Benchmark: the TensorFlow-free reader's hand-written parts against maintained libraries.

Issue 48, item 5: `record_reader.BatchReader` checks each record's CRC32C (`record_crc`) and
decodes `tf.train.Example`s (`example_decoding`) with code written here. The candidates:

* CRC32C: `record_crc.crc32c_batch` was a numpy slicing-by-8, one lane per record; against the
  `google-crc32c` package (`google_crc32c.value`, C with SSE4.2 / ARMv8 CRC instructions) it
  lost ~50x per record and 1.7x in the whole reader, so `record_crc` now calls the package (the
  A/B: this script at commit b9ce0ee, docs/benchmarks.md). The CRC's cost is still shown.
* Decoding: `example_decoding.decode_examples` (numpy varints over a window) against protobuf's
  own parser: `Example` classes made by protobuf from the `tf.train.Example` descriptor (built
  in code: tensorboard ships no `example_pb2`, and TensorFlow's is what the reader must not
  import), each record parsed with `FromString` and its three `int64_list.value`s copied out
  (`protobuf_decode`, with the same checks: missing feature, other type, other length).

Sections: `parts` (each candidate on one window of records, microseconds per record) and
`reader` (records/s of a whole `BatchReader`, training order, batch 128, no prefetch thread,
over 4 shards, with each decoder patched in). Every repetition runs all
candidates in turn, so load from other processes hits them alike; the table gives the best and
the median of the repetitions.

    python benchmarks/reader_parts.py                     # ~15 s on 2 cores
    python benchmarks/reader_parts.py --records 2000 --repeats 3

Records are synthetic ELECTRA examples of --max-seq-length tokens (ids Zipf-distributed over a
30,522-token vocab, as text is; ~560 bytes at 128), written without TensorFlow.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

import numpy as np  # noqa: E402

from benchmarks.cli_types import positive_int  # noqa: E402
from electra_tf.data.records import example_decoding, record_crc, record_reader  # noqa: E402
from electra_tf.data.records.tfrecord_io import FEATURE_NAMES, ExampleSerializer  # noqa: E402

VOCAB_SIZE = 30522
FIRST_WORD_ID = 999  # BERT's vocab: [unused*] and specials below


def make_records(n: int, max_seq_length: int, seed: int = 0):
    """n serialized examples: two segments of Zipf-distributed ids filling the length."""
    rng = np.random.default_rng(seed)
    serializer = ExampleSerializer(max_seq_length, 101, 102)
    examples = []
    for _ in range(n):
        total = int(rng.integers(max_seq_length // 2, max_seq_length - 2))
        first = int(rng.integers(1, total))
        ids = (FIRST_WORD_ID + (rng.zipf(1.3, total) - 1) % (VOCAB_SIZE - FIRST_WORD_ID)).tolist()
        examples.append((ids[:first], ids[first:total], False))
    return serializer.serialize(examples)


def _example_class():
    """`tf.train.Example` as a protobuf class, from its descriptor built in code."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    field = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(
        name="electra_tf_benchmark/example.proto", package="tensorflow", syntax="proto3")
    for name, kind in (("BytesList", field.TYPE_BYTES), ("FloatList", field.TYPE_FLOAT),
                       ("Int64List", field.TYPE_INT64)):
        proto.message_type.add(name=name).field.add(name="value", number=1, type=kind,
                                                    label=field.LABEL_REPEATED)
    feature = proto.message_type.add(name="Feature")
    feature.oneof_decl.add(name="kind")
    for number, name in enumerate(("bytes_list", "float_list", "int64_list"), 1):
        feature.field.add(name=name, number=number, type=field.TYPE_MESSAGE,
                          label=field.LABEL_OPTIONAL, oneof_index=0,
                          type_name=".tensorflow." + name.title().replace("_", ""))
    features = proto.message_type.add(name="Features")
    entry = features.nested_type.add(name="FeatureEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=field.TYPE_STRING, label=field.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=field.TYPE_MESSAGE, label=field.LABEL_OPTIONAL,
                    type_name=".tensorflow.Feature")
    features.field.add(name="feature", number=1, type=field.TYPE_MESSAGE,
                       label=field.LABEL_REPEATED, type_name=".tensorflow.Features.FeatureEntry")
    proto.message_type.add(name="Example").field.add(
        name="features", number=1, type=field.TYPE_MESSAGE, label=field.LABEL_OPTIONAL,
        type_name=".tensorflow.Features")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.Example"))


_EXAMPLE = _example_class()


def protobuf_decode(records, max_seq_length: int) -> example_decoding.Decoded:
    """`decode_examples` with protobuf's parser (same output and checks; the candidate)."""
    from google.protobuf.message import DecodeError

    n = len(records)
    values = np.zeros((n, len(FEATURE_NAMES), max_seq_length), np.int64)
    bad = np.zeros(n, bool)
    reasons = {}
    for i, record in enumerate(records):
        try:
            feature = _EXAMPLE.FromString(record).features.feature
        except DecodeError as e:
            bad[i], reasons[i] = True, f"bad protobuf bytes: {e}"
            continue
        for k, name in enumerate(FEATURE_NAMES):
            if name not in feature:
                bad[i], reasons[i] = True, f"no feature {name}"
                break
            kind = feature[name].WhichOneof("kind")
            if kind not in (None, "int64_list"):
                bad[i], reasons[i] = True, f"feature {name} is not int64"
                break
            value = feature[name].int64_list.value
            if len(value) != max_seq_length:
                bad[i], reasons[i] = True, (f"feature {name} has {len(value)} values, "
                                            f"not {max_seq_length}")
                break
            values[i, k] = value
    features = values.astype(np.int32)  # keeps the low 32 bits, as tf.cast
    features[bad] = 0
    return example_decoding.Decoded(features, bad, reasons)


def write_shards(directory: str, records, num_shards: int):
    """TFRecord files of the records, round-robin (the framing TensorFlow writes)."""
    import struct

    crcs = record_crc.masked_crc(record_crc.crc32c_batch(records))
    paths = [os.path.join(directory, f"data.tfrecord-{s}-of-{num_shards}")
             for s in range(num_shards)]
    files = [open(p, "wb") for p in paths]
    for i, record in enumerate(records):
        length = struct.pack("<Q", len(record))
        files[i % num_shards].write(
            length + struct.pack("<I", record_crc.masked_crc(record_crc.crc32c(length)))
            + record + struct.pack("<I", int(crcs[i])))
    for f in files:
        f.close()
    return os.path.join(directory, "data.tfrecord-*")


def _time(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def bench_parts(records, max_seq_length: int, repeats: int):
    reference = example_decoding.decode_examples(records, max_seq_length)
    candidate = protobuf_decode(records, max_seq_length)
    assert (reference.features == candidate.features).all() and not candidate.bad.any()
    arms = {"crc: google-crc32c (record_crc)": (record_crc.crc32c_batch, records),
            "decode: hand-written (example_decoding)": (
                example_decoding.decode_examples, records, max_seq_length),
            "decode: protobuf (upb)": (protobuf_decode, records, max_seq_length)}
    times = {name: [] for name in arms}
    for _ in range(repeats):
        for name, (fn, *args) in arms.items():
            times[name].append(_time(fn, *args) / len(records) * 1e6)
    print(f"\nparts: {len(records)} records of ~{np.mean([len(r) for r in records]):.0f} bytes, "
          f"us per record (best / median of {repeats})")
    for name, values in times.items():
        print(f"  {name:42s} {min(values):7.2f} / {statistics.median(values):7.2f}")
    return times


def bench_reader(pattern: str, num_records: int, max_seq_length: int, repeats: int):
    arms = {"hand decode (example_decoding)": example_decoding.decode_examples,
            "protobuf decode": protobuf_decode}
    batches = num_records // 128
    saved = record_reader.decode_examples
    rates = {name: [] for name in arms}
    try:
        for _ in range(repeats):
            for name, decode in arms.items():
                record_reader.decode_examples = decode
                reader = record_reader.BatchReader(
                    pattern, batch_size=128, max_seq_length=max_seq_length, is_training=True,
                    seed=0, repeat=False, prefetch=0)
                start = time.perf_counter()
                for _ in range(batches):
                    next(reader)
                rates[name].append(batches * 128 / (time.perf_counter() - start))
                reader.close()
    finally:
        record_reader.decode_examples = saved
    print(f"\nreader: BatchReader, training order, batch 128, {batches} batches, records/s "
          f"(best / median of {repeats})")
    for name, values in rates.items():
        print(f"  {name:42s} {max(values):9.0f} / {statistics.median(values):9.0f}")
    return rates


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=positive_int, default=8000,
                   help="records written (the reader reads them all; parts use 1,000)")
    p.add_argument("--max-seq-length", type=positive_int, default=128)
    p.add_argument("--repeats", type=positive_int, default=5)
    p.add_argument("--sections", default="parts,reader")
    args = p.parse_args(argv)
    from importlib.metadata import version

    import google_crc32c
    from google.protobuf.internal import api_implementation

    print(f"numpy {np.__version__}, protobuf {version('protobuf')} "
          f"({api_implementation.Type()}), google-crc32c {version('google-crc32c')} "
          f"({google_crc32c.implementation}), load {os.getloadavg()[0]:.2f}")
    records = make_records(args.records, args.max_seq_length)
    sections = args.sections.split(",")
    if "parts" in sections:
        bench_parts(records[:1000], args.max_seq_length, args.repeats)
    if "reader" in sections:
        with tempfile.TemporaryDirectory() as tmp:
            pattern = write_shards(tmp, records, 4)
            bench_reader(pattern, len(records), args.max_seq_length, args.repeats)
    print(f"load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
