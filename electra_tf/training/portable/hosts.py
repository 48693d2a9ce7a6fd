"""Several JAX processes (hosts) training one run: `--backend jax` with strategy multi_worker.

The run is the TensorFlow trainer's `multi_worker` run, on JAX:

- **Joining.** `join` calls `keras.distribution.initialize()` (before anything else touches
  JAX): every host reads `KERAS_DISTRIBUTION_JOB_ADDRESSES` (the coordinator, process 0's
  `host:port`), `KERAS_DISTRIBUTION_NUM_PROCESSES` and `KERAS_DISTRIBUTION_PROCESS_ID`, or,
  unset, JAX finds the cluster itself (a Cloud TPU pod slice, Slurm). Process i is host i.
  The hosts then compare their config fingerprints (`check_same_config`): hosts started with
  different hparams would train apart, each exiting 0, so every host refuses in one line naming
  the first differing hparam.
- **Devices.** `keras.distribution.DataParallel` over every device of every host, host-major
  (`global_devices`): host i's rows of the global batch are rows [i * b, (i + 1) * b) of it, as
  TensorFlow numbers the replicas of its workers, so an example's global index (which keys its
  masking) is the same on both backends.
- **Input.** Host i reads input pipeline i of `count` (`BatchReader(num_input_pipelines=count,
  input_pipeline_id=i)`) with batches of `global / count` rows: the batches the TensorFlow
  worker i feeds its replicas (`inputs.train_iterator`), files sharded per host when there are
  at least as many files as hosts, records otherwise. Keras makes the global array from the
  hosts' parts (`jax.make_array_from_process_local_data`).
- **One writer.** Host 0 alone writes the run directory (config.json, checkpoints, TensorBoard
  events, eval results); it must be one directory every host reads (a shared filesystem), since
  every host restores the checkpoint. A checkpoint holds every host's reader position, gathered
  to host 0 before it is written (`gather_json`): one atomic file has the weights and the
  positions of one step, so a resume never pairs weights with another step's data.
- **Agreement.** SIGTERM may reach one host only; the hosts agree after every chunk of
  `iterations_per_loop` steps (`HostsStop.agree`, an all-gather of the hosts' flags) and stop
  at the same step, saving together. Set-up and saving end with an agreement too
  (`all_or_none`): a host that fails there (a file it cannot read) stops every host with a line
  naming it, instead of leaving them waiting in a collective. A host that dies during a step
  makes the others' next collective fail at once (gloo: the connection is reset): each stops
  with one line naming it (`stop_if_lost`) and exits without waiting for it (`lost`). The limit:
  when host 0 (JAX's coordination service) is the one lost, the others' coordination clients
  abort their process themselves (C++ LOG(FATAL), exit 134) as soon as they poll it, which no
  Python code can catch; the line comes first when the collective fails first (it did in the
  runs tried here, then the exit is 2 within seconds).

The agreements are `jax.experimental.multihost_utils.process_allgather` calls of a few int32
values: one collective over the hosts' devices, as the gradients' (gloo on CPU hosts).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from typing import Iterator, List, NamedTuple, Optional, Sequence

import numpy as np

from electra_tf.config import PretrainingConfig
from electra_tf.errors import TrainingError, error_line
from electra_tf.training import preemption

logger = logging.getLogger("electra_tf")

# What keras.distribution.initialize() reads (Keras' documented names).
ENV_VARS = ("KERAS_DISTRIBUTION_JOB_ADDRESSES", "KERAS_DISTRIBUTION_NUM_PROCESSES",
            "KERAS_DISTRIBUTION_PROCESS_ID")
_HALF = 31  # int32-safe halves of an int: JAX gathers 32-bit integers unless x64 is enabled


class Hosts(NamedTuple):
    """The processes of a run and this one's place.

    Attributes:
        count: int. Processes (hosts) training the run.
        index: int. This process, in [0, count); 0 writes the run directory.
    """

    count: int = 1
    index: int = 0

    @property
    def several(self) -> bool:
        return self.count > 1

    @property
    def writer(self) -> bool:
        """Whether this host writes the run directory (host 0)."""
        return self.index == 0


def join(config: PretrainingConfig) -> Hosts:
    """Joins the run's other hosts (strategy multi_worker on JAX); else one host.

    Call before anything else uses JAX: JAX joins a cluster only before its first computation.

    Raises:
        TrainingError: the cluster cannot be joined, or the Keras distribution variables are
            set for a strategy other than multi_worker.
    """
    if config.backend != "jax":
        return Hosts()
    import jax

    if config.strategy != "multi_worker":
        set_vars = [name for name in ENV_VARS if os.environ.get(name)]
        if set_vars:
            raise TrainingError(f"{set_vars[0]} is set but strategy is {config.strategy!r}: "
                                "several JAX hosts train with the hparam strategy multi_worker "
                                "(docs/keras.md), one host without those variables")
        if jax.distributed.is_initialized() and jax.process_count() > 1:
            raise TrainingError(f"{jax.process_count()} JAX processes but strategy is "
                                f"{config.strategy!r}: several hosts train with the hparam "
                                "strategy multi_worker (docs/keras.md)")
        return Hosts()
    if not jax.distributed.is_initialized():
        import keras

        try:
            keras.distribution.initialize()
        except (ValueError, RuntimeError) as e:
            raise TrainingError(
                f"strategy multi_worker with --backend jax: cannot join the other hosts "
                f"({error_line(e)}); set {', '.join(ENV_VARS)} on every host (docs/keras.md), "
                "or run where JAX finds the cluster itself (a Cloud TPU pod slice, Slurm)") \
                from None
    hosts = Hosts(jax.process_count(), jax.process_index())
    logger.info("host %d of %d (JAX processes); %d devices in all, %d here", hosts.index,
                hosts.count, jax.device_count(), jax.local_device_count())
    check_same_config(config, hosts)
    return hosts


# What may differ between the hosts of one run: where each mounts the shared directories, and
# its own resources (the run's hparams may not).
HOST_LOCAL_FIELDS = ("data_dir", "model_dir", "pretrain_tfrecords", "eval_tfrecords",
                     "vocab_file", "two_stage_generator_dir", "frozen_generator_dir",
                     "inter_op_threads", "tpu_name", "tpu_zone", "gcp_project",
                     "resolved_mixed_precision", "resolved_mixed_precision_reason")


def check_same_config(config: PretrainingConfig, hosts: Hosts) -> None:
    """Every host was started with the same hparams: their config fingerprints (sha256 of the
    resolved config without `HOST_LOCAL_FIELDS`) are compared (one collective); on a mismatch
    the configs are gathered to name the first differing hparam, on every host.

    Raises:
        TrainingError: the hosts' configs differ (each host raises the same line).
    """
    if not hosts.several:
        return
    shared = {k: v for k, v in config.to_dict().items() if k not in HOST_LOCAL_FIELDS}
    text = json.dumps(shared, sort_keys=True, default=str)
    fingerprint = int(hashlib.sha256(text.encode("utf-8")).hexdigest()[:15], 16)  # 60 bits
    if len(set(gather_ints(hosts, [fingerprint])[:, 0])) == 1:
        return
    configs = gather_json(hosts, json.loads(text))
    for index, other in enumerate(configs[1:], 1):
        differing = sorted(k for k in set(configs[0]) | set(other)
                           if configs[0].get(k) != other.get(k))
        if differing:
            key = differing[0]
            more = f" (and {len(differing) - 1} more)" if len(differing) > 1 else ""
            raise TrainingError(
                f"the hosts were started with different hparams: {key} is "
                f"{configs[0].get(key)!r} on host 0, {other.get(key)!r} on host {index}{more}: "
                "start every host with the same command and --hparams")


def global_devices() -> List[str]:
    """Every host's devices, host-major (Keras names: "cpu:2048"): host i's rows of the global
    batch follow host i - 1's, as TensorFlow orders its workers' replicas."""
    import jax

    ordered = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    return [f"{d.platform}:{d.id}" for d in ordered]


# --- Collectives ---------------------------------------------------------------------------------
def gather_ints(hosts: Hosts, values: Sequence[int]) -> np.ndarray:
    """int64 [count, len(values)]: every host's `values` (non-negative ints below 2^62), on
    every host (one collective; each host must call it at the same point)."""
    values = [int(v) for v in values]
    if not hosts.several:
        return np.asarray([values], np.int64)
    from jax.experimental import multihost_utils

    mask = (1 << _HALF) - 1
    halves = np.asarray([[v >> _HALF for v in values], [v & mask for v in values]], np.int32)
    gathered = np.asarray(multihost_utils.process_allgather(halves)).astype(np.int64)
    return (gathered[:, 0] << _HALF) | gathered[:, 1]


def gather_json(hosts: Hosts, value) -> list:
    """Every host's JSON-serialisable `value`, in host order, on every host (two collectives:
    the lengths, then the padded UTF-8 bytes)."""
    if not hosts.several:
        return [value]
    from jax.experimental import multihost_utils

    data = np.frombuffer(json.dumps(value, sort_keys=True).encode("utf-8"), np.uint8)
    lengths = gather_ints(hosts, [data.size])[:, 0]
    padded = np.zeros(int(lengths.max()), np.uint8)
    padded[:data.size] = data
    gathered = np.asarray(multihost_utils.process_allgather(padded))
    return [json.loads(bytes(row[:n]).decode("utf-8")) for row, n in zip(gathered, lengths)]


@contextlib.contextmanager
def all_or_none(hosts: Hosts, what: str) -> Iterator[None]:
    """Every host does `what` (the block), then they agree: if one failed, all stop.

    A host whose block raises tells the others, then raises its own error; the others raise a
    TrainingError naming it, instead of waiting for it in the next collective.

    Args:
        hosts: the run's hosts.
        what: str. What the block does, for the message ("setting up", "saving ckpt-8.npz").
    """
    if not hosts.several:
        yield
        return
    try:
        yield
    except BaseException:
        gather_ints(hosts, [1])
        raise
    failed = [i for i, flag in enumerate(gather_ints(hosts, [0])[:, 0]) if flag]
    if failed:
        raise TrainingError(f"host {failed[0]} of {hosts.count} failed {what} (its log says "
                            f"why): host {hosts.index} stops too; fix it and rerun every host")


# --- A host lost mid-run -------------------------------------------------------------------------
# What a collective says when a peer process is gone (gloo on CPU hosts: JAX raises its runtime
# error from a step, a ValueError from `process_allgather`): the connection to it was reset or
# closed.
_COLLECTIVES = ("Gloo", "gloo")
_LOST_PEER = ("Connection reset by peer", "Connection closed by peer", "Socket closed",
              "Read error", "heartbeat timeout")
_lost = False


class HostLost(TrainingError):
    """Another host of the run died or was killed: this one cannot go on (see `stop_if_lost`)."""


def lost() -> bool:
    """Whether this process stopped because another host was lost (`stop_if_lost`). JAX's exit
    would then wait for the lost host (its shutdown barrier, up to the coordination service's
    heartbeat timeout, ~100 s) and abort the process with a C++ stack dump: a tool exits at once
    instead (`os._exit`, after its one line)."""
    return _lost


def _is_lost_peer(error: BaseException) -> bool:
    text = str(error)
    return (isinstance(error, (RuntimeError, ValueError))
            and any(word in text for word in _COLLECTIVES)
            and any(word in text for word in _LOST_PEER))


@contextlib.contextmanager
def stop_if_lost(config: PretrainingConfig) -> Iterator[None]:
    """A collective that fails because a peer is gone becomes one `HostLost` line naming the
    lost host (with two hosts: the other one) and the remedy, instead of JAX's traceback.

    Args:
        config: the run's config (several hosts: `--backend jax` with strategy multi_worker).
    """
    global _lost
    if config.backend != "jax" or config.strategy != "multi_worker":
        yield
        return
    try:
        yield
    except Exception as e:  # the runtime's error type is JAX's, not importable without it
        if not _is_lost_peer(e):
            raise
        import jax

        _lost = True
        index, count = jax.process_index(), jax.process_count()
        who = f"host {1 - index} of 2" if count == 2 else f"another of the {count} hosts"
        raise HostLost(f"{who} was lost (a collective with it failed: {error_line(e)}): host "
                       f"{index} stops too; rerun every host (the run resumes from its last "
                       "checkpoint)") from None


class HostsStop(preemption.HostStop):
    """SIGTERM on any host stops every host at the same step.

    `requested` is the answer of the last `agree()`, which every host calls at the same points
    (before training, after each chunk, around the evaluation): true once any host received
    SIGTERM.

    Args:
        hosts: the run's hosts.
    """

    def __init__(self, hosts: Hosts):
        super().__init__()
        self.hosts = hosts
        self._agreed = False

    def agree(self) -> bool:
        """Whether any host asked to stop (a collective: all hosts call it together)."""
        local = self._requested.is_set()
        self._agreed = bool(gather_ints(self.hosts, [int(local)]).any())
        if self._agreed and not local:
            logger.warning("another host received SIGTERM: stopping with it")
        return self._agreed

    @property
    def requested(self) -> bool:
        return self._agreed

    @property
    def received(self) -> bool:
        return self._requested.is_set() or self._agreed


def host_state(saved: Optional[dict], hosts: Hosts) -> Optional[dict]:
    """This host's reader position in a checkpoint's data state (several hosts: one per host,
    `{"hosts": [...]}`; one host: the position itself)."""
    if saved is None or not hosts.several:
        return saved
    states = saved.get("hosts") if isinstance(saved, dict) else None
    if not isinstance(states, list) or len(states) != hosts.count:
        return None
    return states[hosts.index]
