"""The JAX / PyTorch backend of a pretraining run (no TensorFlow imported): the step, npz checkpoints, resume, several hosts, TensorBoard files."""
