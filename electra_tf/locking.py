"""Exclusive advisory locks on the directories a process writes (placeholder, see below)."""

LOCK_NAME = ".electra_tf.lock"
