"""The pretraining input pipeline: manifest checks, per-pipeline sharding, deterministic order."""

import os

import numpy as np
import pytest
import tensorflow as tf

from electra_tf.errors import DataError
from electra_tf.data.records import integrity, pipeline, tfrecord_io
from electra_tf.vocab import load_vocab
from tests import pretraining_fixtures as fx

L = 8  # sequence length of the indexed records


def _indexed_example(index):
    # input_ids[0] carries the record's global index, so every record is identifiable.
    return {"input_ids": [index] + [0] * (L - 1), "input_mask": [1] * L, "segment_ids": [0] * L}


def _write_indexed(directory, num_files, per_file):
    os.makedirs(directory, exist_ok=True)
    for f in range(num_files):
        fx.write_records(os.path.join(directory, tfrecord_io.shard_name("pretrain_data.tfrecord", f, num_files)),
                         [_indexed_example(f * per_file + i) for i in range(per_file)])
    return os.path.join(directory, "pretrain_data.tfrecord*")


def _ids(dataset, limit=None):
    out = []
    for i, batch in enumerate(dataset):
        if limit is not None and i >= limit:
            break
        out.append(batch["input_ids"][:, 0].numpy())
    return np.concatenate(out).tolist()


def _context(pipeline_id, num=2):
    return tf.distribute.InputContext(num_input_pipelines=num, input_pipeline_id=pipeline_id,
                                      num_replicas_in_sync=num)


# ------------------------------------------------------------------------------------------------
# Manifest validation
# ------------------------------------------------------------------------------------------------
@pytest.fixture
def dataset_dir(tmp_path):
    data_dir = str(tmp_path / "data")
    out = fx.write_dataset(data_dir, examples_per_shard=10)
    return data_dir, out


def _validate(data_dir, out, split="train", **kwargs):
    vocab = load_vocab(os.path.join(data_dir, "vocab.txt"))
    args = {"max_seq_length": fx.MAX_SEQ_LENGTH, "vocab_sha256": vocab.sha256,
            "vocab_size": fx.VOCAB_SIZE}
    args.update(kwargs)
    prefix = "pretrain_data" if split == "train" else "eval_data"
    return integrity.validate_dataset(os.path.join(out, prefix + ".tfrecord*"), split=split, **args)


def test_validate_accepts_matching_dataset_and_counts_examples(dataset_dir):
    data_dir, out = dataset_dir
    summary = _validate(data_dir, out)
    assert summary["num_examples"] == 20
    assert summary["manifests"] == [os.path.join(out, "manifest.json")]
    assert _validate(data_dir, out, split="eval")["num_examples"] == 10


def test_validate_refuses_other_vocab_naming_the_manifest(dataset_dir, tmp_path):
    data_dir, out = dataset_dir
    # Same size, different tokens: only the checksum can tell.
    other = load_vocab(fx.write_vocab(str(tmp_path / "other_vocab.txt"), fx.vocab_tokens(prefix="x")))
    assert other.size == fx.VOCAB_SIZE
    with pytest.raises(DataError) as err:
        _validate(data_dir, out, vocab_sha256=other.sha256)
    message = str(err.value)
    assert os.path.join(out, "manifest.json") in message and "vocab" in message
    assert "\n" not in message


def test_validate_refuses_other_max_seq_length_naming_the_manifest(dataset_dir):
    data_dir, out = dataset_dir
    with pytest.raises(DataError) as err:
        _validate(data_dir, out, max_seq_length=64)
    message = str(err.value)
    assert os.path.join(out, "manifest.json") in message
    assert "max_seq_length" in message and "32" in message and "64" in message


def test_validate_refuses_stray_shard_not_in_manifest(dataset_dir):
    data_dir, out = dataset_dir
    stray = os.path.join(out, "pretrain_data.tfrecord-7-of-8")
    fx.write_records(stray, fx.random_examples(3, fx.MAX_SEQ_LENGTH, np.random.default_rng(1)))
    with pytest.raises(DataError) as err:
        _validate(data_dir, out)
    assert stray in str(err.value) and "manifest.json" in str(err.value)


