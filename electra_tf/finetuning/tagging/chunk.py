"""Chunking (`chunk`, official `tagging_tasks.Chunking`) as a `FinetuningTask`.

Files `raw_data_dir/chunk/{train,dev,test}.txt` in the CoNLL-2000 layout (`conll.py`); the test
file is optional. Each sentence's tags are turned into spans and re-encoded as BIOES
(`spans.py`; official `is_token_level = False`). The label set is the sorted union of the BIOES
tags of the train, dev and test files that exist (official; index = sorted rank). The official
code pickles it on first use and reloads the pickle without any check (QUIRK Q12: a stale
mapping after the data changed); electra-tf recomputes it every run and stores it in the export
(`labels.json`).

Evaluated splits: dev, and test when the file exists (CoNLL test files are tagged). Metrics:
`precision`, `recall`, `f1`, `loss` (`metrics.py`). With `debug`, each file is read up to its
101st sentence (official).
"""

from __future__ import annotations

import os
from typing import Dict, List

import numpy as np

from electra_tf.data.tokenization import Tokenizer
from electra_tf.finetuning.task import EvalSet, FeatureSpec, FinetuningTask, ScoreContext, TAGGING
from electra_tf.finetuning.tagging import features as features_lib
from electra_tf.finetuning.tagging.conll import DEBUG_MAX_SENTENCES, Sentence, read_conll
from electra_tf.finetuning.tagging.metrics import span_f1
from electra_tf.finetuning.tagging.spans import to_bioes
from electra_tf.finetuning.task_files import DataFileError, task_directory

SPLITS = ("train", "dev", "test")


class ChunkingTask(FinetuningTask):
    """CoNLL-2000 chunking (see module docstring).

    Args:
        name: "chunk".
        config: FinetuningConfig.
        pretrained: finetuning.pretrained.Pretrained (vocab; casing with `tagging_cased`).
    """

    family = TAGGING

    def __init__(self, name: str, config, pretrained):
        super().__init__(name, config)
        self.directory = task_directory(config.raw_data_dir, name)
        cased = config.tagging_cased
        self.tokenizer = Tokenizer(
            pretrained.vocab,
            do_lower_case=pretrained.do_lower_case if cased else True,
            strip_accents=pretrained.strip_accents if cased else True)
        max_sentences = DEBUG_MAX_SENTENCES if config.debug else None
        self.sentences: Dict[str, List[Sentence]] = {}
        for split in SPLITS:
            path = os.path.join(self.directory, f"{split}.txt")
            if os.path.isfile(path):
                self.sentences[split] = read_conll(path, max_sentences, config.flush_last_sentence)
            elif split == "train":
                raise DataFileError(f"task {name!r}: no train.txt in {self.directory}")
        self.bioes = {split: [to_bioes(s.tags) for s in sentences]
                      for split, sentences in self.sentences.items()}
        self.labels = tuple(sorted({tag for tags in self.bioes.values() for row in tags
                                    for tag in row}))
        self._label_ids = {label: i for i, label in enumerate(self.labels)}
        special = pretrained.vocab.special
        self.cls_id, self.sep_id = special.cls_id, special.sep_id

    def _features(self, split: str) -> Dict[str, np.ndarray]:
        sentences = self.sentences[split]
        pieces = features_lib.word_pieces(self.tokenizer, [s.words for s in sentences])
        labels = [[self._label_ids[t] for t in tags] for tags in self.bioes[split]]
        features = features_lib.featurize(pieces, labels, self.config.max_seq_length,
                                          self.cls_id, self.sep_id)
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

    def score(self, eval_set: EvalSet, outputs, context: ScoreContext):
        features = eval_set.features
        return span_f1(features["labels"], outputs["predictions"], features["labels_mask"],
                       outputs["loss"], self.labels, self.config.legacy_tagging_loss)

    def serving(self, model):
        from electra_tf.finetuning.tagging.serving import tagging_serving
        return tagging_serving(model, self.name, self.tokenizer, self.labels,
                               self.config.max_seq_length)
