"""Text and tokenization: corpus files to document lines, and document lines to token ids (in-graph and TensorFlow-free)."""
