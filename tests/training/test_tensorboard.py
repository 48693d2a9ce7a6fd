"""TensorBoard: hparams (plugin), the resolved config as text, the opt-in profiler trace, and a
real `tensorboard` server on 127.0.0.1 serving a finished run's losses over HTTP."""

import glob
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
import tensorflow as tf

from electra_tf.training import board
from electra_tf.training.tf import trainer as trainer_lib
from tests import pretraining_fixtures as fx

pytestmark = pytest.mark.usefixtures("float32_policy")

SERVER_TIMEOUT = 120
RUN = "tb"


@pytest.fixture(scope="module")
def finished_run(data_dir):
    config = fx.tiny_config(data_dir, RUN, num_train_steps=8, iterations_per_loop=2,
                            save_checkpoints_steps=8, do_eval=True)
    trainer_lib.run(config, profile_steps=2)
    return config


def _events(model_dir):
    """[(step, tag, plugin name, tensor proto)] of the run's training event files."""
    out = []
    for path in glob.glob(os.path.join(model_dir, "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                out.append((event.step, value.tag, value.metadata.plugin_data.plugin_name,
                            value))
    return out


def test_hparams_and_config_text_are_in_the_run_events(finished_run):
    events = _events(finished_run.model_dir)
    plugins = {plugin for _, _, plugin, _ in events}
    assert {"scalars", "hparams", "text"} <= plugins
    from tensorboard.plugins.hparams import plugin_data_pb2

    session = [v for _, _, plugin, v in events if plugin == "hparams"]
    data = plugin_data_pb2.HParamsPluginData.FromString(session[0].metadata.plugin_data.content)
    hparams = data.session_start_info.hparams
    assert data.session_start_info.group_name or data.session_start_info.start_time_secs
    assert hparams["learning_rate"].number_value == pytest.approx(finished_run.learning_rate)
    assert hparams["model_size"].string_value == finished_run.model_size
    assert json.loads(hparams["model_hparam_overrides"].string_value) == \
        finished_run.model_hparam_overrides
    assert "model_dir" not in hparams and "data_dir" not in hparams
    text = [v for step, tag, _, v in events if tag == "config"]
    assert len(text) == 1
    body = tf.make_ndarray(text[0].tensor).item().decode()
    recorded = json.loads(body.strip("`\n"))
    with open(os.path.join(finished_run.model_dir, "config.json")) as f:
        assert recorded == json.load(f)
    # The given config, plus what the trainer resolved (the precision `auto` would pick).
    assert recorded.pop("resolved_mixed_precision") == "float32"
    assert recorded.pop("resolved_mixed_precision_reason")
    expected = json.loads(json.dumps(finished_run.to_dict(), default=str))
    del expected["resolved_mixed_precision"], expected["resolved_mixed_precision_reason"]
    assert recorded == expected


def test_profiler_trace_is_written_only_when_asked(finished_run, data_dir):
    traces = glob.glob(os.path.join(finished_run.model_dir, "plugins", "profile", "*",
                                    "*.xplane.pb"))
    assert len(traces) == 1 and os.path.getsize(traces[0]) > 1000
    profiler = board.Profiler(str(data_dir), 0)
    profiler.before_loop(0)
    profiler.before_loop(2)
    assert not profiler.active  # 0 steps: never starts


def test_hparam_values_are_plugin_types():
    values = board.hparam_values({"a": 1, "b": [1, 2], "c": None, "model_dir": "/x", "d": True})
    assert values == {"a": 1, "b": "[1, 2]", "d": True}


def _get(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as response:  # 127.0.0.1 only
        return json.loads(response.read().decode("utf-8"))


@pytest.mark.slow
def test_tensorboard_server_serves_the_losses_over_http(finished_run, tmp_path):
    logdir = os.path.dirname(finished_run.model_dir)  # DATA_DIR/models, as the README says
    expected = fx.read_scalars(finished_run.model_dir, ("total_loss", "disc_loss"))
    port = fx.free_ports(1)[0]
    log = open(tmp_path / "tensorboard.log", "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", logdir, "--host", "127.0.0.1",
         "--port", str(port), "--reload_interval", "1"],
        stdout=log, stderr=subprocess.STDOUT, env=fx.subprocess_env())
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVER_TIMEOUT
        got = None
        while time.monotonic() < deadline and server.poll() is None:
            try:
                query = urllib.parse.urlencode({"run": RUN, "tag": "total_loss"})
                got = _get(f"{base}/data/plugin/scalars/scalars?{query}")
                if len(got) == len(expected["total_loss"]):
                    break
            except (urllib.error.URLError, ConnectionError, ValueError):
                pass
            time.sleep(0.2)
        assert got is not None, open(tmp_path / "tensorboard.log").read()[-2000:]
        steps = {step: value for _, step, value in got}
        assert sorted(steps) == sorted(expected["total_loss"]) == [2, 4, 6, 8]
        for step, value in steps.items():
            assert value == pytest.approx(expected["total_loss"][step], rel=1e-6)
        query = urllib.parse.urlencode({"run": RUN, "tag": "disc_loss"})
        disc = {step: value for _, step, value in _get(f"{base}/data/plugin/scalars/scalars?{query}")}
        assert disc == pytest.approx(expected["disc_loss"], rel=1e-6)
        runs = _get(f"{base}/data/runs")
        assert RUN in runs and f"{RUN}/eval" in runs
        tags = _get(f"{base}/data/plugin/text/tags")
        assert "config" in tags[RUN]
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()
