"""The official AdamW, and LAMB, as Keras 3 optimizers (official parity items 30-31).

* `AdamWeightDecay`: the official AdamWeightDecayOptimizer. Adam without bias correction, epsilon
  1e-6 added to sqrt(v), decoupled weight decay 0.01 scaled by the learning rate, skipped for
  variables whose path matches "LayerNorm", "layer_norm" or "bias".
* `Lamb`: LAMB for large global batches (NVIDIA's ELECTRA uses it; the official code has none).

Which name the exclusion and multiplier patterns see: the Keras 3 variable `.path`, e.g.
"electra/encoder/layer_0/attention/output/LayerNorm/gamma" (the official checkpoint name when layers
are named as the official scopes), or "transformer_layer_0/self_attention_layer_norm/gamma" for a
keras-hub layer. A Keras 3 variable's `.name` is only its last component ("gamma", "kernel"), which
could never match "LayerNorm", so `.name` is used only for raw `tf.Variable`s, which have no `.path`
(without the ":0" suffix). Patterns are matched with `re.search`, as the official does.

Backends: `update_step` is keras.ops, the same function on TensorFlow, JAX and PyTorch
(tests/training/test_optimizers_backends.py). On TensorFlow, `AdamWeightDecay` runs one-device
variables through the fused ResourceApplyAdam kernel instead (`tf_update.fused_adamw_update`, the
same function to float rounding), and IndexedSlices gradients are densified first; TensorFlow is
imported only there, so the JAX and PyTorch paths never import it.

Decoupled optimizers (`decoupled_optimizers`, Dong et al., ICML 2023): with a
`generator_learning_rate` and the generator's variables (`set_generator_variables`), the generator's
variables are updated at the generator's rate and the others at `learning_rate`. Each variable's
update reads only its own gradient and slots and the step counter, which both sides count alike, so
this is exactly an optimizer per network (own slots, own schedule); `optimization.clip_gradients`
gives each side its own global-norm clip.

Distribution (TensorFlow): Keras 3's TF optimizer, when `apply()` runs in a replica context, first
sums the gradients across replicas (`TFOptimizer._backend_update_step` ->
`_all_reduce_sum_gradients`). `optimization.apply_gradients` sums (and clips) them itself, then
applies them inside `_gradients_summed_across_replicas()`, which tells these optimizers to skip
their own sum.
"""

from __future__ import annotations

import contextlib
import re
import threading
from typing import Callable, Mapping, Optional, Sequence, Union

import keras
from keras import ops

if keras.backend.backend() == "tensorflow":
    from electra_tf.training.tf import update as tf_update
else:
    tf_update = None  # JAX / PyTorch: dense gradients, no fused kernels, no tf.distribute

# --- Official constants (google-research/electra model/optimization.py) -------------------------
# AdamWeightDecayOptimizer(beta_1=0.9, beta_2=0.999, epsilon=1e-6, ...).
ADAM_BETA_1 = 0.9
ADAM_BETA_2 = 0.999
ADAM_EPSILON = 1e-6
# configure_pretraining.py: weight_decay_rate = 0.01.
WEIGHT_DECAY_RATE = 0.01
# create_optimizer(): exclude_from_weight_decay=["LayerNorm", "layer_norm", "bias"].
EXCLUDE_FROM_WEIGHT_DECAY = ("LayerNorm", "layer_norm", "bias")

LrMultipliers = Union[None, Mapping[str, float], Callable[[str], float]]


def variable_name(variable) -> str:
    """The string the exclusion / multiplier patterns are matched against.

    Args:
        variable: a Keras 3 variable (its `.path`) or a raw `tf.Variable` (its `.name` without the
            ":0" output suffix).
    """
    path = getattr(variable, "path", None)
    if path:
        return path
    return re.sub(r":\d+$", "", variable.name)


def _fusable_handles(variable, m, v):
    """The resource handles of TensorFlow's fused kernels (`tf_update.fusable_handles`), or None:
    another backend, or a distributed variable, which take the keras.ops update."""
    if tf_update is None:
        return None
    return tf_update.fusable_handles(variable, m, v)


