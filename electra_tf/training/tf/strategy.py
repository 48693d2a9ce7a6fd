"""Choosing a `tf.distribute` strategy from the `strategy` hparam, without probing the network.

`auto` picks TPUStrategy only when a TPU is *named* (the `tpu_name` hparam or the `TPU_NAME`
environment variable): a `TPUClusterResolver` created without a name queries a cloud metadata
address, which electra-tf never does. Otherwise: MirroredStrategy when several GPUs are visible,
else the default strategy (one device).
"""

from __future__ import annotations

import json
import os
import socket
from typing import Optional

import tensorflow as tf

from electra_tf.errors import ElectraError, error_line
from electra_tf.config.hparam_checks import STRATEGIES

TPU_CONNECT_SECONDS = 20.0  # a TPU's gRPC port answers at once; a wrong address times out


class StrategyError(ElectraError, ValueError):
    """The requested strategy cannot be created here."""


def tpu_name_from(config_tpu_name: Optional[str]) -> Optional[str]:
    """The TPU to use: the hparam, else the TPU_NAME environment variable, else None."""
    return config_tpu_name or os.environ.get("TPU_NAME") or None


def set_inter_op_threads(threads: Optional[int] = None, single_device: bool = True) -> int:
    """Sets how many TensorFlow ops may run at once; call before any op runs.

    On a CPU-only machine a training step is a chain of ops that each use every core already
    (oneDNN matmuls, Eigen elementwise kernels). TensorFlow's default runs one op per core at once,
    so two ops fight over the cores; one op at a time was 2.2x faster for ELECTRA-small on two
    cores (docs/benchmarks.md). Several replicas on one host (MirroredStrategy over logical CPUs)
    or collectives across workers need concurrent ops, so `None` sets 1 only for a single-device
    CPU run.

    Args:
        threads: None = automatic (1 for a single-device run with no GPU, else TensorFlow's
            default); 0 = TensorFlow's default; n > 0 = n.
        single_device: whether the run uses one device (the automatic choice needs it).

    Returns:
        int. The inter-op thread count in effect (0 = TensorFlow's default). Unchanged when the
        runtime is already initialised (e.g. a second run in one process), which TensorFlow forbids
        changing.
    """
    if threads is None:
        cpus = tf.config.list_physical_devices("CPU")
        virtual = tf.config.get_logical_device_configuration(cpus[0]) if cpus else None
        one_cpu = not virtual or len(virtual) <= 1
        threads = 1 if (single_device and one_cpu and not tf.config.list_physical_devices("GPU")) else 0
    current = tf.config.threading.get_inter_op_parallelism_threads()
    if threads != current:
        try:
            tf.config.threading.set_inter_op_parallelism_threads(threads)
        except RuntimeError:  # the runtime already runs ops: keep its setting
            return current
    return threads


def get_strategy(name: str = "auto", tpu_name: Optional[str] = None, tpu_zone: Optional[str] = None,
                 gcp_project: Optional[str] = None,
                 inter_op_threads: Optional[int] = None) -> tf.distribute.Strategy:
    """Creates the strategy. Must run before any other TensorFlow op in the process.

    Args:
        name: str. One of `STRATEGIES`.
        tpu_name, tpu_zone, gcp_project: TPU location (official hparam names); `tpu` and `auto`
            need `tpu_name` (or TPU_NAME) to use a TPU.
        inter_op_threads: see `set_inter_op_threads` (applied before the strategy is created).

    Raises:
        StrategyError: unknown name, `tpu` without a TPU name, `multi_worker` without TF_CONFIG.
    """
    if name not in STRATEGIES:
        raise StrategyError(f"strategy must be one of {', '.join(STRATEGIES)}, got {name!r}")
    tpu = tpu_name_from(tpu_name)
    single = name == "one_device" or (name == "auto" and not tpu)
    set_inter_op_threads(inter_op_threads, single_device=single)
    if name == "tpu" or (name == "auto" and tpu):
        if not tpu:
            raise StrategyError("strategy 'tpu' needs a TPU name: set the tpu_name hparam or TPU_NAME "
                                "(electra-tf never probes the network for an unnamed TPU)")
        return _tpu_strategy(tpu, tpu_zone, gcp_project)
    if name == "multi_worker":
        check_tf_config()
        try:
            return tf.distribute.MultiWorkerMirroredStrategy()
        except (ValueError, RuntimeError, tf.errors.OpError) as e:
            raise StrategyError(f"TF_CONFIG: {error_line(e)}") from None
    gpus = tf.config.list_logical_devices("GPU")
    if name == "mirrored" or (name == "auto" and len(gpus) > 1):
        return tf.distribute.MirroredStrategy()
    if name == "one_device":
        return tf.distribute.OneDeviceStrategy(gpus[0].name if gpus else "/cpu:0")
    return tf.distribute.get_strategy()  # auto with at most one GPU: the default strategy


