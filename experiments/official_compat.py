"""Runs google-research/electra's own pretraining graph under TensorFlow 2.21's `compat.v1`.

The official code (TF 1.15) needs three things TF 2.21 no longer has, and nothing else:

- `tensorflow.contrib.layers.layer_norm` (gone with `contrib`);
- `tf.compat.v1.layers.dense` (raises "`dense` is not available with Keras 3");
- `tf.estimator` (gone since TF 2.16), which the official code touches only to subclass
  `SessionRunHook` at import time and to build its `TPUEstimatorSpec`, which this driver skips.

`install()` puts equivalents in place. They create the same variables under the same names
(`LayerNorm/{beta,gamma}`, `<name>/{kernel,bias}`, default names uniquified as `dense`,
`dense_1`, ...), with the same initialisers and arithmetic (contrib's layer_norm: moments over the
last axis, epsilon 1e-12; dense: `x @ kernel + bias` over the last axis, Glorot-uniform kernel by
default), so the official `PretrainingModel` and `create_optimizer` build their own graph
unchanged. `train()` then drives that graph in a `tf.compat.v1.Session` instead of a
TPUEstimator: the same input function, model, loss, optimizer and clip, step by step, and hands
the official `eval_fn_inputs` of every training step to a callback.

The official sources are not part of electra-tf (Apache-2.0, but never vendored here): pass the
directory of a checkout (`git clone https://github.com/google-research/electra`).
"""

from __future__ import annotations

import os
import sys
import types
from typing import Callable, Dict, Optional

# The order of the official `eval_fn_inputs` dict (run_pretraining.PretrainingModel.__init__),
# which `eval_metrics` passes on as a list of values.
EVAL_FN_KEYS = ("input_ids", "masked_lm_preds", "mlm_loss", "masked_lm_ids", "masked_lm_weights",
                "input_mask", "disc_loss", "disc_labels", "disc_probs", "disc_preds",
                "sampled_tokids")
LAYER_NORM_EPSILON = 1e-12  # contrib.layers.layer_norm's hard-coded variance_epsilon

OFFICIAL_FILES = ("run_pretraining.py", "configure_pretraining.py", "model/modeling.py",
                  "model/optimization.py", "pretrain/pretrain_helpers.py",
                  "pretrain/pretrain_data.py", "util/training_utils.py")


def check_official_dir(path: str) -> str:
    """The absolute path of an official checkout, or SystemExit naming what is missing."""
    path = os.path.abspath(os.path.expanduser(path))
    missing = [f for f in OFFICIAL_FILES if not os.path.isfile(os.path.join(path, f))]
    if missing:
        raise SystemExit(f"{path} is not a google-research/electra checkout (missing "
                         f"{', '.join(missing)}): git clone https://github.com/google-research/"
                         "electra and pass its directory")
    return path


def layer_norm(inputs, begin_norm_axis=-1, begin_params_axis=-1, scope=None, reuse=None,
               **unused):
    """contrib.layers.layer_norm over the last axis: the official `modeling.layer_norm` call."""
    import tensorflow.compat.v1 as tf

    if begin_norm_axis != -1 or begin_params_axis != -1:
        raise NotImplementedError("only the last-axis layer norm the official code uses")
    with tf.variable_scope(scope, default_name="LayerNorm", reuse=reuse):
        width = inputs.shape[-1]
        beta = tf.get_variable("beta", [width], initializer=tf.zeros_initializer())
        gamma = tf.get_variable("gamma", [width], initializer=tf.ones_initializer())
        mean, variance = tf.nn.moments(inputs, [-1], keepdims=True)
        return tf.nn.batch_normalization(inputs, mean, variance, beta, gamma,
                                         LAYER_NORM_EPSILON)


def dense(inputs, units, activation=None, use_bias=True, kernel_initializer=None,
          bias_initializer=None, name=None, reuse=None, **unused):
    """tf.layers.dense: kernel [in, units] (Glorot-uniform unless given), zero bias, over the
    last axis of any rank."""
    import tensorflow.compat.v1 as tf

    with tf.variable_scope(name, default_name="dense", reuse=reuse):
        kernel = tf.get_variable("kernel", [inputs.shape[-1], units],
                                 initializer=kernel_initializer or tf.glorot_uniform_initializer())
        if inputs.shape.rank == 2:
            outputs = tf.matmul(inputs, kernel)
        else:
            outputs = tf.tensordot(inputs, kernel, [[inputs.shape.rank - 1], [0]])
        if use_bias:
            bias = tf.get_variable("bias", [units],
                                   initializer=bias_initializer or tf.zeros_initializer())
            outputs = tf.nn.bias_add(outputs, bias)
        return activation(outputs) if activation is not None else outputs


