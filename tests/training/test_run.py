"""`run.PretrainingRun` over a fake backend: the loop's chunks, saves, stops, scalars, observer and
phases, without a model; and the pieces both backends share (`run_base`, `summaries`)."""

import dataclasses
import hashlib
import json

import numpy as np
import pytest

from electra_tf.errors import Preempted
from electra_tf.training import run_base, summaries
from electra_tf.training.run import PretrainingRun
from tests import pretraining_fixtures as fx


class _Stop:
    requested = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


class _Writer:
    def __init__(self, log):
        self.log = log

    def scalars(self, step, values):
        self.log.append(("scalars", step, dict(values)))

    def flush(self):
        pass

    def close(self):
        self.log.append(("close",))


class _Guard:
    def observe(self, step, scalars):
        pass

    def judge_eval(self, step, results):
        results["disc_collapsed"] = 0.0
        return None


class _Observer:
    def __init__(self):
        self.seen = []

    def observe(self, previous_step, step, end_step, encoder):
        assert encoder == "encoder"
        self.seen.append((previous_step, step))
        return {"probe/x": float(step)}

    def results(self):
        return [{"step": s} for _, s in self.seen]


class _FakeRun(PretrainingRun):
    """The backend interface with an in-memory step: each chunk 'trains' its steps; SIGTERM
    arrives after `stop_after` steps."""

    def __init__(self, config, stop_after=None):
        self.config = config
        self.chief = True
        self.log = []
        self.stop = _Stop()
        self.observer = _Observer()
        self.collapse_guard = _Guard()
        self.model = type("Model", (), {"discriminator": "encoder"})()
        self.latest = None
        self._step = 0
        self.stop_after = stop_after

    @property
    def step(self):
        return self._step

    def _open_writer(self):
        return _Writer(self.log)

    def _write_run_info(self, writer, start_step):
        self.log.append(("run_info", start_step))

    def _describe(self):
        return "fake"

    def _train_chunk(self, num_steps):
        self.log.append(("chunk", self.step, num_steps))
        self._step += num_steps
        if self.stop_after is not None and self.step >= self.stop_after:
            self.stop.requested = True
        return {"total_loss": 1.0, "masked_lm_loss": 2.0, "disc_loss": 3.0,
                "learning_rate": 0.1, "examples_per_second": 1.0, "tokens_per_second": 1.0}

    def _saved_at_step(self):
        return self.latest == f"ckpt-{self.step}"

    def _save(self):
        self.latest = f"ckpt-{self.step}"
        self.log.append(("save", self.step))

    def _evaluate_batches(self):
        return {"loss": 0.5}

    def _write_eval_results(self, results, note):
        self.log.append(("eval", self.step, dict(results)))

    def _export(self):
        return {"exported": self.step}

    def model_variables(self):
        return []


def test_each_backend_defines_the_whole_backend_interface():
    """The interface's methods are abstract in `PretrainingRun`: a backend lacking one cannot be
    built. Both backends (in their folders) define all of them; a run missing one is refused."""
    from electra_tf.training.portable.trainer import PortableTrainer
    from electra_tf.training.tf.trainer import Trainer

    assert PretrainingRun.__abstractmethods__ >= {"step", "_train_chunk", "_save",
                                                  "_evaluate_batches", "_export"}
    for backend in (Trainer, PortableTrainer, _FakeRun):
        assert not backend.__abstractmethods__, (backend, backend.__abstractmethods__)

    class _NoSave(_FakeRun):
        _save = PretrainingRun._save

    with pytest.raises(TypeError, match="_save"):
        _NoSave(_config())


def _config(**hparams):
    return fx.tiny_config("/nonexistent", **dict(dict(
        num_train_steps=7, iterations_per_loop=2, save_checkpoints_steps=3, do_train=True,
        do_eval=True, do_export=True), **hparams))


def test_chunks_end_at_every_checkpoint_and_the_end_and_each_is_followed_by_its_scalars():
    run = _FakeRun(_config())
    results = run.run_phases()
    chunks = [(start, n) for kind, *rest in run.log if kind == "chunk" for start, n in [rest]]
    assert chunks == [(0, 2), (2, 1), (3, 2), (5, 1), (6, 1)]
    saves = [entry[1] for entry in run.log if entry[0] == "save"]
    assert saves == [0, 3, 6, 7]  # step 0, every 3 steps, the end
    written = [entry[1] for entry in run.log if entry[0] == "scalars" and "total_loss" in entry[2]]
    assert written == [2, 3, 5, 6, 7]
    assert run.observer.seen[0] == (0, 0) and run.observer.seen[-1] == (6, 7)
    assert results["probe"][-1] == {"step": 7}
    assert results["eval"] == {"loss": 0.5, "global_step": 7, "disc_collapsed": 0.0}
    assert results["export"] == {"exported": 7}
    assert results["final"]["global_step"] == 7 and results["final"]["checkpoint"] == "ckpt-7"
    assert run.log[-1][0] == "eval" and ("close",) in run.log