class _ReplicaSumState:
    """Counts the `apply_gradients` calls in flight that have already summed across replicas.

    A counter (not a flag, not thread-local): under MirroredStrategy every replica runs in its own
    thread, and Keras' LossScaleOptimizer applies the inner optimizer from yet other threads, so
    each entering replica increments and each leaving one decrements, under a lock. Replicas only
    leave after the update's merge_call barrier, i.e. after every replica has read the counter.
    """

    def __init__(self):
        self.lock = threading.Lock()
        self.depth = 0


class DecoupledWeightDecayOptimizer(keras.optimizers.Optimizer):
    """Shared machinery: exclusion patterns, per-variable LR multipliers, pre-summed gradients.

    Per-variable decisions (decay or not, LR multiplier) are taken once in `build()` from the
    variable paths and looked up by index in `update_step`, which under tf.distribute only sees
    the per-device component variables.
    """

    def __init__(self, learning_rate, weight_decay_rate: float = WEIGHT_DECAY_RATE,
                 beta_1: float = ADAM_BETA_1, beta_2: float = ADAM_BETA_2,
                 epsilon: float = ADAM_EPSILON,
                 exclude_from_weight_decay: Optional[Sequence[str]] = EXCLUDE_FROM_WEIGHT_DECAY,
                 lr_multipliers: LrMultipliers = None, name: Optional[str] = None,
                 generator_learning_rate=None, bias_correction: bool = False, **kwargs):
        if kwargs.get("weight_decay") is not None:
            raise ValueError(
                f"{type(self).__name__} takes weight_decay_rate (the official decoupled decay), "
                f"not Keras' weight_decay={kwargs['weight_decay']}")
        kwargs.pop("weight_decay", None)
        if isinstance(learning_rate, int) and not isinstance(learning_rate, bool):
            learning_rate = float(learning_rate)  # Keras accepts only float or a schedule
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        if weight_decay_rate < 0:
            raise ValueError(f"weight_decay_rate must be >= 0, got {weight_decay_rate}")
        if lr_multipliers is not None and not (callable(lr_multipliers)
                                               or isinstance(lr_multipliers, Mapping)):
            raise ValueError("lr_multipliers must be None, a dict {regex: multiplier} or a "
                             f"callable(path) -> multiplier, got {type(lr_multipliers).__name__}")
        self.weight_decay_rate = weight_decay_rate
        self.beta_1 = beta_1
        self.beta_2 = beta_2
        self.epsilon = epsilon
        self.exclude_from_weight_decay = (None if exclude_from_weight_decay is None
                                          else list(exclude_from_weight_decay))
        self.lr_multipliers = (dict(lr_multipliers) if isinstance(lr_multipliers, Mapping)
                               else lr_multipliers)
        self._replica_sum = _ReplicaSumState()
        if isinstance(generator_learning_rate, int) and not isinstance(generator_learning_rate, bool):
            generator_learning_rate = float(generator_learning_rate)
        self.generator_learning_rate = generator_learning_rate
        self.bias_correction = bool(bias_correction)
        self._generator_variable_ids = None
        self._generator_flags = None

    # --- Decoupled optimizers ------------------------------------------------------------------
    @property
    def decoupled(self) -> bool:
        """True when the generator has its own learning rate (`decoupled_optimizers`)."""
        return self.generator_learning_rate is not None

    def set_generator_variables(self, variables: Sequence) -> None:
        """Names the variables the generator's rate and clip apply to (before `build`).

        Args:
            variables: the model variables of the generator side
                (`ElectraPretrainer.generator_variables()`).

        Raises:
            ValueError: without a `generator_learning_rate`, or once built with other ones.
        """
        if not self.decoupled:
            raise ValueError("set_generator_variables needs a generator_learning_rate")
        ids = frozenset(id(v) for v in variables)
        if self.built and ids != self._generator_variable_ids:
            raise ValueError("set_generator_variables after build(): the groups are fixed")
        self._generator_variable_ids = ids

    @property
    def generator_variables_known(self) -> bool:
        """True once `set_generator_variables` named the generator side."""
        return self._generator_variable_ids is not None

    def is_generator_variable(self, variable) -> bool:
        """True for a variable of the generator side (always False when not decoupled)."""
        return self.decoupled and id(variable) in self._generator_variable_ids

    def _side_learning_rate(self, learning_rate, index):
        """The rate of variable `index`: the generator's under decoupled optimizers, else
        `learning_rate` (the scheduled rate Keras passes to `update_step`)."""
        if not (self._generator_flags and self._generator_flags[index]):
            return learning_rate
        rate = self.generator_learning_rate
        if isinstance(rate, keras.optimizers.schedules.LearningRateSchedule):
            return rate(self.iterations)
        return rate

    # --- Per-variable decisions ------------------------------------------------------------------
    def use_weight_decay(self, variable) -> bool:
        """True if `variable` is decayed: wd > 0 and no exclusion pattern re.search-matches it."""
        if not self.weight_decay_rate:
            return False
        name = variable_name(variable)
        return not any(re.search(p, name) for p in (self.exclude_from_weight_decay or ()))

    def lr_multiplier(self, variable) -> float:
        """The learning-rate multiplier of `variable`: the first matching regex wins, else 1."""
        if self.lr_multipliers is None:
            return 1.0
        name = variable_name(variable)
        if callable(self.lr_multipliers):
            return float(self.lr_multipliers(name))
        for pattern, multiplier in self.lr_multipliers.items():
            if re.search(pattern, name):
                return float(multiplier)
        return 1.0

    def build(self, var_list):
        if self.built:
            return
        super().build(var_list)
        # Tuples of plain Python values: decided once, by path, while the Keras variables are at
        # hand; update_step only sees per-device component variables under tf.distribute.
        self._weight_decay_flags = tuple(self.use_weight_decay(v) for v in var_list)
        self._lr_multiplier_values = tuple(self.lr_multiplier(v) for v in var_list)
        if self.decoupled:
            if self._generator_variable_ids is None:
                raise ValueError("decoupled optimizers: call set_generator_variables(...) before "
                                 "build() (ElectraPretrainer.generator_variables())")
            self._generator_flags = tuple(self.is_generator_variable(v) for v in var_list)
        self._build_slots(var_list)

    def _build_slots(self, var_list):
        raise NotImplementedError

    # --- Distribution: skip Keras' summation when apply_gradients already did it ---------------
    @contextlib.contextmanager
    def _gradients_summed_across_replicas(self):
        with self._replica_sum.lock:
            self._replica_sum.depth += 1
        try:
            yield
        finally:
            with self._replica_sum.lock:
                self._replica_sum.depth -= 1

    def _all_reduce_sum_gradients(self, grads_and_vars):
        # Overrides keras' TFOptimizer hook (keras/src/backend/tensorflow/optimizer.py), called
        # from _backend_update_step in a replica context. Inside apply_gradients the gradients
        # are already the cross-replica sum, and summing again would multiply them by the
        # number of replicas.
        if self._replica_sum.depth > 0:
            return list(grads_and_vars)
        return super()._all_reduce_sum_gradients(grads_and_vars)

    # --- Shared maths ------------------------------------------------------------------------
    def _moments(self, gradient, variable, index):
        """Updates m and v in place and returns their new values (no bias correction)."""
        dtype = variable.dtype
        if tf_update is not None:
            gradient = tf_update.dense(gradient)  # IndexedSlices: every row's m, v decays
        gradient = ops.cast(gradient, dtype)
        m_var = self._adam_m[index]
        v_var = self._adam_v[index]
        # Betas in the variable's dtype, so 1 - beta rounds alike on every backend.
        beta_1 = ops.cast(self.beta_1, dtype)
        beta_2 = ops.cast(self.beta_2, dtype)
        next_m = ops.add(ops.multiply(beta_1, m_var),
                         ops.multiply(ops.subtract(1.0, beta_1), gradient))
        next_v = ops.add(ops.multiply(beta_2, v_var),
                         ops.multiply(ops.subtract(1.0, beta_2), ops.square(gradient)))
        self.assign(m_var, next_m)
        self.assign(v_var, next_v)
        return next_m, next_v

    def _bias_correction_factor(self, dtype):
        """sqrt(1 - beta_2^t) / (1 - beta_1^t) at this update's step t = iterations + 1, or None
        without `bias_correction` (the official update)."""
        if not self.bias_correction:
            return None
        t = ops.cast(ops.add(self.iterations, 1), dtype)
        beta_1 = ops.cast(self.beta_1, dtype)
        beta_2 = ops.cast(self.beta_2, dtype)
        return ops.divide(ops.sqrt(ops.subtract(1.0, ops.power(beta_2, t))),
                          ops.subtract(1.0, ops.power(beta_1, t)))

    def get_slot(self, variable, slot_name: str):
        """The optimizer slot ("adam_m" or "adam_v") of a model variable (for converters)."""
        slots = {"adam_m": self._adam_m, "adam_v": self._adam_v}
        if slot_name not in slots:
            raise ValueError(f"unknown slot {slot_name!r}; slots are {', '.join(slots)}")
        return slots[slot_name][self._get_variable_index(variable)]

    def get_config(self) -> dict:
        if callable(self.lr_multipliers):
            raise ValueError(f"{type(self).__name__}.get_config: a callable lr_multipliers "
                             "cannot be serialised; pass a dict {regex: multiplier} instead")
        config = super().get_config()
        config.update({
            "weight_decay_rate": self.weight_decay_rate,
            "beta_1": self.beta_1,
            "beta_2": self.beta_2,
            "epsilon": self.epsilon,
            "exclude_from_weight_decay": self.exclude_from_weight_decay,
            "lr_multipliers": self.lr_multipliers,
        })
        if self.bias_correction:  # absent = the official update (older saved configs)
            config["bias_correction"] = True
        if self.decoupled:
            rate = self.generator_learning_rate
            config["generator_learning_rate"] = (
                keras.optimizers.schedules.serialize(rate)
                if isinstance(rate, keras.optimizers.schedules.LearningRateSchedule) else rate)
        return config

    @classmethod
    def from_config(cls, config, custom_objects=None):
        # Keras' base from_config replaces config["learning_rate"] in place; work on a copy so
        # the caller's (JSON) config is left untouched.
        config = dict(config)
        if isinstance(config.get("generator_learning_rate"), dict):
            config["generator_learning_rate"] = keras.optimizers.schedules.deserialize(
                config["generator_learning_rate"], custom_objects=custom_objects)
        return super().from_config(config, custom_objects=custom_objects)


