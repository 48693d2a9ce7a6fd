"""Conventions of the exported SavedModels: TF Hub's reusable SavedModel, TF Serving's layout.

Reusable SavedModel (https://www.tensorflow.org/hub/reusable_saved_models): besides its serving
signatures, an export's root object has
- `__call__(inputs, training=False)`: `inputs` a dict of int32 [batch, seq] `input_ids`,
  `input_mask`, `segment_ids`; traced for `training` False and True (dropout on), so a user can
  fine-tune the loaded model under a `tf.GradientTape`;
- `variables` and `trainable_variables`: lists of the model's variables (the loaded ones, which
  `__call__` reads and an optimizer can update);
- `regularization_losses`: an empty list (ELECTRA uses decoupled weight decay, no loss terms).

TF Serving layout: `export/<network>/<version>/` with a numeric version, the global step of the
exported checkpoint, so `tensorflow_model_server --model_base_path=.../export/discriminator`
serves the newest. `latest_version_dir` finds it for the project's own readers, which accept the
base directory as they did before versions existed.
"""

from __future__ import annotations

import logging
import os
import shutil
from typing import Callable, Iterable, List, Optional

import tensorflow as tf

logger = logging.getLogger("electra_tf")

INPUT_NAMES = ("input_ids", "input_mask", "segment_ids")
SAVED_MODEL_FILE = "saved_model.pb"


def input_specs() -> dict:
    """The `__call__` input structure: int32 [batch, seq] per name."""
    return {name: tf.TensorSpec([None, None], tf.int32, name=name) for name in INPUT_NAMES}


class ReusableModule(tf.Module):
    """A tf.Module saved with TF Hub's reusable attributes (see the module docstring).

    Subclasses define `call(inputs, training) -> dict of tensors` and call `track(layers)` once
    their layers exist.
    """

    # tf.Module computes these on demand; a reusable SavedModel stores them as lists, so they
    # become plain attributes (saved as children of the root object).
    variables = None
    trainable_variables = None

    def track(self, layers: Iterable) -> None:
        """Records the variables of `layers` (each once, in order) and the empty loss list."""
        seen, all_vars, trainable = set(), [], []
        for layer in layers:
            for variable in layer.variables:
                if id(variable) in seen:
                    continue
                seen.add(id(variable))
                all_vars.append(variable)
                if variable.trainable:
                    trainable.append(variable)
        self.variables = all_vars
        self.trainable_variables = trainable
        self.regularization_losses = []

    @tf.function
    def __call__(self, inputs, training=False):
        return self.call(inputs, training)

    def call(self, inputs, training):
        raise NotImplementedError

    def trace_call(self) -> None:
        """Traces `__call__` for training False and True, so both are saved."""
        for training in (False, True):
            self.__call__.get_concrete_function(input_specs(), training=training)


def version_dirs(base: str) -> List[int]:
    """The numeric version subdirectories of `base` holding a SavedModel, ascending."""
    try:
        names = os.listdir(base)
    except OSError:
        return []
    return sorted(int(name) for name in names if name.isdigit()
                  and os.path.isfile(os.path.join(base, name, SAVED_MODEL_FILE)))


def latest_version_dir(path: str) -> Optional[str]:
    """`path` itself if it is a SavedModel, else its newest numeric version, else None."""
    if os.path.isfile(os.path.join(path, SAVED_MODEL_FILE)):
        return path
    versions = version_dirs(path)
    return os.path.join(path, str(versions[-1])) if versions else None


def save_version(save: Callable, module, signatures: dict, base: str, step: int,
                 extra_files: dict) -> str:
    """Saves `module` as `base/<step>` with `save(module, signatures, target, extra_files)` (an
    atomic writer), then removes the other versions in `base` and, from exports made before
    versions existed, a SavedModel directly in `base`. Returns the version folder."""
    target = os.path.join(base, str(int(step)))
    os.makedirs(base, exist_ok=True)
    save(module, signatures, target, extra_files)
    for version in version_dirs(base):
        if version != int(step):
            shutil.rmtree(os.path.join(base, str(version)), ignore_errors=True)
    _remove_unversioned(base)
    logger.info("exported %s", target)
    return target


def _remove_unversioned(base: str) -> None:
    """An older electra-tf wrote the SavedModel into `base` itself: its files go once a
    versioned export sits beside them (anything else in `base` is left alone)."""
    if not os.path.isfile(os.path.join(base, SAVED_MODEL_FILE)):
        return
    for name in (SAVED_MODEL_FILE, "fingerprint.pb", "variables", "assets", "assets.extra"):
        path = os.path.join(base, name)
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.exists(path):
            os.remove(path)