def check_tf_config() -> dict:
    """Parses TF_CONFIG and checks this worker's task is in its cluster.

    Raises:
        StrategyError: TF_CONFIG is missing, not JSON, has no cluster, or names a task type or
            index that the cluster does not have.
    """
    if "TF_CONFIG" not in os.environ:
        raise StrategyError("strategy 'multi_worker' needs the TF_CONFIG environment variable "
                            "(cluster spec and this worker's task)")
    try:
        tf_config = json.loads(os.environ["TF_CONFIG"])
    except json.JSONDecodeError as e:
        raise StrategyError(f"TF_CONFIG is not valid JSON: {e.msg}") from None
    cluster = tf_config.get("cluster") if isinstance(tf_config, dict) else None
    task = tf_config.get("task") if isinstance(tf_config, dict) else None
    if not isinstance(cluster, dict) or not cluster:
        raise StrategyError("TF_CONFIG has no \"cluster\" (e.g. {\"worker\": [\"host:port\", ...]})")
    if not isinstance(task, dict) or "type" not in task:
        raise StrategyError("TF_CONFIG has no \"task\" (e.g. {\"type\": \"worker\", \"index\": 0})")
    task_type, index = task["type"], task.get("index", 0)
    addresses = cluster.get(task_type)
    if not isinstance(addresses, list):
        raise StrategyError(f"TF_CONFIG: task type {task_type!r} is not in the cluster (it has "
                            f"{', '.join(map(str, cluster))})")
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(addresses):
        raise StrategyError(f"TF_CONFIG: task index {index!r} is out of range: the cluster has "
                            f"{len(addresses)} {task_type} task(s), indices 0 to "
                            f"{len(addresses) - 1}")
    return tf_config


def _tpu_strategy(tpu: str, zone: Optional[str], project: Optional[str]):
    """Connects to the named TPU; an unreachable or unknown one is one StrategyError line.

    A `grpc://host:port` address is checked with a plain TCP connection first (TensorFlow
    would wait for it indefinitely); a TPU name is resolved through the Cloud TPU API (what the
    user asked for by naming it), then its address is checked the same way.
    """
    if tpu.startswith("grpc://"):
        _check_reachable(tpu, tpu)
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(
            tpu=tpu, zone=zone, project=project)
        master = resolver.master()
    except Exception as e:  # noqa: BLE001 (the Cloud API client raises its own types)
        raise StrategyError(f"TPU {tpu!r} cannot be resolved: {error_line(e)}") from None
    if master.startswith("grpc://") and master != tpu:
        _check_reachable(master, tpu)
    try:
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver)
    except (ValueError, RuntimeError, tf.errors.OpError) as e:
        raise StrategyError(f"TPU {tpu!r} ({master}) cannot be used: {error_line(e)}") from None


def _check_reachable(address: str, tpu: str, timeout: float = TPU_CONNECT_SECONDS) -> None:
    """Raises StrategyError unless a TCP connection to `grpc://host:port` succeeds."""
    host, _, port = address[len("grpc://"):].rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except (OSError, ValueError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else error_line(e)
        raise StrategyError(f"TPU {tpu!r} is not reachable at {address} ({reason}): check "
                            "TPU_NAME / tpu_name and that the TPU is running") from None


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """True on the worker that writes summaries, checkpoints and exports."""
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return True
    resolver = strategy.cluster_resolver
    if resolver.task_type in (None, "chief"):
        return True
    has_chief = "chief" in resolver.cluster_spec().as_dict()
    return resolver.task_type == "worker" and resolver.task_id == 0 and not has_chief
