"""Fine-tuning a pretrained ELECTRA discriminator for sequence classification.

Modules: `config` (FinetuningConfig, official names), `tasks` (GLUE and generic TSV/CSV data),
`encoding` (in-graph text -> features), `model` (encoder + heads, summed loss), `optimization`
(layer-wise learning rates), `pretrained` (starting points), `metrics`, `export` (SavedModel
over raw text) and `runner` (`run(config)`, what run_finetuning.py calls).
"""
