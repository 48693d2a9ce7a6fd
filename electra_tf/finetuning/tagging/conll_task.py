"""What every CoNLL tagging task (`chunk`, `ner`, `pos`) shares: files, tokenizer, features.

Files `raw_data_dir/<task>/{train,dev,test}.txt` (or `.conll`; not both), test optional, read by
`conll.read_conll` with the tag in `tagging_label_column`. A subclass says how a file's tags are
checked (`tag_checker`), encoded as training labels (`encode`) and which label set it learns
(`label_set`), and scores a split (`score`).

Evaluated splits: dev, and test when the file exists (CoNLL test files are tagged); neither is a
warning that nothing will be scored (training alone, for the export, is a use of its own), or an
error when the run does not train. With `debug`, each file is read up to its 101st sentence
(official).

ner and pos write each evaluated split's predictions to
`results/<tasks>_tagging/<task>_<split>_<trial>.txt`: one "word gold predicted" line per word
(tab-separated), a blank line after each sentence (the input conlleval reads); cut words are
predicted as scored ("O" for ner, "" for pos).
"""

from __future__ import annotations

import logging
import os
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from electra_tf import atomic
from electra_tf.finetuning.portable_encoding import backend_tokenizer
from electra_tf.finetuning.task import EvalSet, FeatureSpec, FinetuningTask, ScoreContext, TAGGING
from electra_tf.finetuning.tagging import features as features_lib
from electra_tf.finetuning.tagging.conll import DEBUG_MAX_SENTENCES, Sentence, read_conll
from electra_tf.finetuning.task_files import DataFileError, split_files, task_directory

logger = logging.getLogger("electra_tf")

SPLITS = ("train", "dev", "test")
EXTENSIONS = (".txt", ".conll")


def split_file(directory: str, split: str) -> Optional[str]:
    """`<split>.txt` or `<split>.conll` in `directory`, None if neither.

    Raises:
        DataFileError: both exist (which one is meant is unclear).
    """
    found = split_files(directory, split, EXTENSIONS)
    if len(found) > 1:
        raise DataFileError(f"{found[0]} and {found[1]} both exist: keep one")
    return found[0] if found else None


