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


class StrategyError(ValueError):
    """The requested strategy cannot be created here."""


def tpu_name_from(config_tpu_name: Optional[str]) -> Optional[str]:
    """The TPU to use: the hparam, else the TPU_NAME environment variable, else None."""
    return config_tpu_name or os.environ.get("TPU_NAME") or None


def get_strategy(name: str = "auto", tpu_name: Optional[str] = None, tpu_zone: Optional[str] = None,
                 gcp_project: Optional[str] = None) -> tf.distribute.Strategy:
    """Creates the strategy. Must run before any other TensorFlow op in the process.

    Args:
        name: str. One of `STRATEGIES`.
        tpu_name, tpu_zone, gcp_project: TPU location (official hparam names); `tpu` and `auto`
            need `tpu_name` (or TPU_NAME) to use a TPU.

    Raises:
        StrategyError: unknown name, `tpu` without a TPU name, `multi_worker` without TF_CONFIG.
    """
    if name not in STRATEGIES:
        raise StrategyError(f"strategy must be one of {', '.join(STRATEGIES)}, got {name!r}")
    tpu = tpu_name_from(tpu_name)
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
