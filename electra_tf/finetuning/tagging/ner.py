"""Named-entity recognition (`ner`) on any CoNLL-style files (an electra-tf task, not official).

Files `raw_data_dir/ner/{train,dev,test}.txt` (or `.conll`), test optional: one word per line,
the word first, its tag in `tagging_label_column` (default the last field: CoNLL-2003's
"word POS chunk NER" works as it is), blank lines between sentences (`conll.py`).

Tags are the `tagging_scheme`'s (`BIO`: O, B-TYPE, I-TYPE; `BIOES`: also E-TYPE, S-TYPE); any
other tag is an error naming its file and line. The model learns the tags as the file writes
them (no re-encoding, unlike chunk); the label set is the sorted set of the train file's tags, and
a dev or test tag outside it is an error naming file and line. It is stored with the export
(`labels.json`), and the serving signature decodes with it.

Metrics: `precision`, `recall`, `f1` (entity level, micro-averaged, x 100: seqeval's
default mode, or its strict mode with `tagging_entity_mode: strict`; `metrics.entity_f1`) and
`loss` (per tagged word); the predictions go to `results/<tasks>_tagging/` (`conll_task.py`).
Serving: raw text -> tags, words and entities with character offsets
(`serving.py`). Words are tokenized as the pretrained model tokenizes (`tagging_cased: null`
means true here; chunk's official default lower-cases everything).
"""

from __future__ import annotations

import functools

from electra_tf.finetuning.task import EvalSet, ScoreContext
from electra_tf.finetuning.tagging.conll_task import ConllTaggingTask
from electra_tf.finetuning.tagging.entities import parse_tag
from electra_tf.finetuning.tagging.metrics import entity_f1, word_loss
from electra_tf.finetuning.tagging.spans import OUTSIDE


class NerTask(ConllTaggingTask):
    """Entity tagging of CoNLL files (see module docstring).

    Args:
        name: "ner".
        config: FinetuningConfig (`tagging_label_column`, `tagging_scheme`,
            `tagging_entity_mode`).
        pretrained: finetuning.pretrained.Pretrained.
    """

    official_truncation = False  # tag every word whose first sub-token fits
    cased_by_default = True  # "Paris" vs "paris": case is evidence of a name

    def tag_checker(self):
        return functools.partial(parse_tag, scheme=self.config.tagging_scheme)

    def label_set(self):
        return self.train_labels_only()

    def score(self, eval_set: EvalSet, outputs, context: ScoreContext):
        gold = [s.tags for s in eval_set.payload]
        predicted = self.predicted_tags(eval_set, outputs["predictions"], OUTSIDE)
        self.write_predictions(eval_set, predicted, context)
        values = entity_f1(gold, predicted, self.config.tagging_scheme,
                           self.config.tagging_entity_mode)
        values["loss"] = word_loss(outputs["loss"], eval_set.features["labels_mask"])
        return values

    def serving(self, model):
        # lazy: TensorFlow is optional here (export is TensorFlow's; training runs on JAX too)
        from electra_tf.finetuning.tagging.serving import EntityDecoder, tagging_serving
        decoder = EntityDecoder(self.labels, self.config.tagging_scheme,
                                self.config.tagging_entity_mode)
        return tagging_serving(model, self.name, self.tokenizer, self.labels,
                               self.config.max_seq_length, raw_text=True, decoder=decoder)