class ConllTaggingTask(FinetuningTask):
    """A word-tagging task over CoNLL files (see module docstring).

    Args:
        name: str. The task name (its directory's).
        config: FinetuningConfig.
        pretrained: finetuning.pretrained.Pretrained (vocab; casing with `tagging_cased`).
    """

    family = TAGGING
    official_truncation = True  # chunk: the official rule; ner, pos: every word that fits
    # Casing when `tagging_cased` is null: True follows the model, False lower-cases (official).
    cased_by_default = False

    def __init__(self, name: str, config, pretrained):
        super().__init__(name, config)
        self.directory = task_directory(config.raw_data_dir, name)
        cased = (self.cased_by_default if config.tagging_cased is None
                 else config.tagging_cased)
        # In-graph on TensorFlow (serving runs it), TF-free elsewhere: the same ids.
        self.tokenizer = backend_tokenizer(
            pretrained.vocab,
            do_lower_case=pretrained.do_lower_case if cased else True,
            strip_accents=pretrained.strip_accents if cased else True)
        max_sentences = DEBUG_MAX_SENTENCES if config.debug else None
        self.sentences: Dict[str, List[Sentence]] = {}
        for split in SPLITS:
            path = split_file(self.directory, split)
            if path is not None:
                self.sentences[split] = read_conll(
                    path, max_sentences, config.flush_last_sentence,
                    config.tagging_label_column, self.tag_checker())
            elif split == "train":
                raise DataFileError(f"task {name!r}: no train.txt (or train.conll) in "
                                    f"{self.directory}")
        self._check_evaluated(config)
        self.encoded = {split: [self.encode(s.tags) for s in sentences]
                        for split, sentences in self.sentences.items()}
        self.labels = self.label_set()
        self._label_ids = {label: i for i, label in enumerate(self.labels)}
        special = pretrained.vocab.special
        self.cls_id, self.sep_id = special.cls_id, special.sep_id

    def _check_evaluated(self, config) -> None:
        """Without a dev or test file nothing is scored: a warning when the run trains (training
        on every labelled sentence, for the export, is a use of its own), an error when
        evaluating is all it would do.

        Raises:
            DataFileError: do_train is false and there is nothing to evaluate.
        """
        if not config.do_eval or "dev" in self.sentences or "test" in self.sentences:
            return
        missing = f"no dev.txt or test.txt (or .conll) in {self.directory}"
        if not config.do_train:
            raise DataFileError(f"task {self.name!r}: {missing} and do_train is false: nothing "
                                "to do (add a dev file to evaluate)")
        logger.warning("task %r: %s: it trains%s but reports no metric; add a dev file to "
                       "evaluate it", self.name, missing,
                       " and exports" if config.do_export else "")

    # --- What a task decides ------------------------------------------------------------------
    def tag_checker(self) -> Optional[Callable[[str], None]]:
        """A function raising spans.TagError on a tag this task refuses (None: any tag)."""
        return None

    def encode(self, tags: Sequence[str]) -> List[str]:
        """The training labels of one sentence's file tags (default: the tags as they are)."""
        return list(tags)

    def label_set(self) -> tuple:
        """Label names in id order."""
        raise NotImplementedError

    def train_labels_only(self) -> tuple:
        """The sorted labels of the train file; a dev/test label outside them is an error naming
        its file and line (the model cannot predict it, so scores would mislead)."""
        labels = tuple(sorted({t for row in self.encoded["train"] for t in row}))
        known = set(labels)
        for split in ("dev", "test"):
            for sentence in self.sentences.get(split, []):
                for tag, line in zip(sentence.tags, sentence.lines):
                    if tag not in known:
                        train = self.sentences["train"][0].path
                        raise DataFileError(
                            f"{sentence.path}:{line}: label {tag!r} does not occur in the "
                            f"training file {train}, whose labels are the model's "
                            f"({', '.join(labels)})")
        return labels

    # --- Features ------------------------------------------------------------------------------
    def _features(self, split: str) -> Dict[str, np.ndarray]:
        sentences = self.sentences[split]
        pieces = features_lib.word_pieces(self.tokenizer, [s.words for s in sentences])
        labels = [[self._label_ids[t] for t in tags] for tags in self.encoded[split]]
        features = features_lib.featurize(pieces, labels, self.config.max_seq_length,
                                          self.cls_id, self.sep_id, self.official_truncation)
        features["eid"] = np.arange(len(sentences), dtype=np.int32)
        return features

    def feature_specs(self):
        row = (self.config.max_seq_length,)
        return {"eid": FeatureSpec((), "int32"), "labels": FeatureSpec(row, "int32"),
                "labels_mask": FeatureSpec(row, "float32"),
                "labeled_positions": FeatureSpec(row, "int32")}

    def train_features(self):
        return self._features("train")

    def eval_sets(self):
        return [EvalSet(split, self._features(split), True, self.sentences[split])
                for split in ("dev", "test") if split in self.sentences]

    def summary(self):
        counts = {split: len(self.sentences.get(split, [])) for split in SPLITS}
        words = {f"{split}_words": sum(len(s.words) for s in self.sentences.get(split, []))
                 for split in SPLITS}
        return {"family": self.family, "directory": self.directory, "labels": list(self.labels),
                "lower_case": self.tokenizer.do_lower_case, **counts, **words}

    def head_config(self):
        return {"name": self.name, "family": TAGGING, "num_labels": len(self.labels)}

    # --- Scoring helpers -----------------------------------------------------------------------
    def predicted_tags(self, eval_set: EvalSet, predictions: np.ndarray,
                       cut: str) -> List[List[str]]:
        """Each sentence's predicted labels, `cut` for its words cut by the truncation (so they
        count against the model; a warning says how many sentences lost words)."""
        masks = eval_set.features["labels_mask"]
        out, short = [], 0
        for sentence, row, mask in zip(eval_set.payload, predictions, masks):
            n = int(round(float(np.sum(mask))))
            short += n < len(sentence.words)
            out.append([self.labels[i] for i in row[:n]] + [cut] * (len(sentence.words) - n))
        if short:
            logger.warning("%s %s: %d of %d sentences are longer than max_seq_length %d allows; "
                           "their cut words are scored as predicted %r", self.name,
                           eval_set.split, short, len(out), self.config.max_seq_length, cut)
        return out

    def write_predictions(self, eval_set: EvalSet, predicted: List[List[str]],
                          context: Optional[ScoreContext]) -> Optional[str]:
        """Writes `predicted` beside the words and gold tags (module docstring); returns the path
        (None without a context)."""
        if context is None:
            return None
        path = os.path.join(context.output_dir, f"{context.tasks_str}_tagging",
                            f"{self.name}_{eval_set.split}_{context.trial}.txt")
        lines = []
        for sentence, tags in zip(eval_set.payload, predicted):
            lines += [f"{w}\t{g}\t{p}\n" for w, g, p in zip(sentence.words, sentence.tags, tags)]
            lines.append("\n")
        atomic.write_text(path, "".join(lines))
        return path
