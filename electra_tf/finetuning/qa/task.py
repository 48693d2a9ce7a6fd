"""A QA task (`squad`, `squadv1`, `newsqa`, `naturalqs`, `triviaqa`, `searchqa`) as a
`FinetuningTask`: read (`data.py`), featurise (`features.py`), decode (`decoding.py`), evaluate
(`evaluation.py`) and serve (`serving.py`).

Files written per evaluated trial in `results/<tasks>_qa/` (official names; the last trial's
stay): `<task>_preds.json` {question id: answer text} (`id` for SQuAD, `qid` for MRQA),
`<task>_null_odds.json` {question id: null odds} for SQuAD 2.0, and `<task>_eval.json` (the
metrics; official only for squad, as `squad_eval.json`).

An unlabelled `test.json` / `test.jsonl` (no answers) is decoded against its own questions
(the official code decodes test results against the *dev* questions, QUIRK Q13, fixed) and,
with `write_test_outputs`, written as `<task>_test_preds.json` (+ `<task>_test_null_odds.json`)
beside the dev files (the official overwrites the dev files, QUIRK Q14, fixed) and as
`test_predictions/<task>_test_<trial>_predictions.json` with "" for the questions whose null
odds exceed `qa_na_threshold` (SQuAD 2.0; what a leaderboard submission wants).
"""

from __future__ import annotations

import json
import logging
import os
from typing import TYPE_CHECKING, Dict, Optional

from electra_tf import atomic
from electra_tf.finetuning.qa import evaluation
from electra_tf.finetuning.qa.data import (DEBUG_MRQA_LINES, MRQA_TASKS, QASplit, read_mrqa,
                                           read_squad)
from electra_tf.finetuning.qa.decoding import BasicTokenCache, Decoder, Prediction
from electra_tf.finetuning.qa.features import QAFeatures, featurize
from electra_tf.finetuning.task import (QUESTION_ANSWERING, EvalSet, FeatureSpec, FinetuningTask,
                                        ScoreContext, test_predictions_path)
from electra_tf.finetuning.task_files import DataFileError, task_directory
from electra_tf.config.hparams import ConfigError

if TYPE_CHECKING:  # the run's tokenizer: the in-graph one (TensorFlow) or PortableTokenizer
    from electra_tf.data.text.tokenization import Tokenizer

logger = logging.getLogger("electra_tf")

SPLITS = ("train", "dev", "test")
SQUAD_V1_VERSION = "1.1"
# The prediction files as the official writer leaves them (file order; eval metrics sorted).
_UNSORTED = dict(sort_keys=False, default=str, ensure_ascii=False)
_SORTED = dict(_UNSORTED, sort_keys=True)


class QAEvalPayload:
    """What scoring a split needs: its questions, records' window maps and the decoder."""

    def __init__(self, data: QASplit, features: QAFeatures, decoder: Decoder):
        self.data = data
        self.features = features
        self.decoder = decoder


