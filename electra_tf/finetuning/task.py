"""What one fine-tuning task gives the runner: features, a head, a scorer and serving signatures.

Official `finetune/task.py` has one `Task` class per family with `get_examples`, `featurize`,
`get_feature_specs`, `get_prediction_module` and `get_scorer`. Here a task object (one per name in
`task_names`) holds its examples and features after `load()`, and the runner only ever sees:

- `feature_specs()`: the task's own per-example features besides the shared `input_ids`,
  `input_mask`, `segment_ids` (e.g. `label_ids`, or QA's `start_positions`). In the training
  table they are named `<task>_<key>` (official) and are zeros in the other tasks' records.
- `train_features()` and `eval_sets()`: numpy features, int32 [n, max_seq_length] for the shared
  ones.
- `head_config()`: the JSON-able arguments of the task's Keras head (`model.make_head`).
- `score()`: the official metrics of one evaluated split from the head's outputs, writing any
  prediction files.
- `serving()`: the raw-text serving functions of the exported SavedModel.

Unlabelled splits' predictions go to `test_predictions_path` (official file names). A family is
one folder (its `__init__` names its official tasks and builds its task) and one line in
`registry.FAMILIES`.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, NamedTuple, Optional

import numpy as np
from keras import ops

from electra_tf import atomic

SHARED_FEATURES = ("input_ids", "input_mask", "segment_ids")
EVAL_SPLITS = ("dev", "test")
TEST_PREDICTIONS_DIR = "test_predictions"
CLASSIFICATION, REGRESSION, QUESTION_ANSWERING, TAGGING = (
    "classification", "regression", "qa", "tagging")


class FeatureSpec(NamedTuple):
    """One per-example feature of a task.

    Attributes:
        shape: tuple of int. Per-example shape ([] for a scalar, [max_seq_length] for a row).
        dtype: numpy dtype name, "int32" or "float32".
    """

    shape: tuple
    dtype: str


class EvalSet(NamedTuple):
    """One split to predict and score.

    Attributes:
        split: "dev" or "test".
        features: {name: numpy [n, ...]}: the shared features plus the task's own (unprefixed).
        labelled: bool. Whether it can be scored (else it is only predicted).
        payload: what the task needs to score it (examples, window maps, ...).
    """

    split: str
    features: Dict[str, np.ndarray]
    labelled: bool
    payload: Any = None


class ScoreContext(NamedTuple):
    """Where and whether a scorer writes prediction files.

    Attributes:
        output_dir: str. The run's results directory (official `results/`).
        trial: int. 1-based trial number.
        write_test_outputs: bool. Write predictions of unlabelled splits (official flag, already
            limited to the first `n_writes_test` trials by the runner).
        tasks_str: str. The comma-joined task names (official file-name prefix).
    """

    output_dir: str
    trial: int
    write_test_outputs: bool
    tasks_str: str


class FinetuningTask:
    """Base class of the task families (see the module docstring).

    Args:
        name: str. The task name (an official name, or a generic classification task's name).
        config: FinetuningConfig.
    """

    family: str = ""

    def __init__(self, name: str, config):
        self.name = name
        self.config = config

    # --- Data ----------------------------------------------------------------------------------
    def feature_specs(self) -> Dict[str, FeatureSpec]:
        raise NotImplementedError

    def train_features(self) -> Optional[Dict[str, np.ndarray]]:
        """Training features (shared + own), or None when there is no training data."""
        raise NotImplementedError

    def eval_sets(self) -> List[EvalSet]:
        raise NotImplementedError

    def summary(self) -> dict:
        """Counts and settings for the results file."""
        raise NotImplementedError

    # --- Model and scoring -----------------------------------------------------------------
    def head_config(self) -> dict:
        raise NotImplementedError

    def score(self, eval_set: EvalSet, outputs: Dict[str, np.ndarray],
              context: ScoreContext) -> Optional[Dict[str, float]]:
        """Official metrics of a labelled split (None for an unlabelled one); may write files."""
        raise NotImplementedError

    # --- Export ----------------------------------------------------------------------------
    labels: Optional[tuple] = None  # label names in id order (classification, tagging)

    def serving(self, model):
        """An `export.TaskServing` with this task's signatures over `model` (FinetuningModel)."""
        raise NotImplementedError


def prefixed(task_name: str, features: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """Shared features as they are, a task's own ones as `<task>_<key>` (official naming)."""
    return {(k if k in SHARED_FEATURES else f"{task_name}_{k}"): v for k, v in features.items()}


def feature_or_zeros(features: Dict[str, Any], key: str, like, dtype):
    """`features[key]`, or zeros [batch] of `dtype` when a record set does not carry it (serving,
    unlabelled splits); `like` is any [batch, ...] tensor. keras.ops: every backend."""
    if key in features:
        return ops.cast(features[key], dtype)
    return ops.zeros(ops.shape(like)[:1], dtype)


def test_predictions_path(context: ScoreContext, task: str, split: str, extension: str) -> str:
    """Official `test_predictions/<task>_<split>_<trial>_predictions` (with our extension)."""
    return os.path.join(context.output_dir, TEST_PREDICTIONS_DIR,
                        f"{task}_{split}_{context.trial}_predictions.{extension}")


def write_test_predictions(path: str, rows: List[str], header: str) -> str:
    """Writes `header` and `rows` (one line each) to `path` atomically; returns path."""
    atomic.write_text(path, header + "\n" + "".join(row + "\n" for row in rows))
    return path
