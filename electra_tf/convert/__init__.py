"""Checkpoint conversion: Google's TF1 checkpoints in and out, Hugging Face and keras-hub out.

Command line: `python -m electra_tf.convert {from-google,to-hf,to-keras-hub,to-google} --help`.
All converters pass through the official variable layout (spec section 5.9): see `names.py` for the
mapping to our model, `google.py`, `hf.py` and `keras_hub.py` for the formats, and
docs/conversion.md for commands and measured parity.
"""

from electra_tf.convert.names import ConversionError

__all__ = ["ConversionError"]
