"""Fine-tuning heads and optimisation against numpy references (parity items SH-3, SH-4, SH-7..10,
REG-5, REG-6, QA-16..20, QA-32, TAG-10, TAG-11; docs/parity.md)."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from electra_tf.finetuning.model import ClassificationHead, FinetuningModel, summed_loss
from electra_tf.finetuning.qa.head import QAHead
from electra_tf.finetuning.regression.head import RegressionHead
from electra_tf.finetuning.runner import make_optimizer
from electra_tf.finetuning.tagging.head import TaggingHead
from electra_tf.training.optimization import apply_gradients

H, L, BEAM = 8, 10, 4
TINY_ENCODER = dict(vocab_size=30, hidden_size=H, num_hidden_layers=3, num_attention_heads=2,
                    intermediate_size=16, embedding_size=4)


def _np(x):
    return np.asarray(x, np.float64)


def _gelu(x):
    return x * 0.5 * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def _log_softmax(x):
    x = _np(x)
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def _dense(layer, x):
    return _np(x) @ _np(layer.kernel) + _np(layer.bias)


@pytest.fixture
def qa_batch():
    rng = np.random.default_rng(0)
    h = rng.normal(size=(2, L, H)).astype(np.float32)
    # Record 0: [CLS] q q [SEP] c c c c [SEP] pad; record 1: [CLS] q [SEP] c c c c c c [SEP].
    input_mask = np.array([[1] * 9 + [0], [1] * 10], np.int32)
    segment_ids = np.array([[0, 0, 0, 0, 1, 1, 1, 1, 1, 0], [0, 0, 0, 1, 1, 1, 1, 1, 1, 1]], np.int32)
    features = {"input_mask": input_mask, "segment_ids": segment_ids,
                "squad_start_positions": np.array([5, 0], np.int32),
                "squad_end_positions": np.array([6, 0], np.int32),
                "squad_is_impossible": np.array([0, 1], np.int32)}
    return h, features


def _qa_head(**kwargs):
    keras.utils.set_random_seed(3)
    head = QAHead(beam_size=BEAM, name="squad", **kwargs)
    head.build((None, None, H))
    return head


# ------------------------------------------------------------------------------------------------
# QA
# ------------------------------------------------------------------------------------------------
def test_qa32_head_variables_have_the_official_names_and_shapes():
    model = FinetuningModel(TINY_ENCODER, [{"name": "squad", "family": "qa", "beam_size": 4}])
    shapes = {v.path: tuple(v.shape) for v in model.trainable_variables
              if v.path.startswith("task_specific/")}
    assert shapes == {
        "task_specific/squad/dense/kernel": (H, 1), "task_specific/squad/dense/bias": (1,),
        "task_specific/squad/qa_hidden/kernel": (2 * H, 512), "task_specific/squad/qa_hidden/bias": (512,),
        "task_specific/squad/dense_1/kernel": (512, 1), "task_specific/squad/dense_1/bias": (1,),
        "task_specific/squad/dense_2/kernel": (2 * H, 512), "task_specific/squad/dense_2/bias": (512,),
        "task_specific/squad/dense_3/kernel": (512, 1), "task_specific/squad/dense_3/bias": (1,)}


def test_qa16_answer_mask_and_additive_minus_1000(qa_batch):
    h, features = qa_batch
    head = _qa_head()
    out = head(tf.constant(h), features, training=False)
    raw = _dense(head.start_dense, h)[..., 0]
    mask = _np(features["input_mask"]) * _np(features["segment_ids"])
    mask[:, 0] += 1
    # 1 exactly at [CLS], the window tokens and the final [SEP].
    np.testing.assert_array_equal(mask[0], [1, 0, 0, 0, 1, 1, 1, 1, 1, 0])
    np.testing.assert_allclose(out["start_logits"], raw + 1000.0 * (mask - 1), rtol=1e-5, atol=1e-3)


def test_qa17_qa19_qa20_joint_training_end_logits_answerable_logit_and_loss(qa_batch):
    h, features = qa_batch
    head = _qa_head()
    out = head(tf.constant(h), features, training=True)
    mask = _np(features["input_mask"]) * _np(features["segment_ids"])
    mask[:, 0] += 1
    penalty = 1000.0 * (mask - 1)
    start_logits = _dense(head.start_dense, h)[..., 0] + penalty
    gold = features["squad_start_positions"]
    concat = np.concatenate([np.repeat(h[np.arange(2), gold][:, None], L, 1), h], -1)
    end_logits = _dense(head.end_dense, _gelu(_dense(head.qa_hidden, concat)))[..., 0] + penalty
    np.testing.assert_allclose(out["end_logits"], end_logits, rtol=1e-4, atol=1e-3)
    p = np.exp(_log_softmax(start_logits))
    context = (p[:, :, None] * h).sum(1)
    hidden = _gelu(_dense(head.answerable_hidden, np.concatenate([h[:, 0], context], -1)))
    answerable = _dense(head.answerable_dense, hidden)[:, 0]
    np.testing.assert_allclose(out["answerable_logit"], answerable, rtol=1e-4, atol=1e-5)
    ce_start = -_log_softmax(start_logits)[np.arange(2), gold]
    ce_end = -_log_softmax(end_logits)[np.arange(2), features["squad_end_positions"]]
    y = _np(features["squad_is_impossible"])
    sigmoid_ce = np.maximum(answerable, 0) - answerable * y + np.log1p(np.exp(-np.abs(answerable)))
    np.testing.assert_allclose(out["loss"], (ce_start + ce_end) / 2 + 0.5 * sigmoid_ce, rtol=1e-4)


def test_qa18_joint_inference_beam_and_zero_end_logits(qa_batch):
    h, features = qa_batch
    head = _qa_head()
    out = head(tf.constant(h), features, training=False)
    mask = _np(features["input_mask"]) * _np(features["segment_ids"])
    mask[:, 0] += 1
    penalty = 1000.0 * (mask - 1)
    start_log_probs = _log_softmax(_dense(head.start_dense, h)[..., 0] + penalty)
    top = np.argsort(-start_log_probs, axis=-1, kind="stable")[:, :BEAM]
    np.testing.assert_array_equal(out["start_top_index"], top)
    np.testing.assert_allclose(out["start_top_log_probs"],
                               np.take_along_axis(start_log_probs, top, -1), rtol=1e-4, atol=1e-4)
    assert out["end_top_index"].shape == (2, BEAM, BEAM)
    for b in range(2):
        for k in range(BEAM):
            concat = np.concatenate([np.repeat(h[b, top[b, k]][None], L, 0), h[b]], -1)
            logits = _dense(head.end_dense, _gelu(_dense(head.qa_hidden, concat)))[:, 0] + penalty[b]
            log_probs = _log_softmax(logits)
            best = np.argsort(-log_probs, kind="stable")[:BEAM]
            np.testing.assert_array_equal(out["end_top_index"][b, k], best)
            np.testing.assert_allclose(out["end_top_log_probs"][b, k], log_probs[best],
                                       rtol=1e-4, atol=1e-3)
    assert not np.any(out["end_logits"])


def test_qa_non_joint_and_no_start_logits_variants(qa_batch):
    h, features = qa_batch
    head = _qa_head(joint_prediction=False, answerable_uses_start_logits=False)
    assert [l.name for l in (head.start_dense, head.end_dense, head.answerable_dense)] == [
        "dense", "dense_1", "dense_2"]
    out = head(tf.constant(h), features, training=False)
    mask = _np(features["input_mask"]) * _np(features["segment_ids"])
    mask[:, 0] += 1
    np.testing.assert_allclose(out["end_logits"],
                               _dense(head.end_dense, h)[..., 0] + 1000 * (mask - 1), rtol=1e-5,
                               atol=1e-3)
    np.testing.assert_allclose(out["answerable_logit"], _dense(head.answerable_dense, h[:, 0])[:, 0],
                               rtol=1e-5)
    assert not np.any(out["start_top_index"]) and not np.any(out["end_top_log_probs"])


# ------------------------------------------------------------------------------------------------
# Regression, tagging, classification
# ------------------------------------------------------------------------------------------------
def test_reg5_reg6_regression_head_is_dense_on_cls_with_squared_error():
    rng = np.random.default_rng(1)
    h = rng.normal(size=(3, 5, H)).astype(np.float32)
    head = RegressionHead(name="sts")
    head.build((None, None, H))
    targets = np.array([0.76, 0.0, 1.0], np.float32)
    out = head(tf.constant(h), {"sts_targets": targets}, training=False)
    predictions = _dense(head.dense, h[:, 0])[:, 0]  # no output activation
    np.testing.assert_allclose(out["predictions"], predictions, rtol=1e-5)
    np.testing.assert_allclose(out["loss"], (predictions - targets) ** 2, rtol=1e-4)


def test_tag10_tag11_tagging_loss_sums_masked_first_subtoken_cross_entropy():
    rng = np.random.default_rng(2)
    h = rng.normal(size=(2, 7, H)).astype(np.float32)
    head = TaggingHead(3, name="chunk")
    head.build((None, None, H))
    features = {"chunk_labeled_positions": np.array([[1, 2, 4, 0], [1, 0, 0, 0]], np.int32),
                "chunk_labels": np.array([[2, 0, 1, 0], [1, 0, 0, 0]], np.int32),
                "chunk_labels_mask": np.array([[1, 1, 1, 0], [1, 0, 0, 0]], np.float32)}
    out = head(tf.constant(h), features)
    expected = []
    for b in range(2):
        total = 0.0
        for slot in range(4):
            if features["chunk_labels_mask"][b, slot]:
                logits = _dense(head.dense, h[b, features["chunk_labeled_positions"][b, slot]])
                total -= _log_softmax(logits)[features["chunk_labels"][b, slot]]
        expected.append(total)
    np.testing.assert_allclose(out["loss"], expected, rtol=1e-5)
    # Position 3 (a second sub-token) and 5, 6 are never gathered: changing them changes nothing;
    # padding slots gather position 0 and are masked.
    h2 = h.copy()
    h2[:, 3] += 5.0
    h2[:, 5:] -= 3.0
    np.testing.assert_allclose(head(tf.constant(h2), features)["loss"], out["loss"], rtol=1e-6)
    np.testing.assert_allclose(out["logits"][0, 3], _dense(head.dense, h[0, 0]), rtol=1e-5)


def test_sh3_summed_loss_over_real_heads_ignores_padding_records():
    model = FinetuningModel(TINY_ENCODER, [{"name": "a", "num_labels": 2},
                                           {"name": "sts", "family": "regression"}])
    batch = {"input_ids": tf.constant([[2, 5, 3], [2, 6, 3], [2, 7, 3]]),
             "input_mask": tf.ones([3, 3], tf.int32), "segment_ids": tf.zeros([3, 3], tf.int32),
             "a_label_ids": tf.constant([1, 0, 0]), "sts_targets": tf.constant([0.0, 0.4, 0.0]),
             "task_id": tf.constant([0, 1, 2])}
    outputs = model(batch, training=False)
    loss = float(summed_loss(outputs, batch["task_id"], ["a", "sts"]))
    assert loss == pytest.approx(float(outputs["a"]["loss"][0]) + float(outputs["sts"]["loss"][1]),
                                 rel=1e-6)


def test_sh9_every_head_dense_is_glorot_uniform_with_zero_bias():
    model = FinetuningModel(TINY_ENCODER, [
        {"name": "cola", "num_labels": 2}, {"name": "sts", "family": "regression"},
        {"name": "squad", "family": "qa", "beam_size": 4}, {"name": "chunk", "family": "tagging",
                                                            "num_labels": 5}])
    denses = [layer for layer in model.task_heads._flatten_layers()
              if isinstance(layer, keras.layers.Dense)]
    assert len(denses) == 1 + 1 + 5 + 1
    for layer in denses:
        assert isinstance(layer.kernel_initializer, keras.initializers.GlorotUniform), layer.path
        assert isinstance(layer.bias_initializer, keras.initializers.Zeros), layer.path
        assert not np.any(layer.bias.numpy())


def test_sh10_dropout_only_on_the_cls_vector_of_classification_and_regression(qa_batch):
    h, features = qa_batch
    keras.utils.set_random_seed(0)
    heads = {"classification": ClassificationHead(3, name="c"), "regression": RegressionHead(name="r"),
             "qa": _qa_head(), "tagging": TaggingHead(3, name="t")}
    features = dict(features, t_labeled_positions=np.array([[1, 2], [3, 4]], np.int32))
    key = {"classification": "logits", "regression": "predictions", "qa": "start_logits",
           "tagging": "logits"}
    for family, head in heads.items():
        if not head.built:
            head.build((None, None, H))
        train = [head(tf.constant(h), features, training=True)[key[family]].numpy() for _ in range(2)]
        evals = [head(tf.constant(h), features, training=False)[key[family]].numpy() for _ in range(2)]
        np.testing.assert_array_equal(evals[0], evals[1])
        if family in ("classification", "regression"):
            assert not np.allclose(train[0], train[1]), family
        else:
            np.testing.assert_array_equal(train[0], train[1])


# ------------------------------------------------------------------------------------------------
# SH-4, SH-7, SH-8: the fine-tuning optimizer, two steps against numpy
# ------------------------------------------------------------------------------------------------
def test_sh4_sh7_sh8_two_optimizer_steps_match_numpy(tmp_path):
    from electra_tf.finetuning.config import FinetuningConfig

    config = FinetuningConfig.create("m", str(tmp_path), {"learning_rate": 0.1,
                                                          "warmup_proportion": 0.5})
    model = FinetuningModel(TINY_ENCODER, [{"name": "cola", "num_labels": 2}])
    steps = 4
    optimizer = make_optimizer(model, config, steps)
    schedule = optimizer._learning_rate
    variables = model.trainable_variables
    rng = np.random.default_rng(0)
    weights = [v.numpy().astype(np.float64) for v in variables]
    m = [np.zeros_like(w) for w in weights]
    v = [np.zeros_like(w) for w in weights]
    # lr(t) = 0.1 (1 - t/4) min(1, t / 2): lr(0) = 0, lr(1) = 0.0375 (SH-4).
    lrs = [0.1 * (1 - t / steps) * min(1.0, t / (0.5 * steps)) for t in range(2)]
    assert lrs == pytest.approx([0.0, 0.0375])
    for t in range(2):
        grads = [rng.normal(size=w.shape) * 3 for w in weights]  # global norm far above 1
        apply_gradients(optimizer, [tf.constant(g, tf.float32) for g in grads], variables)
        norm = math.sqrt(sum(float(np.sum(g * g)) for g in grads))
        clipped = [g * min(1.0, 1.0 / norm) for g in grads]  # one clip over all (SH-7)
        for i, var in enumerate(variables):
            m[i] = 0.9 * m[i] + 0.1 * clipped[i]
            v[i] = 0.999 * v[i] + 0.001 * clipped[i] ** 2
            update = m[i] / (np.sqrt(v[i]) + 1e-6)  # no bias correction (SH-8)
            if not any(k in var.path for k in ("LayerNorm", "layer_norm", "bias")):
                update = update + 0.01 * weights[i]
            weights[i] = weights[i] - lrs[t] * optimizer.lr_multiplier(var) * update
    assert float(schedule(0)) == 0.0 and float(schedule(1)) == pytest.approx(0.0375)
    for w, var in zip(weights, variables):
        np.testing.assert_allclose(var.numpy(), w, rtol=1e-4, atol=1e-6, err_msg=var.path)
    # The multipliers are the official ones (SH-5; 3 layers): embeddings 0.8^5, layer i
    # 0.8^(4 - i), heads 1.
    expected = {"/embeddings": 0.8 ** 5, "layer_0/": 0.8 ** 4, "layer_2/": 0.8 ** 2,
                "task_specific/": 1.0}
    for var in variables:
        for key, value in expected.items():
            if key in var.path:
                assert optimizer.lr_multiplier(var) == pytest.approx(value), var.path


# The config round trips of every head, `TaskHeads` and `FinetuningModel` are declared in
# tests/finetuning/test_finetuning_layers.py.
def test_unknown_head_family_is_refused():
    with pytest.raises(ValueError, match="unknown head family 'nope'"):
        FinetuningModel(TINY_ENCODER, [{"name": "x", "family": "nope"}])


def test_clip_norm_is_the_official_tpu_paths_unless_official_gpu_clip_norm():
    """The word-embedding gradient arrives as one row per token occurrence. The clip's norm sums
    the rows of repeated ids first: the true gradient norm, which the official code computes
    on TPU (one-hot lookups, a dense gradient). `official_gpu_clip_norm` uses the rows as they
    are, as the official code on CPU/GPU (use_tpu=False) does."""
    model = FinetuningModel(TINY_ENCODER, [{"name": "a", "num_labels": 2},
                                           {"name": "sts", "family": "regression"}])
    ids = [[2, 5, 5, 5, 7, 3], [2, 7, 7, 9, 3, 0], [2, 5, 9, 9, 9, 3]]  # repeated ids
    batch = {"input_ids": tf.constant(ids), "input_mask": tf.constant(
        [[1] * 6, [1] * 5 + [0], [1] * 6]), "segment_ids": tf.zeros([3, 6], tf.int32),
        "a_label_ids": tf.constant([1, 0, 0]), "sts_targets": tf.constant([0.0, 3.0, 0.0]),
        "task_id": tf.constant([0, 1, 0])}
    variables = model.trainable_variables
    with tf.GradientTape() as tape:
        loss = summed_loss(model(batch, training=False), batch["task_id"], ["a", "sts"]) * 1e3
    grads = tape.gradient(loss, variables)
    rows = [g for g in grads if isinstance(g, tf.IndexedSlices)]
    assert rows, "no embedding gradient as rows"

    def norm(gradients):
        return math.sqrt(sum(float(tf.reduce_sum(tf.square(g))) for g in gradients))

    dense = norm([tf.convert_to_tensor(g) for g in grads if g is not None])  # summed per id
    per_row = norm([g.values if isinstance(g, tf.IndexedSlices) else g
                    for g in grads if g is not None])
    assert dense > 1.0 and abs(dense - per_row) > 1e-4 * dense  # the two paths differ here
    for sum_rows, expected in ((True, dense), (False, per_row)):
        optimizer = keras.optimizers.SGD(0.0)
        got = apply_gradients(optimizer, grads, variables, sum_repeated_rows=sum_rows)
        assert float(got) == pytest.approx(expected, rel=1e-5), sum_rows


def test_official_gpu_clip_norm_reaches_the_training_step(tmp_path, monkeypatch):
    from electra_tf.finetuning import runner
    from electra_tf.finetuning.config import FinetuningConfig

    assert FinetuningConfig.create("m", str(tmp_path)).official_gpu_clip_norm is False
    seen = []

    def recording(*args, **kwargs):
        seen.append(kwargs.get("sum_repeated_rows", True))
        return apply_gradients(*args, **kwargs)

    monkeypatch.setattr(runner, "apply_gradients", recording)
    model = FinetuningModel(TINY_ENCODER, [{"name": "a", "num_labels": 2}])
    table = {"input_ids": np.tile([[2, 5, 5, 3]], (4, 1)), "input_mask": np.ones((4, 4), np.int32),
             "segment_ids": np.zeros((4, 4), np.int32), "a_label_ids": np.array([0, 1, 0, 1]),
             "task_id": np.zeros(4, np.int32)}
    for flag in (False, True):
        config = FinetuningConfig.create("m", str(tmp_path), {
            "official_gpu_clip_norm": flag, "train_batch_size": 4, "num_train_epochs": 1,
            "task_names": ["a"]})
        runner.train(model, table, config, seed=0, task_names=["a"])
    assert seen == [True, False]  # traced once per run: the rows summed, then as they are
