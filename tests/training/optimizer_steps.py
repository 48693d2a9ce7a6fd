"""Clipped optimizer steps, the schedule and the clip, computed the same way on every backend.

tests/training/test_optimizers_backends.py runs `run_all` in process on TensorFlow and in child
processes under JAX and PyTorch, where TensorFlow is unimportable (tests/backends.py); so this
module imports no TensorFlow, and returns plain numpy arrays (JSON text for configs).
"""

import contextlib
import json
from typing import Dict

import keras
import numpy as np
from keras import ops

from electra_tf.training import optimization, optimizers

# Names cover every decision by path: decayed (the embedding table, the kernel), excluded
# ("LayerNorm", "bias"), and a 0.5 rate multiplier on "layer_0/".
PATHS = ("electra/embeddings/word_embeddings", "electra/embeddings/LayerNorm/gamma",
         "electra/encoder/layer_0/attention/output/dense/kernel",
         "electra/encoder/layer_0/attention/output/dense/bias")
SHAPES = ((6, 3), (3,), (3, 4), (4,))
LR_MULTIPLIERS = {"layer_0/": 0.5}
# Gradient scales of the three steps: step 1's joint norm is over 1, so the clip scales it.
GRADIENT_SCALES = (0.05, 2.0, 0.1)
# adamw_bc: AdamWeightDecay with bias_correction (the adam_bias_correction hparam).
OPTIMIZER_NAMES = ("adamw", "lamb", "adamw_bc")
SCHEDULE_STEPS = (0, 1, 2, 3, 7, 10, 15)
OFFICIAL_SCHEDULE_STEPS = (0, 5000, 10_000, 500_000, 1_000_000, 2_000_000)


def make_inputs(seed: int = 0) -> Dict[str, np.ndarray]:
    """Starting weights "w_i" and the gradients "g{step}_{i}" of the three steps (float32)."""
    rng = np.random.default_rng(seed)
    inputs = {f"w_{i}": rng.standard_normal(shape).astype(np.float32)
              for i, shape in enumerate(SHAPES)}
    for step, scale in enumerate(GRADIENT_SCALES):
        for i, shape in enumerate(SHAPES):
            inputs[f"g{step}_{i}"] = (scale * rng.standard_normal(shape)).astype(np.float32)
    return inputs


def joint_norm(inputs: Dict[str, np.ndarray], step: int) -> float:
    return float(np.sqrt(sum((inputs[f"g{step}_{i}"].astype(np.float64) ** 2).sum()
                             for i in range(len(PATHS)))))


def make_schedule() -> optimization.WarmupPolynomialDecay:
    # Warmup and a non-linear decay: lr(0) = 0 (step 0 moves only m and v), then 2 warmup steps.
    return optimization.WarmupPolynomialDecay(1e-2, num_train_steps=10, num_warmup_steps=2,
                                              lr_decay_power=0.5)


def make_optimizer(name: str) -> optimizers.DecoupledWeightDecayOptimizer:
    if name == "adamw_bc":
        return optimizers.AdamWeightDecay(make_schedule(), lr_multipliers=LR_MULTIPLIERS,
                                          name=name, bias_correction=True)
    cls = {"adamw": optimizers.AdamWeightDecay, "lamb": optimizers.Lamb}[name]
    return cls(make_schedule(), lr_multipliers=LR_MULTIPLIERS, name=name)


def make_variables(inputs: Dict[str, np.ndarray]):
    """Keras variables whose `.path` is PATHS[i] (nested name scopes: '/' is not a name)."""
    variables = []
    for i, path in enumerate(PATHS):
        *scopes, name = path.split("/")
        with contextlib.ExitStack() as stack:
            for scope in scopes:
                stack.enter_context(keras.name_scope(scope))
            variables.append(keras.Variable(inputs[f"w_{i}"], name=name))
        assert variables[-1].path == path, variables[-1].path
    return variables


def _gradients(inputs, step):
    return [ops.convert_to_tensor(inputs[f"g{step}_{i}"]) for i in range(len(PATHS))]


