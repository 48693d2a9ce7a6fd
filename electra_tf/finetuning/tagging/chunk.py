"""Chunking (`chunk`, official `tagging_tasks.Chunking`) as a `FinetuningTask`.

Files `raw_data_dir/chunk/{train,dev,test}.txt` in the CoNLL-2000 layout (`conll.py`,
`conll_task.py`); the test file is optional. Each sentence's tags are turned into spans and
re-encoded as BIOES (`spans.py`; official `is_token_level = False`). The label set is the sorted
union of the BIOES tags of the train, dev and test files that exist (official; index = sorted
rank). The official code pickles it on first use and reloads the pickle without any check
(QUIRK Q12: a stale mapping after the data changed); electra-tf recomputes it every run and
stores it in the export (`labels.json`).

Metrics: `precision`, `recall`, `f1`, `loss` (`metrics.span_f1`: the official span rules, words
cut by the truncation invisible, as officially).
"""

from __future__ import annotations

from electra_tf.finetuning.task import EvalSet, ScoreContext
from electra_tf.finetuning.tagging.conll import check_chunk_tag
from electra_tf.finetuning.tagging.conll_task import ConllTaggingTask
from electra_tf.finetuning.tagging.metrics import span_f1
from electra_tf.finetuning.tagging.spans import to_bioes


class ChunkingTask(ConllTaggingTask):
    """CoNLL-2000 chunking (see module docstring).

    Args:
        name: "chunk".
        config: FinetuningConfig.
        pretrained: finetuning.pretrained.Pretrained (vocab; casing with `tagging_cased`).
    """

    def tag_checker(self):
        return check_chunk_tag

    def encode(self, tags):
        return to_bioes(tags)

    def label_set(self):
        return tuple(sorted({tag for rows in self.encoded.values() for row in rows
                             for tag in row}))

    def score(self, eval_set: EvalSet, outputs, context: ScoreContext):
        features = eval_set.features
        return span_f1(features["labels"], outputs["predictions"], features["labels_mask"],
                       outputs["loss"], self.labels, self.config.legacy_tagging_loss)

    def serving(self, model):
        # lazy: TensorFlow is optional here (export is TensorFlow's; training runs on JAX too)
        from electra_tf.finetuning.tagging.serving import tagging_serving
        return tagging_serving(model, self.name, self.tokenizer, self.labels,
                               self.config.max_seq_length)