def test_a_stop_saves_the_step_reached_and_raises_preempted():
    run = _FakeRun(_config(), stop_after=4)
    with pytest.raises(Preempted, match="stopped by SIGTERM at step 5 of 7; saved ckpt-5"):
        run.train()
    assert [e[1] for e in run.log if e[0] == "save"] == [0, 3, 5]
    assert run.observer.seen[-1] == (2, 3)  # not while a stop is under way


def test_a_run_at_its_end_trains_nothing():
    run = _FakeRun(_config())
    run._step = 7
    assert run.train() == {} and run.log == []


# --- What both backends share ---------------------------------------------------------------
def test_the_data_position_key_is_the_one_earlier_runs_saved(tmp_path):
    """The keys are part of existing checkpoints: a changed key would restart their data."""
    shard = tmp_path / "pretrain_data.tfrecord-00000-of-00001"
    shard.write_bytes(b"x" * 10)
    config = dataclasses.replace(_config(), pretrain_tfrecords=str(tmp_path / "pretrain_data*"))
    plan = {str(shard): [0, 3]}
    old = {"files": [(shard.name, 10)], "global_batch": config.train_batch_size,
           "seed": config.seed, "max_seq_length": config.max_seq_length, "backend": "jax",
           "record_plan": {shard.name: [0, 3]}}
    want = hashlib.sha256(json.dumps(old, sort_keys=True).encode("utf-8")).hexdigest()
    assert run_base.data_position_key(config, plan, {"backend": "jax"}) == want
    no_train = dataclasses.replace(config, do_train=False)
    assert run_base.data_position_key(no_train, plan, {"backend": "jax"}) != want


def test_the_weights_fingerprint_covers_dtype_shape_and_bytes():
    class _Var:
        def __init__(self, value):
            self.value = value

        def numpy(self):
            return self.value

    a = [_Var(np.zeros((2, 3), np.float32)), _Var(np.ones(4, np.int32))]
    digest = hashlib.sha256()
    for v in a:
        digest.update(f"{v.value.dtype.str}|{v.value.shape}|".encode("utf-8"))
        digest.update(v.value.tobytes())
    assert run_base.weights_fingerprint(a) == digest.hexdigest()
    assert run_base.weights_fingerprint([_Var(np.zeros((3, 2), np.float32))]) != \
        run_base.weights_fingerprint([_Var(np.zeros((2, 3), np.float32))])


def test_chunk_scalars_are_the_loop_scalars_of_the_tensorflow_history():
    history = {"total_loss": np.array([1.0, 9.0, 3.0]), "masked_lm_loss": np.array([2.0, 9, 4]),
               "disc_loss": np.array([0.5, 9, 1.5]), "grad_norm": np.array([1.0, 9, 2.0]),
               "learning_rate": np.array([0.1, 0.2, 0.3]), "tokens": np.array([10, 20, 30]),
               "skipped": np.array([0.0, 1.0, 0.0])}
    scalars = summaries.loop_scalars(history, {"masked_lm_accuracy": 0.25, "disc_loss": 7.0},
                                     done=3, elapsed=2.0, global_batch=4)
    assert scalars == {"total_loss": 2.0, "masked_lm_loss": 3.0, "disc_loss": 1.0,
                       "grad_norm": 1.5, "learning_rate": 0.3, "masked_lm_accuracy": 0.25,
                       "examples_per_second": 6.0, "tokens_per_second": 30.0}


def test_write_scalars_turns_a_full_disk_into_one_line():
    class _Full(_Writer):
        def scalars(self, step, values):
            raise OSError(28, "No space left on device")

    with pytest.raises(Exception, match="cannot write the TensorBoard events at step 3"):
        summaries.write_scalars(_Full([]), 3, {"a": 1.0})
    log = []
    summaries.write_scalars(_Writer(log), 3, {})
    assert log == []  # nothing to write: nothing written