def train(name: str, inputs: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """Three `apply_gradients` steps (clip at 1.0, then the update): weights, slots, norms."""
    optimizer = make_optimizer(name)
    variables = make_variables(inputs)
    norms = [ops.convert_to_numpy(optimization.apply_gradients(
        optimizer, _gradients(inputs, step), variables)) for step in range(len(GRADIENT_SCALES))]
    out = {f"{name}/norms": np.stack(norms),
           f"{name}/iterations": ops.convert_to_numpy(optimizer.iterations)}
    for i, variable in enumerate(variables):
        out[f"{name}/w_{i}"] = ops.convert_to_numpy(variable)
        for slot in ("adam_m", "adam_v"):
            out[f"{name}/{slot}_{i}"] = ops.convert_to_numpy(optimizer.get_slot(variable, slot))
    return out


def train_stateless(name: str, inputs: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """The same steps as Keras' JAX fit() takes them: `dense_clip_by_global_norm`, then
    `stateless_apply`, jitted on JAX (not available on TensorFlow)."""
    optimizer = make_optimizer(name)
    variables = make_variables(inputs)
    optimizer.build(variables)

    def step(optimizer_values, values, grads):
        clipped = optimization.dense_clip_by_global_norm(grads, optimization.CLIP_NORM)
        return optimizer.stateless_apply(optimizer_values, clipped.gradients, values)

    if keras.backend.backend() == "jax":
        import jax
        step = jax.jit(step)
    values = [v.value for v in variables]
    optimizer_values = [v.value for v in optimizer.variables]
    for s in range(len(GRADIENT_SCALES)):
        values, optimizer_values = step(optimizer_values, values, _gradients(inputs, s))
    position = {id(v): j for j, v in enumerate(optimizer.variables)}
    out = {}
    for i, variable in enumerate(variables):
        out[f"stateless/{name}/w_{i}"] = ops.convert_to_numpy(values[i])
        for slot in ("adam_m", "adam_v"):
            j = position[id(optimizer.get_slot(variable, slot))]
            out[f"stateless/{name}/{slot}_{i}"] = ops.convert_to_numpy(optimizer_values[j])
    return out


def schedule_values() -> Dict[str, np.ndarray]:
    official = optimization.WarmupPolynomialDecay(5e-4, num_train_steps=1_000_000,
                                                  num_warmup_steps=10_000)
    return {
        "schedule": np.array([ops.convert_to_numpy(make_schedule()(t)) for t in SCHEDULE_STEPS]),
        "official_schedule": np.array([ops.convert_to_numpy(official(t))
                                       for t in OFFICIAL_SCHEDULE_STEPS]),
        # An int64 step, as an optimizer's `iterations`.
        "official_schedule_int64": ops.convert_to_numpy(
            official(ops.convert_to_tensor(np.int64(5000)))),
    }


def clip(inputs: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """`clip_by_global_norm` of step 1's gradients (norm > 1) plus a None; a non-finite norm."""
    clipped, norm = optimization.clip_by_global_norm(_gradients(inputs, 1) + [None], 1.0)
    out = {f"clip_{i}": ops.convert_to_numpy(g) for i, g in enumerate(clipped[:-1])}
    out["clip_norm"] = ops.convert_to_numpy(norm)
    out["clip_none_kept"] = np.array(clipped[-1] is None)
    unclipped, _ = optimization.clip_by_global_norm(_gradients(inputs, 1), 100.0)
    out["unclipped_0"] = ops.convert_to_numpy(unclipped[0])
    inf, inf_norm = optimization.clip_by_global_norm(
        [ops.convert_to_tensor(np.array([np.inf, 1.0], np.float32))], 1.0)
    out["inf_clipped"] = ops.convert_to_numpy(inf[0])
    out["inf_norm"] = ops.convert_to_numpy(inf_norm)
    return out


def configs() -> Dict[str, np.ndarray]:
    """For both optimizers and the schedule: JSON of [get_config, from_config(...).get_config,
    the config after serialize -> deserialize, the deserialized class name]."""
    out = {}
    for key, obj, module in (("adamw", make_optimizer("adamw"), keras.optimizers),
                             ("lamb", make_optimizer("lamb"), keras.optimizers),
                             ("schedule", make_schedule(), keras.optimizers.schedules)):
        config = obj.get_config()
        restored = type(obj).from_config(config).get_config()
        again = module.deserialize(module.serialize(obj))
        out[f"config/{key}"] = np.array(json.dumps(
            [config, restored, again.get_config(), type(again).__name__]))
    return out


def run_all(inputs: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """Everything the cross-backend tests compare, in one process."""
    out = {}
    for name in OPTIMIZER_NAMES:
        out.update(train(name, inputs))
        if keras.backend.backend() != "tensorflow":  # TF has no stateless_apply (tf.distribute)
            out.update(train_stateless(name, inputs))
    out.update(schedule_values())
    out.update(clip(inputs))
    out.update(configs())
    return out