@keras.saving.register_keras_serializable(package="electra_tf")
class AdamWeightDecay(DecoupledWeightDecayOptimizer):
    """The official AdamWeightDecayOptimizer (parity item 31).

    Per variable, with g its gradient and lr_t the scheduled rate (times the variable's multiplier):

        m <- beta_1 * m + (1 - beta_1) * g
        v <- beta_2 * v + (1 - beta_2) * g^2
        update = m / (sqrt(v) + epsilon)                 # NO bias correction
        update += weight_decay_rate * param              # unless excluded
        param <- param - lr_t * update

    Without bias correction the first updates are larger than `lr_t` suggests: the Adam part is
    (1 - beta_1^t) / sqrt(1 - beta_2^t) times the bias-corrected one, 3.2x at step 1, 6.5x at
    step 10, 2.3x at 218, 1.26x at 1000 (beta_2's horizon, 1 / (1 - beta_2) steps). The
    official 10,000-step warmup hides this (`schedule_amplification`); a short warmup does not.
    `bias_correction=True` multiplies the Adam part (not the decay) by
    sqrt(1 - beta_2^t) / (1 - beta_1^t), as Adam (Kingma & Ba) and Keras' AdamW do.

    Slots are named "<variable path with _>_adam_m" / "_adam_v" (the official `<var>/adam_m`,
    `<var>/adam_v`); `get_slot(variable, "adam_m")` returns them. No beta-power variables exist.

    Args:
        learning_rate: float or LearningRateSchedule (e.g. `WarmupPolynomialDecay`).
        weight_decay_rate: float. Decoupled decay coefficient, scaled by the learning rate.
        beta_1: float. First-moment decay.
        beta_2: float. Second-moment decay.
        epsilon: float. Added to sqrt(v) (outside the root, as the official).
        exclude_from_weight_decay: list of regexes; a variable whose path re.search-matches one
            of them is not decayed. None decays every variable. (The attribute of this name
            replaces Keras' `exclude_from_weight_decay()` method, which only configures Keras'
            own `weight_decay`, unused here.)
        lr_multipliers: None, a dict {regex: multiplier} (first match in order wins, unmatched
            variables get 1.0) or a callable(path) -> multiplier, e.g. for the fine-tuning
            layer-wise decay (official section 6.3). Decay is scaled by the multiplied rate too,
            as in the official per-group optimizers. Only the dict form serialises.
        name: str. Optimizer name.
        generator_learning_rate: None, a float or a LearningRateSchedule: the rate of the
            variables named by `set_generator_variables` (decoupled optimizers, see the module
            docstring); None updates every variable at `learning_rate`.
        bias_correction: bool. False (official): no bias correction. True: Adam's bias
            correction of the Adam part (above).
        **kwargs: Keras base optimizer arguments. Prefer `apply_gradients(..., clip_norm=)` to
            Keras' `global_clipnorm`, which clips per replica before the cross-replica sum.
    """

    def _build_slots(self, var_list):
        self._adam_m, self._adam_v = self.add_optimizer_variables(var_list, ["adam_m", "adam_v"])

    def update_step(self, gradient, variable, learning_rate):
        index = self._get_variable_index(variable)
        dtype = variable.dtype
        lr = ops.multiply(ops.cast(self._side_learning_rate(learning_rate, index), dtype),
                          self._lr_multiplier_values[index])
        correction = self._bias_correction_factor(dtype)
        adam_lr = lr if correction is None else ops.multiply(lr, correction)
        handles = _fusable_handles(variable, self._adam_m[index], self._adam_v[index])
        if handles is not None:
            self._fused_update(gradient, handles, lr, adam_lr, index)
            return
        next_m, next_v = self._moments(gradient, variable, index)
        update = ops.divide(next_m, ops.add(ops.sqrt(next_v), ops.cast(self.epsilon, dtype)))
        if correction is not None:
            update = ops.multiply(correction, update)
        if self._weight_decay_flags[index]:
            update = ops.add(update, ops.multiply(ops.cast(self.weight_decay_rate, dtype),
                                                  variable))
        self.assign_sub(variable, ops.multiply(lr, update))

    def _fused_update(self, gradient, handles, lr, adam_lr, index):
        """The same update with TensorFlow's fused kernels (`tf_update.fused_adamw_update`)."""
        tf_update.fused_adamw_update(
            gradient, handles, lr, self.beta_1, self.beta_2, self.epsilon,
            self.weight_decay_rate if self._weight_decay_flags[index] else None, adam_lr=adam_lr)