def install() -> None:
    """Makes `tensorflow.contrib.layers`, `tf.compat.v1.layers.dense` and the `tf.estimator`
    names the official code touches importable (idempotent)."""
    import tensorflow.compat.v1 as tf

    if "tensorflow.contrib" not in sys.modules:
        contrib = types.ModuleType("tensorflow.contrib")
        contrib.layers = types.ModuleType("tensorflow.contrib.layers")
        contrib.layers.layer_norm = layer_norm
        sys.modules["tensorflow.contrib"] = contrib
        sys.modules["tensorflow.contrib.layers"] = contrib.layers
    tf.layers = types.SimpleNamespace(dense=dense)
    if not hasattr(tf, "estimator"):
        tf.estimator = types.SimpleNamespace(
            SessionRunHook=object, SessionRunArgs=lambda fetches: fetches,
            ModeKeys=types.SimpleNamespace(TRAIN="train", EVAL="eval"))


def import_official(official_dir: str):
    """(configure_pretraining, run_pretraining, optimization, pretrain_data) of the checkout.

    The checkout goes first on sys.path: its `run_pretraining` must win over electra-tf's
    script of the same name."""
    official_dir = check_official_dir(official_dir)
    install()
    for name in ("run_pretraining", "configure_pretraining"):
        module = sys.modules.get(name)
        if module is not None and not getattr(module, "__file__", "").startswith(official_dir):
            del sys.modules[name]
    sys.path.insert(0, official_dir)
    import configure_pretraining  # noqa: E402  (the official modules)
    import run_pretraining
    from model import optimization
    from pretrain import pretrain_data
    return configure_pretraining, run_pretraining, optimization, pretrain_data


def train(official_dir: str, data_dir: str, hparams: dict, seed: int, steps: int,
          on_step: Callable[[int, float, Dict[str, object]], Optional[bool]],
          threads: int = 0) -> None:
    """Trains the official model for `steps` steps in a Session, from scratch.

    Args:
      official_dir: a google-research/electra checkout.
      data_dir: the official DATA_DIR: `vocab.txt` and `pretrain_tfrecords/pretrain_data.tfrecord*`.
      hparams: official hparams (`configure_pretraining.PretrainingConfig` keys).
      seed: the graph-level seed (`tf.set_random_seed`): initialisation, masking, sampling and
        dropout. The official input pipeline is unseeded (sloppy interleave); its order varies.
      steps: optimizer steps to run.
      on_step: called after every step with (step, total_loss, eval_fn_inputs as numpy arrays,
        keyed by `EVAL_FN_KEYS`); returning True stops early.
      threads: intra-op threads (0: TensorFlow's default); one inter-op thread, as electra-tf's
        CPU default.
    """
    configure_pretraining, run_pretraining, optimization, pretrain_data = \
        import_official(official_dir)
    import tensorflow.compat.v1 as tf

    config = configure_pretraining.PretrainingConfig("official_crosscheck", data_dir, **hparams)
    graph = tf.Graph()
    with graph.as_default():
        tf.set_random_seed(seed)
        dataset = pretrain_data.get_input_fn(config, True)({"batch_size": config.train_batch_size})
        features = tf.data.make_one_shot_iterator(dataset).get_next()
        model = run_pretraining.PretrainingModel(config, features, True)
        train_op = optimization.create_optimizer(
            model.total_loss, config.learning_rate, config.num_train_steps,
            weight_decay_rate=config.weight_decay_rate, use_tpu=False,
            warmup_steps=config.num_warmup_steps, lr_decay_power=config.lr_decay_power)
        _, values = model.eval_metrics
        if len(values) != len(EVAL_FN_KEYS):
            raise RuntimeError(f"the official eval_fn_inputs has {len(values)} entries, expected "
                               f"{len(EVAL_FN_KEYS)} (ELECTRA objective)")
        init = tf.global_variables_initializer()
    session_config = tf.ConfigProto(intra_op_parallelism_threads=threads,
                                    inter_op_parallelism_threads=1)
    # Not `with Session(...)`: that would make the graph the default one, and `on_step`, which
    # runs eager code (Keras metrics), would then build ops into it.
    session = tf.Session(graph=graph, config=session_config)
    try:
        session.run(init)
        for step in range(1, steps + 1):
            _, loss, outputs = session.run([train_op, model.total_loss, values])
            if on_step(step, float(loss), dict(zip(EVAL_FN_KEYS, outputs))):
                break
    finally:
        session.close()
