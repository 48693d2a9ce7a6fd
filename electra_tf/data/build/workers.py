"""A small process pool for the builder: long-lived workers that pull tasks, with progress.

The worker object (e.g. `build_worker.BuildWorker`) is made once per process by a picklable
factory, so per-process state (the tokenizer; TensorFlow, if it runs TensorFlow's) is paid once,
and it serves several task lists in turn (`map`): packing, then writing shards. Tasks are pulled
from one queue, so the load balances itself; results come back in task order. With one process
everything runs in the calling process.

Errors: a worker's user-facing failure (an `ElectraError` such as `BuildError`) or OSError (e.g.
a full disk) comes back as its one-line message; anything else (a bug) as its traceback; a
worker that dies (killed, out of memory) fails the build naming its exit code.
"""

from __future__ import annotations

import logging
import multiprocessing
import queue as queue_lib
import time
import traceback
from typing import Any, Callable, Dict, List, Optional, Sequence

from electra_tf.errors import ElectraError, error_line

logger = logging.getLogger(__name__)

REPORT_SECONDS = 0.5  # how often a worker sends progress


class WorkerFailed(ElectraError, ValueError):
    """A worker reported a user-facing error (bad input or settings); the message is one line."""


class Reporter:
    """Accumulates a task's progress counters and hands them on at most every REPORT_SECONDS."""

    def __init__(self, send: Optional[Callable[[Dict[str, int]], None]]):
        self.send = send
        self.pending: Dict[str, int] = {}
        self.last = time.monotonic()

    def __call__(self, **counts: int) -> None:
        for name, value in counts.items():
            self.pending[name] = self.pending.get(name, 0) + value
        if self.send is not None and time.monotonic() - self.last >= REPORT_SECONDS:
            self.flush()

    def flush(self) -> None:
        if self.send is not None and self.pending:
            self.send(self.pending)
        self.pending = {}
        self.last = time.monotonic()


def _process_main(make_worker: Callable[[int], Any], worker_id: int, tasks, messages) -> None:
    """Entry point of a worker process: builds the worker, then runs tasks until None."""
    try:
        worker = make_worker(worker_id)
    except (ElectraError, OSError) as e:
        messages.put(("error", -1, error_line(e, limit=None, whole=True)))
        return
    except BaseException:  # noqa: BLE001 -- a bug: hand the traceback to the parent
        messages.put(("crash", -1, traceback.format_exc()))
        return
    while True:
        item = tasks.get()
        if item is None:
            return
        task_id, method, payload = item
        reporter = Reporter(lambda counts: messages.put(("progress", task_id, counts)))
        try:
            result = getattr(worker, method)(payload, reporter)
            reporter.flush()
            messages.put(("done", task_id, result))
        except (ElectraError, OSError) as e:  # BuildError, CorpusError, a full disk: one line
            messages.put(("error", task_id, error_line(e, limit=None, whole=True)))
        except BaseException:  # noqa: BLE001
            messages.put(("crash", task_id, traceback.format_exc()))


class WorkerPool:
    """Runs a worker's methods over task lists in `num_processes` processes (or this one).

    Args:
        num_processes: int >= 1.
        make_worker: picklable factory (worker_id) -> worker object.

    Use as a context manager; `map(method, payloads, on_progress)` calls
    `worker.<method>(payload, reporter)` for each payload and returns the results in order.
    """

    def __init__(self, num_processes: int, make_worker: Callable[[int], Any]):
        self.num_processes = num_processes
        self.make_worker = make_worker
        self.worker = None
        self.processes: list = []
        if num_processes > 1:
            # Spawn, not fork: the parent may already hold TensorFlow threads.
            context = multiprocessing.get_context("spawn")
            self.tasks, self.messages = context.Queue(), context.Queue()
            self.processes = [
                context.Process(target=_process_main, args=(make_worker, i, self.tasks,
                                                             self.messages), daemon=True)
                for i in range(num_processes)]
            for p in self.processes:
                p.start()

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.close(abort=exc_type is not None)

    def map(self, method: str, payloads: Sequence[Any],
            on_progress: Callable[[Dict[str, int]], None]) -> List[Any]:
        if not self.processes:
            if self.worker is None:
                self.worker = self.make_worker(0)
            results = []
            for payload in payloads:
                reporter = Reporter(on_progress)
                results.append(getattr(self.worker, method)(payload, reporter))
                reporter.flush()
            return results
        for task_id, payload in enumerate(payloads):
            self.tasks.put((task_id, method, payload))
        results: Dict[int, Any] = {}
        while len(results) < len(payloads):
            try:
                kind, task_id, payload = self.messages.get(timeout=0.5)
            except queue_lib.Empty:
                for i, p in enumerate(self.processes):
                    if not p.is_alive() and self.messages.empty():
                        raise WorkerFailed(f"worker process {i} died (exit code {p.exitcode})")
                continue
            if kind == "progress":
                on_progress(payload)
            elif kind == "done":
                results[task_id] = payload
            elif kind == "error":
                raise WorkerFailed(payload)
            else:
                raise RuntimeError(f"a worker process failed:\n{payload}")
        return [results[i] for i in range(len(payloads))]

    def close(self, abort: bool = False) -> None:
        """Stops the workers: asks them to finish, or (abort, after an error) terminates them."""
        if not abort:
            for _ in self.processes:
                self.tasks.put(None)
        deadline = time.monotonic() + (0 if abort else 10)
        for p in self.processes:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
            if p.is_alive():  # aborted, or tearing TensorFlow down
                p.terminate()
                p.join()
        if self.processes:
            self.tasks.close()
            self.messages.close()
        self.processes = []


class Progress:
    """Sums progress counters and logs a line at most every `interval` seconds.

    Args:
        describe: (totals) -> the line to log (the rate over the last interval is appended
            when `rate_key` is set).
        interval: seconds between lines.
        rate_key: the counter whose rate per second is shown.
        rate_unit: its unit in the line.
    """

    def __init__(self, describe: Callable[[Dict[str, int]], str], interval: float,
                 rate_key: Optional[str] = None, rate_unit: str = ""):
        self.describe = describe
        self.interval = interval
        self.rate_key, self.rate_unit = rate_key, rate_unit
        self.totals: Dict[str, int] = {}
        self.last_time = time.monotonic()
        self.last_count = 0

    def __call__(self, counts: Dict[str, int]) -> None:
        for name, value in counts.items():
            self.totals[name] = self.totals.get(name, 0) + value
        now = time.monotonic()
        if now - self.last_time < self.interval:
            return
        line = self.describe(self.totals)
        if self.rate_key:
            count = self.totals.get(self.rate_key, 0)
            rate = (count - self.last_count) / max(now - self.last_time, 1e-9)
            line += f", {rate:.0f} {self.rate_unit}/s"
            self.last_count = count
        self.last_time = now
        logger.info("%s", line)