@keras.saving.register_keras_serializable(package="electra_tf")
class Lamb(DecoupledWeightDecayOptimizer):
    """LAMB (You et al. 2019) with the same exclusion lists, for large global batches.

    The official ELECTRA has no LAMB; NVIDIA's ELECTRA uses TF-Addons' `LAMB` with
    exclude_from_weight_decay=["LayerNorm", "layer_norm", "bias"], and this follows its semantics:

        m, v as Adam;  m_hat = m / (1 - beta_1^t),  v_hat = v / (1 - beta_2^t)   (t = step + 1)
        update = m_hat / (sqrt(v_hat) + epsilon) + weight_decay_rate * param   (unless excluded)
        ratio = ||param|| / ||update|| if both norms > 0 else 1   (unless excluded from adaptation)
        param <- param - lr_t * ratio * update

    `keras.optimizers.Lamb` is not used: its weight decay is applied outside the trust ratio, it
    matches exclusions against the variable's short `.name` (so "LayerNorm" never matches), and
    it adapts every variable.

    Args:
        learning_rate, weight_decay_rate, beta_1, beta_2, epsilon, exclude_from_weight_decay,
        lr_multipliers, name, generator_learning_rate, **kwargs: as `AdamWeightDecay`.
        exclude_from_layer_adaptation: list of regexes whose variables get ratio 1. None (the
            default) uses exclude_from_weight_decay, as TF-Addons; [] adapts every variable.
    """

    def __init__(self, learning_rate, weight_decay_rate: float = WEIGHT_DECAY_RATE,
                 beta_1: float = ADAM_BETA_1, beta_2: float = ADAM_BETA_2,
                 epsilon: float = ADAM_EPSILON,
                 exclude_from_weight_decay: Optional[Sequence[str]] = EXCLUDE_FROM_WEIGHT_DECAY,
                 exclude_from_layer_adaptation: Optional[Sequence[str]] = None,
                 lr_multipliers: LrMultipliers = None, name: Optional[str] = None,
                 generator_learning_rate=None, **kwargs):
        super().__init__(learning_rate, weight_decay_rate=weight_decay_rate, beta_1=beta_1,
                         beta_2=beta_2, epsilon=epsilon,
                         exclude_from_weight_decay=exclude_from_weight_decay,
                         lr_multipliers=lr_multipliers, name=name,
                         generator_learning_rate=generator_learning_rate, **kwargs)
        self.exclude_from_layer_adaptation = (None if exclude_from_layer_adaptation is None
                                              else list(exclude_from_layer_adaptation))

    def use_layer_adaptation(self, variable) -> bool:
        """True if the trust ratio applies to `variable`."""
        patterns = (self.exclude_from_layer_adaptation
                    if self.exclude_from_layer_adaptation is not None
                    else self.exclude_from_weight_decay) or ()
        name = variable_name(variable)
        return not any(re.search(p, name) for p in patterns)

    def _build_slots(self, var_list):
        self._layer_adaptation_flags = tuple(self.use_layer_adaptation(v) for v in var_list)
        self._adam_m, self._adam_v = self.add_optimizer_variables(var_list, ["adam_m", "adam_v"])

    def update_step(self, gradient, variable, learning_rate):
        index = self._get_variable_index(variable)
        dtype = variable.dtype
        next_m, next_v = self._moments(gradient, variable, index)
        t = ops.cast(ops.add(self.iterations, 1), dtype)
        m_hat = ops.divide(next_m, ops.subtract(1.0, ops.power(ops.cast(self.beta_1, dtype), t)))
        v_hat = ops.divide(next_v, ops.subtract(1.0, ops.power(ops.cast(self.beta_2, dtype), t)))
        update = ops.divide(m_hat, ops.add(ops.sqrt(v_hat), ops.cast(self.epsilon, dtype)))
        if self._weight_decay_flags[index]:
            update = ops.add(update, ops.multiply(ops.cast(self.weight_decay_rate, dtype),
                                                  variable))
        ratio = ops.cast(1.0, dtype)
        if self._layer_adaptation_flags[index]:
            w_norm = _l2_norm(variable)
            u_norm = _l2_norm(update)
            # Both branches are evaluated; a 0 norm's inf only ever lands in an unselected one.
            ratio = ops.where(ops.greater(w_norm, 0.0),
                              ops.where(ops.greater(u_norm, 0.0), ops.divide(w_norm, u_norm), 1.0),
                              1.0)
        lr = ops.multiply(ops.cast(self._side_learning_rate(learning_rate, index), dtype),
                          self._lr_multiplier_values[index])
        self.assign_sub(variable, ops.multiply(ops.multiply(lr, ratio), update))

    def get_config(self) -> dict:
        config = super().get_config()
        config["exclude_from_layer_adaptation"] = self.exclude_from_layer_adaptation
        return config


def _l2_norm(x):
    """The Frobenius norm of a whole tensor (tf.norm's default), a scalar."""
    return ops.sqrt(ops.sum(ops.square(x)))
