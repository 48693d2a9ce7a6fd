"""The dataset on disk and read back: TFRecord framing and parsing, the manifest, integrity checks, the data order and the input pipelines (tf.data and TensorFlow-free)."""
