"""The TensorFlow backend of a pretraining run: tf.distribute, the compiled step, tf.train checkpoints, SavedModel export."""