class QATask(FinetuningTask):
    """SQuAD 1.1 / 2.0 or an MRQA task (see module docstring).

    Args:
        name: official task name.
        config: FinetuningConfig.
        tokenizer: the run's Tokenizer (TensorFlow) or PortableTokenizer (JAX, PyTorch).
    """

    family = QUESTION_ANSWERING

    def __init__(self, name: str, config, tokenizer: Tokenizer):
        super().__init__(name, config)
        if config.max_query_length > config.max_seq_length - 4:
            raise ConfigError(f"max_query_length ({config.max_query_length}) must leave room for "
                              f"the context: at most max_seq_length - 4 = "
                              f"{config.max_seq_length - 4}")
        if config.beam_size > config.max_seq_length:
            raise ConfigError(f"beam_size ({config.beam_size}) must be <= max_seq_length "
                              f"({config.max_seq_length})")
        self.tokenizer = tokenizer
        self.v2 = name == "squad"
        self.mrqa = name in MRQA_TASKS
        self.directory = task_directory(config.raw_data_dir, name)
        self.basic_tokens = BasicTokenCache(tokenizer.do_lower_case, tokenizer.strip_accents)
        self.splits: Dict[str, QASplit] = {}
        for split in SPLITS:
            path = self.split_path(split)
            if os.path.isfile(path):
                self.splits[split] = self._read(path, split)
            elif split == "train":
                raise DataFileError(f"task {name!r}: no {os.path.basename(path)} in {self.directory}")
        if not self.mrqa and "dev" in self.splits:
            self._check_version(self.splits["dev"].path)
        self.features: Dict[str, QAFeatures] = {
            split: featurize(data.examples, tokenizer, config.max_seq_length,
                             config.max_query_length, config.doc_stride, split == "train")
            for split, data in self.splits.items()}

    def split_path(self, split: str) -> str:
        if self.mrqa:
            return os.path.join(self.directory, f"{split}.jsonl")
        suffix = "-debug" if self.config.debug else ""  # official debug files
        return os.path.join(self.directory, f"{split}{suffix}.json")

    def _read(self, path: str, split: str) -> QASplit:
        skip = self.config.skip_bad_answers
        if self.mrqa:
            return read_mrqa(path, split, skip, DEBUG_MRQA_LINES if self.config.debug else None)
        return read_squad(path, split, self.v2, skip)

    def _check_version(self, path: str) -> None:
        if self.name == "squadv1":
            with open(path, encoding="utf-8") as f:
                version = json.load(f).get("version")
            if version != SQUAD_V1_VERSION:
                logger.warning("%s: evaluation expects SQuAD v%s, got version %r (official: a "
                               "warning only)", path, SQUAD_V1_VERSION, version)

    # --- Data ----------------------------------------------------------------------------------
    def feature_specs(self):
        return {key: FeatureSpec((), "int32")
                for key in ("eid", "start_positions", "end_positions", "is_impossible")}

    def train_features(self):
        return self.features["train"].arrays

    def eval_sets(self):
        sets = []
        for split in ("dev", "test"):
            if split not in self.splits:
                continue
            data, features = self.splits[split], self.features[split]
            decoder = Decoder([e.paragraph.words for e in data.examples], features.doc_tokens,
                              features.windows, self.tokenizer.vocab.tokens, self.basic_tokens,
                              self.v2, self.config.joint_prediction,
                              self.config.answerable_classifier, self.config.n_best_size,
                              self.config.max_answer_length)
            labelled = split == "dev"
            sets.append(EvalSet(split, features.arrays, labelled,
                                QAEvalPayload(data, features, decoder)))
        return sets

    def summary(self):
        out = {"family": self.family, "directory": self.directory, "v2": self.v2,
               "format": "mrqa" if self.mrqa else "squad"}
        for split, data in self.splits.items():
            out[split] = len(data.examples)
            out[f"{split}_records"] = len(self.features[split].windows)
            if data.skipped:
                out[f"{split}_skipped_questions"] = len(data.skipped)
        return out

    # --- Model and scoring -----------------------------------------------------------------
    def head_config(self):
        config = self.config
        return {"name": self.name, "family": QUESTION_ANSWERING, "beam_size": config.beam_size,
                "joint_prediction": config.joint_prediction,
                "answerable_classifier": config.answerable_classifier,
                "answerable_uses_start_logits": config.answerable_uses_start_logits,
                "answerable_weight": config.answerable_weight}

    def predictions(self, payload: QAEvalPayload, outputs) -> Dict[str, Prediction]:
        """{question id: Prediction} of a split, in file order."""
        decoded = payload.decoder.decode(outputs, payload.features.arrays["input_ids"])
        return {e.qid: p for e, p in zip(payload.data.examples, decoded)}

    def evaluate(self, data: QASplit, preds: Dict[str, str],
                 null_odds: Optional[Dict[str, float]]) -> Dict[str, float]:
        """The official metrics of predictions against the split's gold answers."""
        if self.v2:
            return evaluation.evaluate_v2(data.gold, preds, null_odds, self.config.qa_na_threshold)
        if self.mrqa:
            return evaluation.evaluate_mrqa(data.gold, preds, skip_no_answer=True)
        return evaluation.evaluate_v1(data.gold, preds)

    def score(self, eval_set: EvalSet, outputs, context: ScoreContext):
        payload: QAEvalPayload = eval_set.payload
        if not eval_set.labelled and not context.write_test_outputs:
            return None
        predictions = self.predictions(payload, outputs)
        preds = {qid: p.text for qid, p in predictions.items()}
        null_odds = {qid: p.null_odds for qid, p in predictions.items()} if self.v2 else None
        qa_dir = os.path.join(context.output_dir, f"{context.tasks_str}_qa")
        prefix = self.name if eval_set.labelled else f"{self.name}_{eval_set.split}"
        # In file order, as the official writer.
        atomic.write_json(os.path.join(qa_dir, f"{prefix}_preds.json"), preds, **_UNSORTED)
        if null_odds is not None:
            atomic.write_json(os.path.join(qa_dir, f"{prefix}_null_odds.json"), null_odds,
                              **_UNSORTED)
        if not eval_set.labelled:
            final = dict(preds)
            if null_odds is not None:
                threshold = self.config.qa_na_threshold
                final = {q: ("" if null_odds[q] > threshold else t) for q, t in preds.items()}
            atomic.write_json(test_predictions_path(context, self.name, eval_set.split, "json"),
                              final, **_UNSORTED)
            return None
        metrics = self.evaluate(payload.data, preds, null_odds)
        atomic.write_json(os.path.join(qa_dir, f"{self.name}_eval.json"), metrics,
                          **_SORTED)
        return metrics

    def serving(self, model):
        # lazy: the export's machinery (finetuning.export, training.export) loads only to export
        from electra_tf.finetuning.qa.serving import qa_serving
        return qa_serving(model, self.name, self.tokenizer, self.config, self.v2)
