"""Fine-tuning a pretrained ELECTRA discriminator on the official task set.

Modules: `config` (FinetuningConfig, official names), `registry` (task name -> family),
`task` (what a task gives the runner), `task_files` (a task's directory, lines and rows, as
every family reads them); one folder per family: `classification/` (GLUE and generic TSV/CSV),
`regression/` (STS-B), `qa/` (SQuAD 1.1/2.0, MRQA), `tagging/` (CoNLL-2000 chunking; NER and
POS on any CoNLL file); `encoding` (in-graph text -> features), `model` (encoder + heads, summed loss), `optimization`
(layer-wise learning rates), `pretrained` (starting points), `metrics`, `export` (SavedModel
over raw text), `corpus_tasks` (tasks built from a corpus, for tests and docs) and `runner`
(`run(config)`, what run_finetuning.py calls).
"""
