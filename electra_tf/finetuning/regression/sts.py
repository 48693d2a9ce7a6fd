"""STS-B (`sts`): the official reader, targets and scorer (`classification_tasks.STS`).

Files `raw_data_dir/sts/{train,dev,test}.tsv` (GLUE's STS-B; tab-separated, no quoting, so quote
characters are kept literally), header line skipped:

- train/dev: text_a = column -3, text_b = column -2, label = column -1 (GLUE: sentence1,
  sentence2, score; negative indices tolerate extra leading columns);
- test: text_a = -2, text_b = -1, no label (predictions only).

With `double_unordered` (official default) the training set is followed by every pair swapped
(b, a), so it has twice the records.

Target = label / 5 (official `(y - min) / max` with min 0, max 5): "3.800" -> 0.76. A label
that is not a number or lies outside [0, 5] is an error naming the file and line (official: a
crash with no message). Unlike the official reader, which logs and skips a line it cannot build,
a short line is an error too.

Metrics (`metrics.py`): pearson, spearman, mse (on the [0, 1] scale), loss. Test predictions
(`write_test_outputs`) are written as `index<TAB>prediction<TAB>score`: `prediction` is the raw
output on the [0, 1] training scale (what the official code pickles) and `score` = 5 x prediction,
the 0-5 scale a GLUE submission wants.
"""

from __future__ import annotations

import math
import os
from typing import Dict, List, NamedTuple, Optional

import numpy as np

from electra_tf.finetuning.regression.metrics import regression_metrics
from electra_tf.finetuning.task import (EVAL_SPLITS, REGRESSION, EvalSet, FeatureSpec,
                                        FinetuningTask, ScoreContext, test_predictions_path,
                                        write_test_predictions)
from electra_tf.finetuning.task_files import (DEBUG_MAX_LINES, DataFileError, read_rows,
                                              task_directory)

MIN_VALUE, MAX_VALUE = 0.0, 5.0  # official STS range


class PairExample(NamedTuple):
    """One sentence pair.

    Attributes:
        eid: int. Official example id (line index - 1, continuing over the swapped copies).
        text_a, text_b: str.
        label: float or None (test).
        source: str. "file:line".
    """

    eid: int
    text_a: str
    text_b: str
    label: Optional[float]
    source: str


def parse_label(text: str, source: str) -> float:
    """The STS score of a line, checked against [0, 5] (official asserts it)."""
    try:
        value = float(text)
    except ValueError:
        raise DataFileError(f"{source}: label {text!r} is not a number") from None
    if not (MIN_VALUE <= value <= MAX_VALUE) or math.isnan(value):
        raise DataFileError(f"{source}: label {value} is outside the STS range "
                            f"[{MIN_VALUE:g}, {MAX_VALUE:g}]")
    return value


def read_sts(path: str, split: str, max_lines: Optional[int] = None) -> List[PairExample]:
    """Reads an STS-B TSV as the official reader (see module docstring)."""
    rows = read_rows(path, max_lines)[1:]  # header
    test = split == "test"
    needed = 2 if test else 3
    examples = []
    for index, (line, fields) in enumerate(rows):
        source = f"{path}:{line}"
        if len(fields) < needed:
            raise DataFileError(f"{source}: expected at least {needed} tab-separated fields for "
                                f"task 'sts' ({split}), got {len(fields)}")
        if test:
            text_a, text_b, label = fields[-2], fields[-1], None
        else:
            text_a, text_b = fields[-3], fields[-2]
            label = parse_label(fields[-1].strip(), source)
        text_a, text_b = text_a.strip(), text_b.strip()
        for column, text in (("sentence 1", text_a), ("sentence 2", text_b)):
            if not text:
                raise DataFileError(f"{source}: empty {column}")
        examples.append(PairExample(index, text_a, text_b, label, source))
    if not examples:
        raise DataFileError(f"{path}: no examples")
    return examples


def swapped_copies(examples: List[PairExample]) -> List[PairExample]:
    """Official double_unordered: the pairs, then every pair as (b, a) with eids continuing."""
    n = len(examples)
    return examples + [e._replace(eid=n + e.eid, text_a=e.text_b, text_b=e.text_a)
                       for e in examples]


class STSTask(FinetuningTask):
    """STS-B regression (see module docstring).

    Args:
        name: "sts".
        config: FinetuningConfig.
        text_encoder: the run's `encoding.TextEncoder`, or a
            `portable_encoding.PortableTextEncoder` (JAX: no serving).
    """

    family = REGRESSION

    def __init__(self, name: str, config, text_encoder):
        super().__init__(name, config)
        self.text_encoder = text_encoder
        self.directory = task_directory(config.raw_data_dir, name, _STS_DIR_NAMES)
        max_lines = DEBUG_MAX_LINES if config.debug else None
        self.examples: Dict[str, Optional[List[PairExample]]] = {}
        for split in ("train",) + EVAL_SPLITS:
            path = os.path.join(self.directory, f"{split}.tsv")  # GLUE's STS-B names
            path = path if os.path.isfile(path) else None
            if path is None and split == "train":
                raise DataFileError(f"task 'sts': no train.tsv in {self.directory}")
            self.examples[split] = read_sts(path, split, max_lines) if path else None
        if config.double_unordered:
            self.examples["train"] = swapped_copies(self.examples["train"])

    def _encode(self, examples: List[PairExample], labelled: bool) -> Dict[str, np.ndarray]:
        features = self.text_encoder.encode_examples([e.text_a for e in examples],
                                                     [e.text_b for e in examples])
        features["eid"] = np.array([e.eid for e in examples], np.int32)
        if labelled:
            features["targets"] = np.array([(e.label - MIN_VALUE) / MAX_VALUE for e in examples],
                                           np.float32)
        return features

    def feature_specs(self):
        return {"eid": FeatureSpec((), "int32"), "targets": FeatureSpec((), "float32")}

    def train_features(self):
        return self._encode(self.examples["train"], True)

    def eval_sets(self):
        return [EvalSet(split, self._encode(self.examples[split], split != "test"),
                        split != "test", self.examples[split])
                for split in EVAL_SPLITS if self.examples[split]]

    def summary(self):
        return {"family": self.family, "directory": self.directory, "range": [MIN_VALUE, MAX_VALUE],
                **{s: len(self.examples[s] or []) for s in ("train",) + EVAL_SPLITS}}

    def head_config(self):
        return {"name": self.name, "family": REGRESSION}

    def score(self, eval_set: EvalSet, outputs, context: ScoreContext):
        predictions = outputs["predictions"]
        if not eval_set.labelled:
            if context.write_test_outputs:
                path = test_predictions_path(context, self.name, eval_set.split, "tsv")
                write_test_predictions(
                    path, [f"{e.eid}\t{p:.6f}\t{MAX_VALUE * p:.6f}"
                           for e, p in zip(eval_set.payload, predictions)],
                    "index\tprediction\tscore")
            return None
        return regression_metrics(eval_set.features["targets"], predictions, outputs["loss"])

    def serving(self, model):
        def postprocess(outputs):
            predictions = outputs["predictions"]
            return {"predictions": predictions, "scores": MIN_VALUE + MAX_VALUE * predictions}

        # lazy: TensorFlow is optional here (export is TensorFlow's; training runs on JAX too)
        from electra_tf.finetuning.export import sentence_serving

        return sentence_serving(model, self.name, self.text_encoder, True, postprocess)


# The GLUE distribution's spellings of the task directory.
_STS_DIR_NAMES = ("STS-B", "sts-b", "stsb")
