"""The job's strategy, made when a script imports tfgpu: before the script's first model, optimizer or Dataset.

A Keras script ported to tfgpu starts with ``import tfgpu``. When its process is one of several workers
(``tfgpu.launch``, TF_CONFIG, Slurm) or sees several GPUs, that import creates the strategy every device of the job
trains under (MultiWorkerMirroredStrategy, or MirroredStrategy over the local GPUs) and makes it the process default
(``tf.distribute.experimental_set_strategy``). So every Keras object the script makes afterwards lives in it, as if
the whole script ran inside ``strategy.scope()``: ``tfgpu.fit`` trains the user's own model object, and the script's
Datasets, metrics and callbacks keep working before and after it (``tfgpu``'s ``__init__`` also applies
``keras_fit.patch()`` and ``replica_batches.patch()``, so that the script's own ``model.evaluate``/``predict`` run
there and give one device's answer for any batch size).

On one device nothing is made: Keras' default strategy is the one ``tfgpu.fit`` uses. tfgpu's own commands
(``python -m tfgpu.X``, the ``tfgpu-X`` scripts) build their strategy from their flags instead (``runtime.distribute``).
Importing this module loads no TensorFlow; ``at_import`` loads it only when there is a strategy to make.
"""
import logging
import os
import sys

from tfgpu.config import ConfigError

log = logging.getLogger("tfgpu")

MOVE_IMPORT_UP = "put `import tfgpu` first in the script, before anything that imports TensorFlow or Keras' objects"
_JOB = {}  # "strategy": the strategy made at import; "desc": its cluster description (None on one host)


def is_command(argv=None) -> bool:
    """Whether this process is one of tfgpu's commands, which make their own strategy from flags: ``python -m
    tfgpu.X`` (while Python locates the module, ``sys.argv[0]`` is ``-m``) or a ``tfgpu-X`` console script."""
    argv = sys.argv if argv is None else argv
    first = argv[0] if argv else ""
    return first == "-m" or os.path.basename(first).startswith("tfgpu-")


def visible_gpus_hint(environ=None) -> int:
    """How many GPUs this process could see, from the device files and CUDA_VISIBLE_DEVICES, without loading
    TensorFlow (a laptop's ``import tfgpu`` stays cheap); TensorFlow's own count decides once it is loaded."""
    environ = os.environ if environ is None else environ
    devices = [name for name in _listdir("/dev") if name.startswith("nvidia") and name[6:].isdigit()]
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return min(len(devices), len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"]))
    return len(devices)


def _listdir(path: str) -> list:
    try:
        return os.listdir(path)
    except OSError:
        return []


def at_import(environ=None, argv=None):
    """What ``import tfgpu`` does: make the job's strategy when this process is a script that is one of several
    workers or has several GPUs, and return it; None otherwise. A malformed TF_CONFIG or Slurm environment, or
    TensorFlow already started by the script, raises ``ConfigError`` in one line."""
    environ = os.environ if environ is None else environ
    if _JOB or is_command(argv) or environ.get("TFGPU_NO_JOB_STRATEGY"):
        return None
    from tfgpu.runtime import cluster

    try:
        desc = cluster.resolve_cluster("auto", environ)
    except ValueError as e:
        raise ConfigError("cluster", str(e)) from None
    if desc is None and visible_gpus_hint(environ) < 2:
        return None
    return make(desc)


def make(desc=None):
    """Makes the job's strategy for cluster ``desc`` (None: this host alone) and sets it as the process default;
    returns it. Once per process."""
    if _JOB:
        return _JOB["strategy"]
    import tensorflow as tf
    from tensorflow.python.eager import context

    if desc is None and len(tf.config.list_physical_devices("GPU")) < 2:
        return None
    if context.context()._context_handle is not None:  # the runtime started: collectives can no longer be set up
        raise ConfigError("import tfgpu", f"TensorFlow started before tfgpu could make the job's strategy; "
                          f"{MOVE_IMPORT_UP}")
    if desc is not None and desc["num_workers"] > 1:
        from tfgpu.runtime import cluster

        log.info("%s", cluster.describe(desc))
        strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=cluster.make_cluster_resolver(desc))
    else:
        strategy = tf.distribute.MirroredStrategy()
    tf.distribute.experimental_set_strategy(strategy)
    from tfgpu.runtime import keras_variables

    keras_variables.read_as_numbers()  # float(metric.result()) as on one device
    _JOB.update(strategy=strategy, desc=desc)
    return strategy


def strategy():
    """The strategy ``import tfgpu`` made, or None (one device, or a tfgpu command)."""
    return _JOB.get("strategy")


def cluster_desc():
    """The cluster description the job's strategy was made for (None: one host, or no job strategy)."""
    return _JOB.get("desc")
