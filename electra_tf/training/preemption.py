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

Every phase of a run stops cleanly, not only training (`trainer.run` watches SIGTERM from its
start, `SigtermWatch`): a SIGTERM before the trainer is set up is kept and stops it at its first
step boundary; the evaluation loop reads the same flag before every batch; the export, written
to a staging directory, is abandoned at once (`interruptible`: the staging directory is removed)
and nothing else was changed. Each ends with `Preempted`; rerunning the same command redoes the
phase.

A second SIGTERM while stopping ends the process at once (the default action).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from typing import Iterator, List, Optional

logger = logging.getLogger("electra_tf")


class Interrupted(BaseException):
    """Raised in the main thread by SIGTERM inside an `interruptible` block (an export being
    written). A BaseException, so that no `except Exception` on the way swallows it; the
    trainer turns it into `Preempted`."""


class _WatchedStop:
    """What every stop request shares: joining the process's `SigtermWatch` for a block."""

    def __init__(self):
        self._watch: Optional[SigtermWatch] = None
        self._own_watch = False
        self._depth = 0

    def request(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def __enter__(self):
        if self._depth == 0:
            self._own_watch = SigtermWatch.current is None
            self._watch = SigtermWatch().__enter__() if self._own_watch else SigtermWatch.current
            if self._watch is not None:
                self._watch.attach(self)
        self._depth += 1
        return self

    def __exit__(self, *exc) -> None:
        self._depth -= 1
        if self._depth == 0 and self._watch is not None:
            self._watch.detach(self)
            if self._own_watch:
                self._watch.__exit__(*exc)
            self._watch = None


class StopRequest(_WatchedStop):
    """A stop request set by SIGTERM (or `request()`), agreed across workers.

    Use as a context manager around the work it may stop (nested uses are fine): it joins the
    process's `SigtermWatch`, or starts one for the block.

    Args:
        strategy: the run's tf.distribute strategy.
    """

    def __init__(self, strategy: "tf.distribute.Strategy"):
        import tensorflow as tf

        super().__init__()
        self.strategy = strategy
        # Plain (host) variables, outside the strategy scope: one value per process.
        self.local = tf.Variable(0, dtype=tf.int32, trainable=False, name="stop_requested")
        self.agreed_flag = tf.Variable(0, dtype=tf.int32, trainable=False, name="stop_agreed")
        resolver = getattr(strategy, "cluster_resolver", None)
        spec = resolver.cluster_spec().as_dict() if resolver is not None else {}
        self.multi_worker = sum(len(tasks) for tasks in spec.values()) > 1

    # --- Python side ----------------------------------------------------------------------------
    def request(self) -> None:
        """Asks the run to stop before its next step (what SIGTERM does)."""
        self.local.assign(1)

    @property
    def requested(self) -> bool:
        """Whether the stop was agreed (by any worker's request) in the last compiled loop."""
        return bool(self.agreed_flag.numpy())

    @property
    def received(self) -> bool:
        """Whether this process was asked to stop (agreed in a loop or not)."""
        return bool(self.local.numpy()) or self.requested

    # --- In the compiled loop -------------------------------------------------------------------
    def agreed(self) -> "tf.Tensor":
        """bool scalar: stop now. Every worker gets the same answer (see module docstring)."""
        import tensorflow as tf

        if self.multi_worker:
            per_replica = self.strategy.run(lambda: tf.cast(self.local.read_value(), tf.float32))
            total = self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
            stop = total > 0.0
        else:
            stop = self.local.read_value() > 0
        self.agreed_flag.assign(tf.cast(stop, tf.int32))
        return stop


class HostStop(_WatchedStop):
    """A stop request of one process, read from Python between compiled calls: the trainer on
    the JAX and PyTorch backends (`portable_trainer`), whose calls (`steps_per_execution` steps
    each) return to Python."""

    def __init__(self):
        super().__init__()
        self._requested = threading.Event()

    def request(self) -> None:
        """Asks the run to stop before its next step (what SIGTERM does)."""
        self._requested.set()

    @property
    def requested(self) -> bool:
        return self._requested.is_set()

    received = requested

    def agree(self) -> bool:
        """Whether to stop now. One process decides alone; several JAX hosts agree
        (`hosts.HostsStop`)."""
        return self.requested


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """Inside the block, a SIGTERM raises `Interrupted` in the main thread at once (also one
    received before the block), instead of waiting for a step boundary: for work that is
    abandoned cleanly (an export written to a staging directory). Without an active
    `SigtermWatch` (library use outside a run) the block runs as is."""
    watch = SigtermWatch.current
    if watch is None:
        yield
        return
    if watch.received:
        raise Interrupted()
    watch.interrupting = True
    try:
        yield
    finally:
        watch.interrupting = False


class SigtermWatch:
    """Watches SIGTERM for a block: turns it into `StopRequest.request()` of the attached stop
    requests (at once, or when one attaches later), also while the main thread is inside
    TensorFlow (a thread reads the signal module's wake-up file descriptor). One per process
    at a time (`current`); off the main thread it watches nothing."""

    current: Optional["SigtermWatch"] = None

    def __init__(self):
        self.targets: List[_WatchedStop] = []
        self.received = False
        self.interrupting = False
        self.handled = 0
        self.closing = False
        self.read_fd = self.write_fd = -1
        self.previous_handler = None
        self.previous_fd = -1
        self.thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()

    def __enter__(self) -> Optional["SigtermWatch"]:
        if threading.current_thread() is not threading.main_thread():
            logger.debug("not in the main thread: SIGTERM is not watched")
            return None
        if SigtermWatch.current is not None:
            raise RuntimeError("SIGTERM is already watched in this process")
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.write_fd, False)
        self.previous_handler = signal.signal(signal.SIGTERM, self._handle)
        self.previous_fd = signal.set_wakeup_fd(self.write_fd, warn_on_full_buffer=False)
        self.thread = threading.Thread(target=self._watch, name="sigterm-watcher", daemon=True)
        self.thread.start()
        SigtermWatch.current = self
        return self

    def __exit__(self, *exc) -> None:
        if self.thread is None:
            return
        SigtermWatch.current = None
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
        self.thread = None

    def attach(self, stop: _WatchedStop) -> None:
        """Hands SIGTERM to `stop` (at once if one was received already). Called once the run's
        strategy exists: a multi-worker strategy starts TensorFlow's coordination service, whose
        preemption notifier installs its own C-level SIGTERM handler, so Python's is installed
        again here (a SIGTERM in between went to TensorFlow's notifier only)."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._handle)
        with self._lock:
            self.targets.append(stop)
            received = self.received
        if received:  # a SIGTERM before this stop request existed
            stop.request()

    def detach(self, stop: _WatchedStop) -> None:
        with self._lock:
            if stop in self.targets:
                self.targets.remove(stop)

    def _handle(self, signum, frame) -> None:
        # Python-level handler: runs once per delivered signal, when the main thread is back in
        # Python (the watcher thread has usually noted the signal already).
        self.handled += 1
        if self.handled > 1:
            # A second SIGTERM while stopping: the sender insists; die as without a handler.
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
        self._note()
        if self.interrupting:
            self.interrupting = False  # raised once
            raise Interrupted()

    def _note(self) -> None:
        with self._lock:
            first = not self.received
            self.received = True
            targets = list(self.targets)
        if first:
            logger.warning("SIGTERM received: stopping cleanly (training at the next step "
                           "boundary, after saving a checkpoint; an export at once); a second "
                           "SIGTERM ends the process at once")
        for stop in targets:
            stop.request()

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
