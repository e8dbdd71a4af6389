"""The job's strategy, made when a script imports tfgpu: before the script's first model, optimizer or Dataset.

A Keras script ported to tfgpu starts with ``import tfgpu``. When its process is one of several workers
(``tfgpu.launch``, TF_CONFIG, Slurm) or sees several GPUs, that import creates the strategy every device of the job
trains under (MultiWorkerMirroredStrategy, or MirroredStrategy over the local GPUs) and makes it the process default
(``tf.distribute.experimental_set_strategy``). So every Keras object the script makes afterwards lives in it, as if
the whole script ran inside ``strategy.scope()``: ``tfgpu.fit`` trains the user's own model object, and the script's
Datasets, metrics and callbacks keep working before and after it (``tfgpu``'s ``__init__`` also applies
``keras_adapter.adapt_script()``, as ``tfgpu.fit`` does, so that the script's own ``model.evaluate``/``predict`` run
there and give one device's answer for any batch size).

``TFGPU_CPU_REPLICAS=N`` is a dry run of the N-GPU path on any machine: the import splits the CPU into N logical
devices and makes the MirroredStrategy over them that a host of N GPUs gets (the first log line says
``replicas=N``), so a script can be tried on several replicas before GPUs are rented.

On one device nothing is made: Keras' default strategy is the one ``tfgpu.fit`` uses. tfgpu's own commands
(``python -m tfgpu.X``, the ``tfgpu-X`` scripts) build their strategy from their flags instead (``runtime.distribute``).
Importing this module loads no TensorFlow; ``at_import`` loads it only when there is a strategy to make.
"""
import logging
import os
import sys

from tfgpu.config import ConfigError, RuntimeConfig

log = logging.getLogger("tfgpu")

MOVE_IMPORT_UP = "put `import tfgpu` first in the script, before anything that imports TensorFlow or Keras' objects"
CPU_REPLICAS_ENV = "TFGPU_CPU_REPLICAS"
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
    if desc is not None and desc["num_workers"] > 1:
        cluster.check_own_port(desc)  # before TensorFlow starts
    replicas = cpu_replicas(environ, desc)
    if replicas is not None:
        return make(desc, cpu_replicas=replicas) if replicas > 1 else None
    if desc is None and visible_gpus_hint(environ) < 2:
        return None
    return make(desc)


def cpu_replicas(environ, desc=None):
    """The number of logical CPU replicas ``TFGPU_CPU_REPLICAS`` asks for (None: unset). A value that is not a
    whole number from 1 to 64, or one set in a process that is one of several workers, is a ConfigError naming
    the variable."""
    raw = environ.get(CPU_REPLICAS_ENV)
    if raw is None or raw.strip() == "":
        return None
    try:
        replicas = int(raw)
    except ValueError:
        replicas = 0
    if not 1 <= replicas <= 64:
        raise ConfigError(CPU_REPLICAS_ENV, f"must be a whole number of replicas from 1 to 64, got {raw!r}")
    if desc is not None and desc["num_workers"] > 1:
        raise ConfigError(CPU_REPLICAS_ENV, f"dry-runs the GPUs of one host, but this process is worker "
                          f"{desc['worker_index']} of {desc['num_workers']}; unset {CPU_REPLICAS_ENV} in a "
                          "multi-worker job")
    return replicas


def make(desc=None, cpu_replicas: int = 0):
    """Makes the job's strategy for cluster ``desc`` (None: this host alone) and sets it as the process default;
    returns it. Once per process. ``cpu_replicas`` > 1: a MirroredStrategy over that many logical CPU devices, as
    over that many GPUs (``TFGPU_CPU_REPLICAS``)."""
    if _JOB:
        return _JOB["strategy"]
    import tensorflow as tf
    from tensorflow.python.eager import context

    if desc is None and not cpu_replicas and len(tf.config.list_physical_devices("GPU")) < 2:
        return None
    if context.context()._context_handle is not None:  # the runtime started: collectives can no longer be set up
        raise ConfigError("import tfgpu", f"TensorFlow started before tfgpu could make the job's strategy; "
                          f"{MOVE_IMPORT_UP}")
    from tfgpu.runtime import distribute

    several_workers = desc is not None and desc["num_workers"] > 1
    settings = RuntimeConfig.defaults(
        distribution_strategy="multi_worker_mirrored" if several_workers else "mirrored",
        cpu_logical_devices=cpu_replicas if cpu_replicas > 1 else 0)
    if cpu_replicas > 1:
        _say(f"tfgpu: replicas={cpu_replicas} ({CPU_REPLICAS_ENV}={cpu_replicas}: {cpu_replicas} logical CPU "
             f"devices stand in for {cpu_replicas} GPUs; MirroredStrategy as on a host of {cpu_replicas} GPUs)")
    distribute.configure_devices(settings)
    strategy = distribute.build_strategy(settings, desc).strategy
    tf.distribute.experimental_set_strategy(strategy)
    from tfgpu.runtime import keras_variables

    keras_variables.read_as_numbers()  # float(metric.result()) as on one device
    _JOB.update(strategy=strategy, desc=desc)
    return strategy


def _say(line: str) -> None:
    """One line to the log, or to stderr when the script has set up no logging yet (at import it usually has not)."""
    if logging.getLogger("tfgpu").handlers or logging.getLogger().handlers:
        log.info("%s", line)
    else:
        print(line, file=sys.stderr, flush=True)


def strategy():
    """The strategy ``import tfgpu`` made, or None (one device, or a tfgpu command)."""
    return _JOB.get("strategy")


def cluster_desc():
    """The cluster description the job's strategy was made for (None: one host, or no job strategy)."""
    return _JOB.get("desc")
