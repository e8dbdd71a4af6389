"""Builds the tf.distribute strategy a run trains under, and says who the chief is.

``configure_devices`` must run before TensorFlow touches a device: it splits the
CPU into logical devices (CPU testing of MirroredStrategy), limits the visible
GPUs and turns on memory growth. ``build_strategy`` then picks the strategy
(``auto`` looks at the cluster and the GPUs) and returns it with a description
that is logged at start and saved in metrics.json.
"""
import dataclasses
import logging
import tempfile

import tensorflow as tf

from tfgpu.config import ConfigError, RuntimeConfig

log = logging.getLogger("tfgpu")


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where a run executes: the strategy and the facts the rest of tfgpu needs about it."""
    strategy: tf.distribute.Strategy
    kind: str  # one_device | mirrored | multi_worker_mirrored
    num_replicas: int
    num_workers: int
    worker_index: int
    is_chief: bool
    devices: tuple
    on_logical_cpus: bool  # replicas are logical CPU devices (no XLA across them)

    def describe(self) -> str:
        return (f"strategy={self.kind} replicas={self.num_replicas} workers={self.num_workers} "
                f"worker={self.worker_index}{' (chief)' if self.is_chief else ''} devices={','.join(self.devices)}")


def configure_devices(config: RuntimeConfig) -> None:
    """Applies device settings; raises a clear error if TensorFlow already initialised its devices."""
    try:
        gpus = tf.config.list_physical_devices("GPU")
        if config.num_gpus >= 0:
            if config.num_gpus > len(gpus):
                raise ConfigError("num_gpus", f"{config.num_gpus} GPUs requested but {len(gpus)} visible")
            gpus = gpus[:config.num_gpus]
            tf.config.set_visible_devices(gpus, "GPU")
        if config.gpu_memory_growth:
            for gpu in gpus:
                tf.config.experimental.set_memory_growth(gpu, True)
        if config.cpu_logical_devices > 0:
            cpu = tf.config.list_physical_devices("CPU")[0]
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(config.cpu_logical_devices)])
    except RuntimeError as e:  # "... cannot be modified after being initialized"
        raise RuntimeError(f"device settings must be applied before TensorFlow initialises its devices: {e}") from e


def _mirrored_cross_device_ops(alg: str):
    if alg in ("", "auto"):
        return None
    if alg == "nccl":
        return tf.distribute.NcclAllReduce()
    if alg == "hierarchical_copy":
        return tf.distribute.HierarchicalCopyAllReduce()
    raise ConfigError("all_reduce_alg", f"{alg!r} is for multi_worker_mirrored; mirrored takes nccl or "
                      "hierarchical_copy")


def _collective_options(config: RuntimeConfig):
    implementation = {
        "": tf.distribute.experimental.CommunicationImplementation.AUTO,
        "auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
        "ring": tf.distribute.experimental.CommunicationImplementation.RING,
        "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL,
    }
    if config.all_reduce_alg not in implementation:
        raise ConfigError("all_reduce_alg", f"{config.all_reduce_alg!r} is for mirrored; multi_worker_mirrored "
                          "takes auto, ring or nccl")
    return tf.distribute.experimental.CommunicationOptions(
        implementation=implementation[config.all_reduce_alg],
        timeout_seconds=config.collective_timeout_s or None)


def choose_kind(config: RuntimeConfig, num_gpus: int, num_workers: int) -> str:
    """The strategy ``auto`` stands for, given what this host and cluster have."""
    if config.distribution_strategy != "auto":
        return config.distribution_strategy
    if num_workers > 1:
        return "multi_worker_mirrored"
    if num_gpus > 1 or config.cpu_logical_devices > 1:
        return "mirrored"
    return "one_device"


def build_strategy(config: RuntimeConfig, cluster_desc) -> Placement:
    """Creates the strategy for ``config`` in the cluster ``cluster_desc`` (``cluster.resolve_for_run``'s
    description, resolved once by the caller; None: this process trains alone); call ``configure_devices`` first."""
    # MultiWorkerMirroredStrategy must exist before TensorFlow initialises its runtime, so nothing below
    # lists logical devices until the strategy kind is known.
    visible_gpus = tf.config.get_visible_devices("GPU")
    num_workers = cluster_desc["num_workers"] if cluster_desc else 1
    kind = choose_kind(config, len(visible_gpus), num_workers)
    if kind == "multi_worker_mirrored":
        return _multi_worker(config, cluster_desc, num_workers)
    gpus = [d.name for d in tf.config.list_logical_devices("GPU")]
    cpus = [d.name for d in tf.config.list_logical_devices("CPU")]

    if kind == "one_device":
        device = gpus[0] if gpus else cpus[0]
        strategy = tf.distribute.OneDeviceStrategy(device)
        return Placement(strategy, kind, 1, 1, 0, True, (device,), False)
    if kind == "mirrored":
        devices = gpus or cpus
        strategy = tf.distribute.MirroredStrategy(
            devices=devices, cross_device_ops=_mirrored_cross_device_ops(config.all_reduce_alg))
        return Placement(strategy, kind, strategy.num_replicas_in_sync, 1, 0, True, tuple(devices),
                         not gpus and len(devices) > 1)


def _multi_worker(config: RuntimeConfig, cluster_desc, num_workers: int) -> Placement:
    from tfgpu.runtime import cluster

    resolver = cluster.make_cluster_resolver(cluster_desc) if cluster_desc else None
    is_chief = cluster.is_chief(cluster_desc) if cluster_desc else True
    if cluster_desc:
        log.info("%s", cluster.describe(cluster_desc))
    try:
        strategy = tf.distribute.MultiWorkerMirroredStrategy(
            cluster_resolver=resolver, communication_options=_collective_options(config))
    except tf.errors.UnknownError as e:
        address = cluster_desc["cluster_spec"][cluster_desc["task_type"]][cluster_desc["task_id"]] \
            if cluster_desc else "?"
        raise ConfigError("cluster", f"this worker cannot serve on {address} (port in use, or not an address "
                          f"of this host?): {e.message}") from None
    index = cluster_desc["worker_index"] if cluster_desc else 0
    local = [d.name for d in tf.config.list_logical_devices("GPU")] or ["/device:CPU:0"]
    return Placement(strategy, "multi_worker_mirrored", strategy.num_replicas_in_sync, num_workers, index, is_chief,
                     tuple(local), False)


def is_multi_worker(strategy) -> bool:
    """Whether ``strategy`` spans several worker processes (a MultiWorkerMirroredStrategy made for a cluster; one
    made on a lone host runs as a local strategy)."""
    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and \
        strategy.extended._in_multi_worker_mode()


def worker_dir(model_dir: str, placement: Placement) -> str:
    """Where this worker writes files every worker must write (checkpoints): the real dir on the chief,
    ``scratch_dir`` elsewhere."""
    return model_dir if placement.is_chief else scratch_dir(placement)


def scratch_dir(placement: Placement) -> str:
    """A fresh temporary dir where a worker that is not the chief writes what every worker must write but only the
    chief keeps (checkpoints, a user callback's files): the one chief-only output scheme of both doors
    (``training.checkpoint.Checkpointer``, ``training.fit.callbacks.ChiefOutputs``); the caller deletes it."""
    return tempfile.mkdtemp(prefix=f"tfgpu-worker{placement.worker_index}-")
