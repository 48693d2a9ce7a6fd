"""The PyTorch peer of the benchmark and of the RTD cross-check (benchmarks/torch_electra.py,
experiments/rtd_crosscheck.py): the objective wired as documented, and the cross-check's AUC."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from benchmarks.torch_electra import TorchElectra  # noqa: E402
from experiments.rtd_crosscheck import auc  # noqa: E402

SPECIAL = {"pad_id": 0, "unk_id": 1, "cls_id": 2, "sep_id": 3, "mask_id": 4}
SIZES = {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 1,
         "intermediate_size": 32}


def _peer(**kwargs):
    return TorchElectra(SIZES, dict(SIZES, hidden_size=8, intermediate_size=16), vocab_size=50,
                        embedding_size=8, special=SPECIAL, max_predictions=5, learning_rate=1e-3,
                        num_warmup_steps=4, **kwargs)


def _batch(rng, lengths, seq=24):
    ids = np.zeros((len(lengths), seq), np.int64)
    mask = np.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, :n] = rng.integers(5, 50, n)
        ids[row, 0], ids[row, n - 1] = SPECIAL["cls_id"], SPECIAL["sep_id"]
        mask[row, :n] = 1
    return {"input_ids": torch.from_numpy(ids), "input_mask": torch.from_numpy(mask),
            "segment_ids": torch.zeros_like(torch.from_numpy(ids))}


def test_masking_counts_positions_and_mask_share():
    peer = _peer()
    batch = _batch(np.random.default_rng(0), [24, 10, 4] * 200)
    masked, positions, labels, weights = peer._mask(batch["input_ids"], batch["input_mask"])
    counts = weights.sum(-1).numpy()
    # k = max(1, min(N, round(n * 0.15))) of the n real tokens: 24 -> 4, 10 -> 2, 4 -> 1.
    np.testing.assert_array_equal(counts, [4, 2, 1] * 200)
    ids = batch["input_ids"]
    chosen = torch.gather(ids, 1, positions)[weights.bool()]
    assert not torch.isin(chosen, torch.tensor([0, 2, 3, 4])).any()  # real, non-special tokens
    np.testing.assert_array_equal(labels[weights.bool()], chosen)
    share = (torch.gather(masked, 1, positions)[weights.bool()] == SPECIAL["mask_id"]).float().mean()
    assert 0.80 < float(share) < 0.90  # 85% [MASK] (duplicate draws of a position count once)


def test_step_shares_embeddings_and_labels_samples_equal_to_the_original_as_original():
    peer = _peer(num_train_steps=10)
    assert peer.generator.electra.embeddings is peer.discriminator.electra.embeddings
    assert peer.generator.generator_lm_head.weight is \
        peer.discriminator.electra.embeddings.word_embeddings.weight
    batch = _batch(np.random.default_rng(1), [24, 20, 16, 12])
    before = peer.discriminator.electra.embeddings.word_embeddings.weight.detach().clone()
    out = peer.step(batch)
    assert np.isfinite(float(out["loss"]))
    assert out["disc_labels"].numel() == int(batch["input_mask"].sum())
    # At most the masked slots can be replaced (4 + 3 + 2 + 2 = 11).
    assert float(out["disc_labels"].sum()) <= 11
    # Step 0 runs at learning rate 0 (official warmup); step 1 updates the shared table.
    assert torch.equal(before, peer.discriminator.electra.embeddings.word_embeddings.weight.detach())
    peer.step(batch)
    after = peer.discriminator.electra.embeddings.word_embeddings.weight.detach()
    assert not torch.equal(before, after)
    # Official: warmup step / 4 while step < 4, then 1 - step / 10 (decay counted from step 0).
    rates = [peer.schedule.lr_lambdas[0](s) for s in (0, 2, 3, 4, 5, 10)]
    np.testing.assert_allclose(rates, [0.0, 0.5, 0.75, 0.6, 0.5, 0.0])


def test_auc_matches_the_pairwise_definition_with_ties():
    rng = np.random.default_rng(2)
    labels = (rng.random(500) < 0.3).astype(float)
    probs = np.round(rng.random(500) * 0.6 + 0.3 * labels, 1)  # many ties
    pos, neg = probs[labels > 0.5], probs[labels < 0.5]
    pairwise = ((pos[:, None] > neg).sum() + 0.5 * (pos[:, None] == neg).sum()) / (len(pos) * len(neg))
    assert auc(probs, labels) == pytest.approx(pairwise, abs=1e-12)
    assert np.isnan(auc(probs, np.zeros(500)))
