"""`official_gpu_clip_norm` in pretraining: the clip's norm as the official code computes it on
CPU/GPU (an embedding gradient's rows of a repeated id counted apart), TensorFlow only."""

import numpy as np
import pytest

from electra_tf.config import PretrainingConfig
from electra_tf.config.hparams import ConfigError
from electra_tf.training import optimization
from electra_tf.training.tf.trainer import Trainer
from tests.pretraining_fixtures import read_scalars, tiny_config, write_dataset


def test_the_norm_of_unsummed_rows_is_the_official_cpu_gpu_one():
    import tensorflow as tf

    # Two lookups of row 1 with gradients [3, 0] and [4, 0]: the true (TPU) norm sums them
    # first, |[7, 0]| = 7; the official CPU/GPU norm counts them apart, sqrt(9 + 16) = 5.
    grad = tf.IndexedSlices(tf.constant([[3.0, 0.0], [4.0, 0.0]]), tf.constant([1, 1]),
                            tf.constant([3, 2]))
    assert float(optimization.clip_by_global_norm([grad], 1.0).global_norm) == pytest.approx(7.0)
    assert float(optimization.clip_by_global_norm([grad], 1.0, sum_repeated_rows=False).global_norm) \
        == pytest.approx(5.0)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    data_dir = str(tmp_path_factory.mktemp("clip"))
    write_dataset(data_dir)
    out = {}
    for flag in (False, True):
        config = tiny_config(data_dir, f"clip_{flag}", num_train_steps=3, iterations_per_loop=1,
                             save_checkpoints_steps=3, official_gpu_clip_norm=flag)
        with Trainer(config) as trainer:
            trainer.train()
        out[flag] = read_scalars(config.model_dir, ("grad_norm", "total_loss"))
    return out


def test_pretraining_clips_by_the_norm_it_is_told(runs):
    default, official_gpu = runs[False], runs[True]
    # Step 1: the same weights, batch and draws, so the same loss; only the norm differs, the
    # rows of ids repeated in the batch (every fixture batch repeats some) counted apart.
    assert default["total_loss"][1] == pytest.approx(official_gpu["total_loss"][1], rel=1e-6)
    assert default["grad_norm"][1] != pytest.approx(official_gpu["grad_norm"][1], rel=1e-4)
    assert np.isfinite(official_gpu["grad_norm"][3])


@pytest.mark.parametrize("hparams, message", [
    ({"backend": "jax"}, "official_gpu_clip_norm needs backend tensorflow"),
    ({"gradient_accumulation_steps": 2, "train_batch_size": 8},
     "official_gpu_clip_norm with gradient_accumulation_steps > 1"),
])
def test_where_the_rows_are_already_summed_the_flag_is_refused(hparams, message):
    with pytest.raises(ConfigError, match=message):
        PretrainingConfig.create("unit", "/nonexistent-data-dir",
                                 dict(hparams, official_gpu_clip_norm=True))
