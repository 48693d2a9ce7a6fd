"""Regression fine-tuning (official `RegressionTask`; the GLUE task `sts`, STS-B).

Modules: `sts` (the reader and the task), `head` (dropout -> dense(1), squared error),
`metrics` (Pearson, Spearman, MSE as the official `RegressionScorer`).
"""
