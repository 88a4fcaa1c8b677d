"""Choosing a tf.distribute strategy: tpu | multi_worker | mirrored | cpu | auto."""

import json
import os

import tensorflow as tf


def choose_strategy(name="auto", tpu=None):
    """Returns the tf.distribute strategy called `name`.

    Args:
        name: "tpu" (TPUStrategy on `tpu`), "multi_worker" (MultiWorkerMirroredStrategy from
            TF_CONFIG), "mirrored" (all local GPUs, else all logical CPUs), "cpu" (the default
            strategy), or "auto": TPU if `tpu` is given, multi-worker if TF_CONFIG names several
            workers, mirrored if there are several GPUs, else the default strategy.
        tpu: TPU name or grpc:// address ("local" on a TPU VM).

    Raises ValueError when a TPU cannot be found or TF_CONFIG is unusable for multi-worker.
    """
    if name == "auto":
        if tpu:
            name = "tpu"
        elif _tf_config_workers() > 1:
            name = "multi_worker"
        elif len(tf.config.list_logical_devices("GPU")) > 1:
            name = "mirrored"
        else:
            name = "cpu"
    if name == "tpu":
        return _tpu_strategy(tpu)
    if name == "multi_worker":
        if _tf_config_workers() < 1:
            raise ValueError(
                "strategy 'multi_worker' needs TF_CONFIG with a cluster of workers; TF_CONFIG is unset or empty."
            )
        return tf.distribute.MultiWorkerMirroredStrategy()
    if name == "mirrored":
        gpus = tf.config.list_logical_devices("GPU")
        devices = [d.name for d in gpus] or [d.name for d in tf.config.list_logical_devices("CPU")]
        return tf.distribute.MirroredStrategy(devices)
    if name == "cpu":
        return tf.distribute.get_strategy()
    raise ValueError(f"`strategy` must be one of auto, cpu, mirrored, multi_worker, tpu. Received: strategy={name!r}")


def _tf_config_workers():
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        return 0
    try:
        cluster = json.loads(raw).get("cluster", {})
    except json.JSONDecodeError as error:
        raise ValueError(f"TF_CONFIG is not valid JSON: {error}") from error
    return len(cluster.get("worker", [])) + len(cluster.get("chief", []))


def _tpu_strategy(tpu):
    if not tpu:
        raise ValueError("strategy 'tpu' needs the TPU's name or address: pass --tpu NAME (or 'local' on a TPU VM).")
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
    except Exception as error:  # noqa: BLE001 - resolver failures come as URLError, HttpError, OpError, ...
        raise ValueError(f"Could not find or connect to the TPU {tpu!r}: {type(error).__name__}: {error}") from error
    return tf.distribute.TPUStrategy(resolver)
