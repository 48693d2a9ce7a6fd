"""Choosing a `tf.distribute` strategy from the `strategy` hparam, without probing the network.

`auto` picks TPUStrategy only when a TPU is *named* (the `tpu_name` hparam or the `TPU_NAME`
environment variable): a `TPUClusterResolver` created without a name queries a cloud metadata
address, which electra-tf never does. Otherwise: MirroredStrategy when several GPUs are visible,
else the default strategy (one device).
"""

from __future__ import annotations

import json
import os
from typing import Optional

import tensorflow as tf

from electra_tf.config import STRATEGIES
from electra_tf.errors import ElectraError


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
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(
            tpu=tpu, zone=tpu_zone, project=gcp_project)
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver)
    if name == "multi_worker":
        if "TF_CONFIG" not in os.environ:
            raise StrategyError("strategy 'multi_worker' needs the TF_CONFIG environment variable "
                                "(cluster spec and this worker's task)")
        try:
            json.loads(os.environ["TF_CONFIG"])
        except json.JSONDecodeError as e:
            raise StrategyError(f"TF_CONFIG is not valid JSON: {e.msg}") from e
        return tf.distribute.MultiWorkerMirroredStrategy()
    gpus = tf.config.list_logical_devices("GPU")
    if name == "mirrored" or (name == "auto" and len(gpus) > 1):
        return tf.distribute.MirroredStrategy()
    if name == "one_device":
        return tf.distribute.OneDeviceStrategy(gpus[0].name if gpus else "/cpu:0")
    return tf.distribute.get_strategy()  # auto with at most one GPU: the default strategy


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """True on the worker that writes summaries, checkpoints and exports."""
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return True
    resolver = strategy.cluster_resolver
    if resolver.task_type in (None, "chief"):
        return True
    has_chief = "chief" in resolver.cluster_spec().as_dict()
    return resolver.task_type == "worker" and resolver.task_id == 0 and not has_chief
