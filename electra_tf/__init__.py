"""electra-tf: ELECTRA pretraining in TensorFlow 2 / Keras 3 (see README.md)."""

from electra_tf import onednn as _onednn

# Before any module of the package imports TensorFlow, which reads the switch once (onednn.py).
_onednn.set_default()