def test_validate_refuses_truncated_shard(dataset_dir):
    data_dir, out = dataset_dir
    shard = os.path.join(out, "pretrain_data.tfrecord-0-of-2")
    with open(shard, "r+b") as f:
        f.truncate(os.path.getsize(shard) - 5)
    with pytest.raises(DataError) as err:
        _validate(data_dir, out)
    assert shard in str(err.value)


def test_validate_refuses_when_nothing_matches(tmp_path):
    with pytest.raises(DataError) as err:
        integrity.validate_dataset(str(tmp_path / "nothing*"), max_seq_length=32,
                                  vocab_sha256="0" * 64, vocab_size=100)
    assert "nothing*" in str(err.value)


def test_validate_without_manifest_is_allowed_with_unknown_count(tmp_path):
    pattern = _write_indexed(str(tmp_path), 2, 4)
    summary = integrity.validate_dataset(pattern, max_seq_length=L, vocab_sha256="0" * 64,
                                        vocab_size=100)
    assert summary == {"num_examples": None, "manifests": []}


# ------------------------------------------------------------------------------------------------
# Reading
# ------------------------------------------------------------------------------------------------
def test_batches_have_official_features_int32_and_fixed_shape(tmp_path):
    pattern = _write_indexed(str(tmp_path), 2, 10)
    batch = next(iter(pipeline.make_dataset(pattern, batch_size=4, max_seq_length=L,
                                            is_training=True, seed=0)))
    assert sorted(batch) == ["input_ids", "input_mask", "segment_ids"]
    for value in batch.values():
        assert value.dtype == tf.int32 and value.shape == (4, L)


def test_eval_order_is_file_order_and_remainder_dropped(tmp_path):
    pattern = _write_indexed(str(tmp_path), 1, 10)
    ids = _ids(pipeline.make_dataset(pattern, batch_size=4, max_seq_length=L, is_training=False,
                                     repeat=False))
    assert ids == list(range(8))


@pytest.mark.parametrize("num_files", [4, 1], ids=["file_sharding", "record_sharding"])
def test_pipelines_read_disjoint_data_covering_the_dataset(tmp_path, num_files):
    per_file = 24 // num_files
    pattern = _write_indexed(str(tmp_path), num_files, per_file)
    seen = []
    for pipeline_id in range(2):
        ds = pipeline.make_dataset(pattern, batch_size=2, max_seq_length=L, is_training=True,
                                   seed=3, input_context=_context(pipeline_id), repeat=False)
        seen.append(_ids(ds))
    assert set(seen[0]).isdisjoint(seen[1])
    assert sorted(seen[0] + seen[1]) == list(range(24))  # 12 per pipeline: no remainder
    assert len(seen[0]) == len(seen[1]) == 12


def test_training_order_is_deterministic_for_a_seed_and_shuffled(tmp_path):
    pattern = _write_indexed(str(tmp_path), 3, 20)

    def order(seed):
        return _ids(pipeline.make_dataset(pattern, batch_size=5, max_seq_length=L,
                                          is_training=True, seed=seed), limit=24)

    first = order(7)
    assert first == order(7)
    assert first != order(8)
    assert first[:60] != list(range(60))  # shuffled, not file order


def test_iterator_checkpoint_resumes_the_exact_order_across_epochs(tmp_path):
    # The trainer checkpoints the pipeline's iterator (file reshuffle, interleave and record
    # shuffle state included): restored mid-run, it continues with exactly the batches an
    # uninterrupted run reads, across epoch boundaries.
    pattern = _write_indexed(str(tmp_path), 5, 13)  # 65 records: ~16 batches of 4 per epoch

    def make():
        return iter(pipeline.make_dataset(pattern, batch_size=4, max_seq_length=L,
                                          is_training=True, seed=2))

    reference = [next(it)["input_ids"][:, 0].numpy().tolist() for it in [make()] for _ in range(60)]
    iterator = make()
    for _ in range(23):
        next(iterator)
    path = tf.train.Checkpoint(iterator=iterator).write(str(tmp_path / "ckpt" / "data"))
    restored = make()
    tf.train.Checkpoint(iterator=restored).read(path).assert_consumed()
    assert [next(restored)["input_ids"][:, 0].numpy().tolist() for _ in range(37)] == reference[23:]
    # Each epoch reads the files in another order: epochs are not copies of each other.
    flat = [i for batch in reference for i in batch]
    assert flat[:64] != flat[65:129]
