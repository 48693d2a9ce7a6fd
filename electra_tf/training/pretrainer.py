"""`ElectraPretrainer`: the pretraining model with Keras' `compile()` / `fit()` / `evaluate()`.

The model itself (`pretraining.pretrainer.PretrainingModel`: masking, generator, sampling,
discriminator, the joint loss) knows nothing of training. This subclass adds Keras' training
hooks, which run this project's step: `keras_fit` on TensorFlow (`train_step.apply_or_skip`, the
step `run_pretraining.py` compiles) and `portable_fit` on JAX and PyTorch. It lives in training/
because those steps do: dependencies point one way (docs/design.md), so the model's package
never imports the loop.

It is the class users build (`ElectraPretrainer.from_pretraining_config(config, special)`, or
from the constructor arguments of `PretrainingModel`), the class every trainer, loader and
converter builds, and the Keras name of saved models (`electra_tf>ElectraPretrainer`).
"""

from __future__ import annotations

import keras

from electra_tf.pretraining.model import PretrainingModel
from electra_tf.training import step_pieces
from electra_tf.training.portable import fit as portable_fit


@keras.saving.register_keras_serializable(package="electra_tf")
class ElectraPretrainer(PretrainingModel):
    """`PretrainingModel` trained by Keras: `model.compile(optimizer=...)` then
    `model.fit(dataset)` / `model.evaluate(dataset)` run the trainer's step and report `loss` and
    the official metrics. Arguments, call and outputs are `PretrainingModel`'s.
    """

    _fit_state = None  # compile(): the Keras training state (keras_fit / step_pieces.FitState)

    def compile(self, optimizer, *, gradient_accumulation_steps: int = 1, jit_compile: bool = False,
                disc_auc_include_padding: bool = False, skip_nonfinite: bool = False, **kwargs):
        """Prepares `fit()` / `evaluate()` with the official objective, update and metrics.

        Args:
            optimizer: a Keras optimizer; the official one is `AdamWeightDecay` with
                `WarmupPolynomialDecay` (`training.optimization.create_optimizer(config)`), and
                under several tf.distribute replicas it must be `AdamWeightDecay` or `Lamb`.
                Gradients are summed over replicas and clipped at global norm 1.0 before it
                (official). On JAX and PyTorch the step is `training.portable_fit`'s. A
                decoupled optimizer (one with a `generator_learning_rate`,
                `decoupled_optimizers`) is given `generator_variables()` as its generator side
                unless it has them already.
            gradient_accumulation_steps: int k. Each batch runs as k micro-batches with the
                update of the whole batch (`training.accumulation`); its size must divide.
            jit_compile: bool. TensorFlow: XLA-compile the forward-backward pass (the
                `jit_compile` hparam; Keras' own whole-step compilation is not used there: it
                would change the random draws). JAX always compiles the whole step; PyTorch
                runs eagerly (True asks Keras for torch.compile).
            disc_auc_include_padding: bool. The official disc_auc counting padding
                (`PretrainingMetrics`).
            skip_nonfinite: bool. JAX / PyTorch: a step whose loss or gradient norm is not
                finite applies no update and no metrics and is counted (`FitState.skipped`);
                the pretraining run's `max_skipped_nonfinite_steps`. TensorFlow's `fit()`
                applies every step (its custom loop skips: `train_step.apply_or_skip`).
            **kwargs: `run_eagerly`, `steps_per_execution`, `auto_scale_loss` for Keras. The
                loss and metrics are the objective's own: `loss`, `metrics` and the like are
                refused. `steps_per_execution` k > 1: on JAX the k steps are one compiled call
                (`portable_fit.jax_train_function`: a scan over k stacked batches, the
                metrics' results read once per call); Keras' PyTorch backend allows 1 only.

        Raises:
            ValueError: a loss or metrics given, or an optimizer that cannot be used here.
        """
        given = sorted(k for k in ("loss", "loss_weights", "metrics", "weighted_metrics")
                       if kwargs.get(k) is not None)
        if given:
            raise ValueError(f"ElectraPretrainer.compile: {', '.join(given)} not accepted; the "
                             "objective defines the losses and the official metrics")
        unknown = sorted(set(kwargs) - {"run_eagerly", "steps_per_execution", "auto_scale_loss",
                                        "loss", "loss_weights", "metrics", "weighted_metrics"})
        if unknown:
            raise TypeError(f"ElectraPretrainer.compile: unexpected argument(s) {', '.join(unknown)}")
        kwargs = {k: v for k, v in kwargs.items() if v is not None}
        if keras.backend.backend() == "tensorflow":
            if skip_nonfinite:
                raise ValueError("ElectraPretrainer.compile: skip_nonfinite is for the JAX and "
                                 "PyTorch backends (TensorFlow's trainer loop skips itself)")
            keras_fit = _keras_fit()
            super().compile(optimizer=optimizer, jit_compile=False, **kwargs)
            self._fit_state = keras_fit.compile_state(self, gradient_accumulation_steps,
                                                      jit_compile, disc_auc_include_padding)
            return
        if keras.backend.backend() == "torch" and kwargs.get("steps_per_execution", 1) != 1:
            raise ValueError(f"ElectraPretrainer.compile: steps_per_execution must be 1 on the "
                             f"PyTorch backend (Keras runs its steps one by one there), got "
                             f"{kwargs['steps_per_execution']}")
        # JAX: Keras jits the whole step (`jit_compile`); PyTorch runs eagerly.
        super().compile(optimizer=optimizer,
                        jit_compile=jit_compile or keras.backend.backend() == "jax", **kwargs)
        self._fit_state = step_pieces.compile_state(self, gradient_accumulation_steps,
                                                     disc_auc_include_padding, skip_nonfinite)

    def train_step(self, *args):
        # TensorFlow and PyTorch: train_step(data); JAX: train_step(state, data).
        state = self._compiled_state()
        backend = keras.backend.backend()
        if backend == "tensorflow":
            return _keras_fit().fit_train_step(state, *args)
        step = portable_fit.jax_train_step if backend == "jax" else portable_fit.torch_train_step
        return step(self, state, *args)

    def make_train_function(self, force=False):
        # JAX with steps_per_execution k > 1: k steps in one compiled call (Keras' own calls its
        # jitted step k times from Python).
        if (keras.backend.backend() != "jax" or self.steps_per_execution <= 1
                or self.run_eagerly or not self.jit_compile):
            return super().make_train_function(force=force)
        if self.train_function is None or force:
            self.train_function = portable_fit.jax_train_function(
                self, self._compiled_state(), self.steps_per_execution)
        return self.train_function

    def evaluate(self, *args, **kwargs):
        # Keras' JAX loop with steps_per_execution k takes k batches per call whatever `steps`
        # says (past it when k does not divide it): evaluation runs one batch per call.
        if keras.backend.backend() != "jax" or self.steps_per_execution <= 1:
            return super().evaluate(*args, **kwargs)
        steps_per_execution, self.steps_per_execution = self.steps_per_execution, 1
        try:
            return super().evaluate(*args, **kwargs)
        finally:
            self.steps_per_execution = steps_per_execution

    def test_step(self, *args):
        state = self._compiled_state()
        backend = keras.backend.backend()
        if backend == "tensorflow":
            return _keras_fit().fit_test_step(state, self, *args)
        step = portable_fit.jax_test_step if backend == "jax" else portable_fit.torch_test_step
        return step(self, state, *args)

    @property
    def metrics(self):
        return [] if self._fit_state is None else self._fit_state.all_metrics

    def reset_metrics(self):
        if self._fit_state is None:
            return
        if keras.backend.backend() == "tensorflow":
            _keras_fit().reset(self._fit_state)
            return
        for metric in self._fit_state.all_metrics:
            metric.reset_state()

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        # Keras (TF backend) builds a model created under a strategy by drawing a batch from
        # fit()'s or evaluate()'s iterator, which then trains from the SECOND batch (and the
        # data order is no longer run_pretraining.py's). compile() has built the model and the
        # optimizer already, and the objective has no compiled loss or metrics to build.
        if self._fit_state is not None and self.built and self.optimizer.built:
            return
        super()._maybe_symbolic_build(iterator=iterator, data_batch=data_batch)

    def _compiled_state(self):
        if self._fit_state is None:
            raise RuntimeError("call compile(optimizer=...) before fit() or evaluate()")
        return self._fit_state


def _keras_fit():
    """training/tf/keras_fit.py, imported on the TensorFlow backend only: it imports TensorFlow,
    which the JAX and PyTorch paths must not need."""
    from electra_tf.training.tf import keras_fit  # lazy: it imports TensorFlow

    return keras_fit
