"""Part-of-speech tagging (`pos`) on any CoNLL-style files (an electra-tf task, not official).

Files `raw_data_dir/pos/{train,dev,test}.txt` (or `.conll`), test optional, read as `ner` reads
them (`conll.py`); the tag is in `tagging_label_column` (default the last field; CoNLL-2003's POS
is column 1). A tag is any text ("NN", "PRP$", ":", "-LRB-"). The label set is the sorted set of
the train file's tags; a dev or test tag outside it is an error naming file and line.

Metrics: `accuracy` (x 100, over every word; words cut by the truncation count as wrong) and
`loss` (per tagged word); the predictions go to `results/<tasks>_tagging/` (`conll_task.py`).
Serving: raw text -> tags and words with character offsets. Words are
tokenized as the pretrained model tokenizes (`tagging_cased: null` means true here).
"""

from __future__ import annotations

from electra_tf.finetuning.task import EvalSet, ScoreContext
from electra_tf.finetuning.tagging.conll_task import ConllTaggingTask
from electra_tf.finetuning.tagging.metrics import token_accuracy, word_loss


class PosTask(ConllTaggingTask):
    """Word tagging scored by accuracy (see module docstring).

    Args:
        name: "pos".
        config: FinetuningConfig (`tagging_label_column`).
        pretrained: finetuning.pretrained.Pretrained.
    """

    official_truncation = False  # tag every word whose first sub-token fits
    cased_by_default = True  # as ner: tokenized as the model tokenizes

    def label_set(self):
        return self.train_labels_only()

    def score(self, eval_set: EvalSet, outputs, context: ScoreContext):
        gold = [s.tags for s in eval_set.payload]
        predicted = self.predicted_tags(eval_set, outputs["predictions"], "")
        self.write_predictions(eval_set, predicted, context)
        values = token_accuracy(gold, predicted)
        values["loss"] = word_loss(outputs["loss"], eval_set.features["labels_mask"])
        return values

    def serving(self, model):
        # lazy: TensorFlow is optional here (export is TensorFlow's; training runs on JAX too)
        from electra_tf.finetuning.tagging.serving import tagging_serving
        return tagging_serving(model, self.name, self.tokenizer, self.labels,
                               self.config.max_seq_length, raw_text=True)
