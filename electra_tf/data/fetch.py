# Moved to electra_tf.sources.fetch; this re-export keeps builder.py / build_pretraining_dataset.py (issue 12's files) working until they import it from there.
from electra_tf.sources.fetch import FetchError, default_data_ready, fetch_default_data  # noqa: F401
