"""Preemption: on SIGTERM, stop at the next step boundary, save, exit with a distinct status.

Preemptible VMs and cluster schedulers (Kubernetes, Slurm, Borg) send SIGTERM and kill the
process a grace period later. A run that only saved every `save_checkpoints_steps` would lose
the steps since; instead the trainer finishes the step under way, saves a checkpoint and ends
with `electra_tf.errors.Preempted` (the tools exit with `cli.EXIT_PREEMPTED`, 42); the same
command then resumes exactly (`checkpointing`).

How the signal reaches a compiled loop: while a `tf.function` of many steps runs, the main
thread is inside TensorFlow and Python signal handlers wait until it returns. So the signal
module's wake-up file descriptor (written by its C-level handler at once) is read by a watcher
thread, which sets a variable that the compiled loop reads before every step
(`StopRequest.agreed`, called in `train_step.make_train_loop`).

Several workers (MultiWorkerMirroredStrategy) must stop at the same step, or the one that stops
leaves the others waiting in a collective: the signal may reach only one of them. The flag is
therefore summed over all replicas before every step (one scalar all-reduce, next to the
gradients' much larger one), so every worker takes the same decision at the same step, then
they save together (the save is collective). This is the agreement TensorFlow's
`PreemptionCheckpointHandler` reaches through the coordination service, and 42 is its default
exit status off Google Cloud; the handler itself is not used because it runs single steps from
Python and adds its own counter to the checkpoint, which would break resuming existing runs.

A second SIGTERM while stopping ends the process at once (the default action).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Optional

import tensorflow as tf

logger = logging.getLogger("electra_tf")


class StopRequest:
    """A stop request set by SIGTERM (or `request()`), agreed across workers.

    Args:
        strategy: the run's tf.distribute strategy.
    """

    def __init__(self, strategy: tf.distribute.Strategy):
        self.strategy = strategy
        # Plain (host) variables, outside the strategy scope: one value per process.
        self.local = tf.Variable(0, dtype=tf.int32, trainable=False, name="stop_requested")
        self.agreed_flag = tf.Variable(0, dtype=tf.int32, trainable=False, name="stop_agreed")
        resolver = getattr(strategy, "cluster_resolver", None)
        spec = resolver.cluster_spec().as_dict() if resolver is not None else {}
        self.multi_worker = sum(len(tasks) for tasks in spec.values()) > 1
        self._watcher: Optional[_SignalWatcher] = None

    # --- Python side ----------------------------------------------------------------------------
    def request(self) -> None:
        """Asks the run to stop before its next step (what SIGTERM does)."""
        self.local.assign(1)

    @property
    def requested(self) -> bool:
        """Whether the stop was agreed (by any worker's request) in the last compiled loop."""
        return bool(self.agreed_flag.numpy())

    def __enter__(self) -> "StopRequest":
        self._watcher = _SignalWatcher.start(self)
        return self

    def __exit__(self, *exc) -> None:
        if self._watcher is not None:
            self._watcher.stop()
            self._watcher = None

    # --- In the compiled loop -------------------------------------------------------------------
    def agreed(self) -> tf.Tensor:
        """bool scalar: stop now. Every worker gets the same answer (see module docstring)."""
        if self.multi_worker:
            per_replica = self.strategy.run(lambda: tf.cast(self.local.read_value(), tf.float32))
            total = self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
            stop = total > 0.0
        else:
            stop = self.local.read_value() > 0
        self.agreed_flag.assign(tf.cast(stop, tf.int32))
        return stop


class _SignalWatcher:
    """Turns SIGTERM into `StopRequest.request()`, also while the main thread is inside
    TensorFlow (a thread reads the signal module's wake-up file descriptor)."""

    def __init__(self, stop: StopRequest):
        self.stop_request = stop
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.write_fd, False)
        self.previous_handler = signal.getsignal(signal.SIGTERM)
        self.previous_fd = -1
        self.received = False
        self.handled = 0
        self.closing = False
        self.thread = threading.Thread(target=self._watch, name="sigterm-watcher", daemon=True)

    @classmethod
    def start(cls, stop: StopRequest) -> Optional["_SignalWatcher"]:
        if threading.current_thread() is not threading.main_thread():
            logger.debug("not in the main thread: SIGTERM is not watched")
            return None
        watcher = cls(stop)
        signal.signal(signal.SIGTERM, watcher._handle)
        watcher.previous_fd = signal.set_wakeup_fd(watcher.write_fd, warn_on_full_buffer=False)
        watcher.thread.start()
        return watcher

    def _handle(self, signum, frame) -> None:
        # Python-level handler: runs once per delivered signal, when the main thread is back in
        # Python (the watcher thread has usually noted the signal already).
        self.handled += 1
        if self.handled > 1:
            # A second SIGTERM while stopping: the sender insists; die as without a handler.
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
        self._note()

    def _note(self) -> None:
        if not self.received:
            self.received = True
            logger.warning("SIGTERM received: stopping at the next step boundary to save a "
                           "checkpoint (a second SIGTERM ends the process at once)")
        self.stop_request.request()

    def _watch(self) -> None:
        while True:
            try:
                data = os.read(self.read_fd, 64)
            except OSError:
                return
            if self.closing or not data:
                return
            if signal.SIGTERM in data:  # one byte per signal: its number
                self._note()

    def stop(self) -> None:
        signal.set_wakeup_fd(self.previous_fd)
        signal.signal(signal.SIGTERM, self.previous_handler)
        self.closing = True
        try:
            os.write(self.write_fd, b"\0")  # wake the thread
        except OSError:
            pass
        self.thread.join(timeout=5)
        os.close(self.write_fd)
        os.close(self.read_fd)
