"""Training batches mix like a uniform random draw, whatever the shard count (issue 12).

A corpus of five sources (files of very different sizes) whose every example names its document:
document d is made of the word `w{d}` only, and documents are numbered in corpus order, so an
example's first token gives its source and its corpus position. The corpus (~20k examples) is
much larger than the reader's shuffle buffer (1,000), so batches that follow the corpus order (as
before the builder's global shuffle) fail every check here. It is built into 1, 4 and 100 shards
and read by the training pipeline; two epochs of batches must match a random draw:

* source composition: the Pearson chi-square of each batch's source counts against the global
  source shares, summed over batches, is a chi-square with batches * (sources - 1) degrees of
  freedom for random draws (two-sided p-value above 0.001), and the mean total-variation
  distance of a batch from the global shares is within 12% of a simulated random draw's;
* corpus-position spread: the mean within-batch standard deviation of corpus positions is within
  10% of a random permutation's (batches that follow the corpus order have a small fraction).
(`electra_tf.data.records.mixing.mixing_statistics`; the last test shows the checks fail on batches in
corpus order, so they are not blind.)
With one shard the stored order alone (read without any shuffle) must pass too.
"""

import os

import numpy as np
import pytest
import tensorflow as tf

from electra_tf.data.records import mixing, pipeline
from electra_tf.data.build.build_config import BuildConfig
from electra_tf.data.build.builder import build_dataset

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
DOCS_PER_SOURCE = [4000, 2400, 1600, 1200, 800]  # unequal shares
NUM_DOCS = sum(DOCS_PER_SOURCE)
MAX_SEQ_LENGTH = 32
BATCH = 32
FIRST_WORD_ID = len(SPECIALS)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("mixing")
    (root / "vocab.txt").write_text("\n".join(SPECIALS + [f"w{i}" for i in range(NUM_DOCS)]) + "\n")
    corpus_dir = root / "corpus"
    corpus_dir.mkdir()
    rng = np.random.default_rng(0)
    doc = 0
    for source, num_docs in enumerate(DOCS_PER_SOURCE):
        docs = []
        for _ in range(num_docs):
            lines = [" ".join([f"w{doc}"] * int(rng.integers(8, 25)))
                     for _ in range(int(rng.integers(1, 4)))]
            docs.append("\n".join(lines))
            doc += 1
        (corpus_dir / f"source{source}.txt").write_text("\n\n".join(docs) + "\n")
    bounds = np.cumsum(DOCS_PER_SOURCE)
    return {"root": root, "corpus": str(corpus_dir), "vocab": str(root / "vocab.txt"),
            "source_of_doc": np.searchsorted(bounds, np.arange(NUM_DOCS), side="right")}


def _build(corpus, num_shards):
    out = str(corpus["root"] / f"out_{num_shards}")
    if not os.path.exists(out):
        build_dataset(BuildConfig(corpus_dir=corpus["corpus"], vocab_file=corpus["vocab"],
                                  output_dir=out, max_seq_length=MAX_SEQ_LENGTH, eval_fraction=0.0,
                                  num_out_files=num_shards, seed=1, progress_interval=1e9))
    return out


def _batches_of_docs(out, is_training, num_batches, input_context=None):
    """[num_batches, BATCH] document ids of the pipeline's batches."""
    dataset = pipeline.make_dataset(os.path.join(out, "pretrain_data.tfrecord*"),
                                    batch_size=BATCH, max_seq_length=MAX_SEQ_LENGTH,
                                    is_training=is_training, seed=5, repeat=True,
                                    input_context=input_context)
    docs = [batch["input_ids"][:, 1].numpy() - FIRST_WORD_ID
            for batch in dataset.take(num_batches)]
    return np.stack(docs)


def mixing_statistics(doc_batches, source_of_doc, rng):
    return mixing.mixing_statistics(source_of_doc[doc_batches], doc_batches, rng)


def _check(stats):
    assert stats["p_value"] > 1e-3, stats
    assert abs(stats["tv_ratio"] - 1) < 0.12, stats
    assert abs(stats["spread_ratio"] - 1) < 0.10, stats


@pytest.mark.parametrize("num_shards", [1, 4, 100])
def test_training_batches_mix_like_a_random_draw(corpus, num_shards):
    out = _build(corpus, num_shards)
    epoch = sum(1 for _ in tf.data.TFRecordDataset(
        tf.io.gfile.glob(os.path.join(out, "pretrain_data.tfrecord*")))) // BATCH
    assert epoch > 300  # ~12k examples: far more than the reader's shuffle buffer (1,000)
    batches = _batches_of_docs(out, is_training=True, num_batches=2 * epoch)
    _check(mixing_statistics(batches, corpus["source_of_doc"], np.random.default_rng(0)))


@pytest.mark.parametrize("num_shards", [1, 100], ids=["record_sharding", "file_sharding"])
def test_each_workers_batches_mix_like_a_random_draw(corpus, num_shards):
    # Two input pipelines (multi-worker): each reads its own files (or, with one file, every
    # other record) and its batches alone must still be random draws of the whole corpus.
    out = _build(corpus, num_shards)
    for pipeline_id in range(2):
        context = tf.distribute.InputContext(num_input_pipelines=2,
                                             input_pipeline_id=pipeline_id,
                                             num_replicas_in_sync=2)
        batches = _batches_of_docs(out, is_training=True, num_batches=180,
                                   input_context=context)
        _check(mixing_statistics(batches, corpus["source_of_doc"], np.random.default_rng(0)))


def test_the_stored_order_alone_mixes_with_one_shard(corpus):
    # No file or record shuffle (the eval path): the builder's order must already be random.
    out = _build(corpus, 1)
    batches = _batches_of_docs(out, is_training=False, num_batches=400)
    _check(mixing_statistics(batches, corpus["source_of_doc"], np.random.default_rng(0)))


def test_the_checks_fail_for_batches_in_corpus_order(corpus):
    # The same statistics on the corpus order read through a 1,000-example shuffle buffer (what
    # the pipeline did with unshuffled shards): every check must fail, or the test is blind.
    rng = np.random.default_rng(0)
    order = np.arange(NUM_DOCS).repeat(2)
    buffer, stream = list(order[:1000]), []
    for doc in order[1000:]:
        i = int(rng.integers(len(buffer)))
        stream.append(buffer[i])
        buffer[i] = doc
    batches = np.array(stream[:len(stream) // BATCH * BATCH]).reshape(-1, BATCH)
    stats = mixing_statistics(batches, corpus["source_of_doc"], rng)
    assert stats["p_value"] < 1e-6 and stats["tv_ratio"] > 1.5 and stats["spread_ratio"] < 0.3
