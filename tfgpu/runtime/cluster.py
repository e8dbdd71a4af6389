"""Who is in a multi-worker job and which task this process is, from TF_CONFIG or Slurm.

``resolve_cluster`` reads the environment once and returns a plain dict that the
rest of tfgpu (``distribute.py``, ``job_strategy.py``) and the logs can use; it has
no side effects. ``make_cluster_resolver`` turns that dict into the
``ClusterResolver`` that ``MultiWorkerMirroredStrategy`` takes. Malformed
environments raise ``ValueError`` with a one-line message naming the variable.
``resolve_for_run`` adds what a training run needs on top: the strategy and the
cluster source must agree with the environment, so that N processes never train
as N independent chiefs writing into one model_dir.

A description looks like::

    {"cluster_spec": {"worker": ["node01:12340", "node02:12340"]}, "task_type": "worker",
     "task_id": 1, "num_workers": 2, "worker_index": 1, "is_chief": False, "rpc_layer": "grpc", "source": "slurm"}
"""
import json
import os
import re
import sys

from tfgpu.config import ConfigError
from tfgpu.runtime import slurm

SOURCES = ("auto", "tf_config", "slurm")
# Task types that run training steps; "ps" and "evaluator" tasks take no part in MWMS collectives.
TRAINING_TASK_TYPES = ("chief", "worker")
# Every task type a TF_CONFIG may name: evaluators are tolerated (and ignored), ps is refused with its own message.
KNOWN_TASK_TYPES = TRAINING_TASK_TYPES + ("evaluator", "ps")
# Strategies that train this process on its own, whatever the cluster says.
SINGLE_WORKER_STRATEGIES = ("one_device", "mirrored")


def resolve_cluster(source: str = "auto", environ=None):
    """The cluster this process belongs to, or None when it trains alone.

    ``source``: ``tf_config`` reads TF_CONFIG, ``slurm`` the variables ``srun`` sets, ``auto`` takes TF_CONFIG
    when it names more than one task, else Slurm when the job has more than one task."""
    environ = os.environ if environ is None else environ
    if source not in SOURCES:
        raise ValueError(f"cluster source must be one of {', '.join(SOURCES)}, got {source!r}")
    if source == "tf_config":
        return _from_tf_config(environ)
    if source == "slurm":
        return _from_slurm(environ, required=True)
    if environ.get("TF_CONFIG", "").strip():
        desc = _from_tf_config(environ)
        if desc is not None:
            return desc
    if environ.get("SLURM_JOB_ID") and slurm.num_tasks(environ) > 1:
        return _from_slurm(environ, required=False)
    return None


def resolve_for_run(source: str, distribution_strategy: str, environ=None):
    """``resolve_cluster`` for a training run: the description, or ConfigError naming the flag to change.

    Refuses the two ways several processes end up training as independent chiefs into one model_dir: a
    single-worker strategy (``one_device``, ``mirrored``) in a cluster of several workers, and a ``--cluster``
    source that says "alone" while the other source starts this process as one of several. Needs no TensorFlow,
    so it runs before any device or data work."""
    environ = os.environ if environ is None else environ
    try:
        desc = resolve_cluster(source, environ)
    except ValueError as e:
        raise ConfigError("cluster", str(e)) from None
    if desc is not None and desc["num_workers"] > 1 and distribution_strategy in SINGLE_WORKER_STRATEGIES:
        raise ConfigError("distribution_strategy", (
            f"{distribution_strategy} trains this process on its own, but {_describer(desc, environ)} describes "
            f"{desc['num_workers']} workers (this is {desc['task_type']} {desc['task_id']}): they would train "
            f"{desc['num_workers']} independent models into one --model_dir; pass "
            f"--distribution_strategy=multi_worker_mirrored (or auto), or {_how_to_train_alone(desc)}"))
    if desc is None and source in ("tf_config", "slurm"):
        other = _other_source(source, environ)
        if other is not None and other["num_workers"] > 1:
            raise ConfigError("cluster", (
                f"--cluster={source} trains this process alone, but {_describer(other, environ)} starts it as "
                f"{other['task_type']} {other['task_id']} of {other['num_workers']} workers: they would train "
                f"{other['num_workers']} independent models into one --model_dir; pass "
                f"--cluster={other['source']} (or auto), or {_how_to_train_alone(other)}"))
    if desc is not None and desc["num_workers"] > 1:
        check_own_port(desc)
    return desc


def check_own_port(desc) -> None:
    """ConfigError when this worker's port is already taken on this host, before TensorFlow starts (its gRPC
    server fails there too, but only after the runtime has started: tens of seconds on a loaded host).
    SO_REUSEADDR, as a server binds: a port a restarted worker's predecessor left in TIME_WAIT is free."""
    import errno
    import socket

    address = desc["cluster_spec"][desc["task_type"]][desc["task_id"]]
    port = address.rsplit(":", 1)[-1]
    if not port.isdigit():
        return  # TensorFlow's own check names it
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", int(port)))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise ConfigError("cluster", f"this worker cannot serve on {address}: port {port} is in use on "
                                  "this host (another job, or a worker of this one still running?)") from None


def _describer(desc, environ) -> str:
    """The environment variable that says how many workers there are, for error messages."""
    if desc["source"] == "tf_config":
        return "TF_CONFIG"
    name = next((n for n in slurm.NUM_TASKS_VARS if environ.get(n)), slurm.NUM_TASKS_VARS[0])
    return f"Slurm ({name}={environ.get(name, '?')})"


def _how_to_train_alone(desc) -> str:
    if desc["source"] == "tf_config":
        return "unset TF_CONFIG to train one worker alone"
    return "start a single Slurm task (srun --ntasks=1) to train one worker alone"


def _other_source(source: str, environ):
    """What the source not chosen would describe; None when it describes nothing usable."""
    other = "slurm" if source == "tf_config" else "tf_config"
    if other == "slurm" and not environ.get("SLURM_JOB_ID"):
        return None
    try:
        return resolve_cluster(other, environ)
    except ValueError:  # e.g. a multi-task batch script outside srun: one process, not several
        return None


def is_chief(desc) -> bool:
    """True for the task that alone writes checkpoints, summaries and reports: the chief, else worker 0."""
    if desc is None:
        return True
    return is_chief_task(desc["cluster_spec"], desc["task_type"], desc["task_id"])


def is_chief_task(cluster_spec: dict, task_type, task_id) -> bool:
    """The chief rule on raw parts: task type "chief", or worker 0 when the cluster has no chief."""
    if task_type is None:  # a process outside any cluster
        return True
    if task_type == "chief":
        return True
    return task_type == "worker" and int(task_id) == 0 and not cluster_spec.get("chief")


def make_cluster_resolver(desc):
    """A ``tf.distribute.cluster_resolver.ClusterResolver`` for ``desc`` (for MultiWorkerMirroredStrategy)."""
    import tensorflow as tf

    if desc is None:
        raise ValueError("no cluster: this process trains alone, it needs no cluster resolver")
    if desc["source"] == "tf_config":
        # TensorFlow's own resolver reads the same TF_CONFIG again; it also tells the strategy about
        # evaluator tasks and session settings that a plain ClusterSpec would drop.
        return tf.distribute.cluster_resolver.TFConfigClusterResolver()
    # Slurm: the addresses are already resolved here. TensorFlow's SlurmClusterResolver would sort hosts
    # (so ranks can disagree with Slurm's own order), call nvidia-smi and set CUDA_VISIBLE_DEVICES; leave
    # GPU binding to Slurm (--gpus-per-task / --gpu-bind) instead.
    return tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(desc["cluster_spec"]), task_type=desc["task_type"], task_id=desc["task_id"],
        rpc_layer=desc["rpc_layer"])


def describe(desc) -> str:
    """One log line: where this task sits in the cluster."""
    if desc is None:
        return "cluster: single worker"
    role = " (chief)" if desc["is_chief"] else ""
    return (f"cluster: {desc['num_workers']} workers from {desc['source']}, this is "
            f"{desc['task_type']} {desc['task_id']}{role} at "
            f"{desc['cluster_spec'][desc['task_type']][desc['task_id']]}")


def _describe(cluster_spec, task_type, task_id, source, rpc_layer="grpc"):
    desc = {
        "cluster_spec": cluster_spec,
        "task_type": task_type,
        "task_id": task_id,
        "num_workers": sum(len(cluster_spec.get(t, ())) for t in TRAINING_TASK_TYPES),
        # Rank among the training tasks (chief first): what data sharding and per-worker logs use.
        "worker_index": (task_id + len(cluster_spec.get("chief", ())) if task_type == "worker" else task_id),
        "rpc_layer": rpc_layer or "grpc",
        "source": source,
    }
    desc["is_chief"] = is_chief(desc)
    return desc


# -- TF_CONFIG ------------------------------------------------------------------------------------------------------

def _from_tf_config(environ):
    raw = environ.get("TF_CONFIG", "").strip()
    if not raw:
        return None
    try:
        tf_config = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ValueError(f"TF_CONFIG is not valid JSON ({e.msg} at character {e.pos}): {raw[:200]!r}") from None
    if not isinstance(tf_config, dict):
        raise ValueError(f"TF_CONFIG must be a JSON object with 'cluster' and 'task', got {raw[:200]!r}")
    cluster_spec = tf_config.get("cluster") or {}
    if not isinstance(cluster_spec, dict) or not all(
            isinstance(v, list) and all(isinstance(a, str) and a for a in v) for v in cluster_spec.values()):
        raise ValueError(f"TF_CONFIG 'cluster' must map task types to lists of 'host:port' strings, "
                         f"got {json.dumps(cluster_spec)[:200]}")
    unknown = [t for t in cluster_spec if t not in KNOWN_TASK_TYPES]
    if unknown:
        raise ValueError(f"TF_CONFIG cluster has task type {unknown[0]!r}; tfgpu knows "
                         f"{', '.join(KNOWN_TASK_TYPES)} (MultiWorkerMirroredStrategy trains chief and worker tasks)")
    seen = {}
    for task_type, addresses in cluster_spec.items():
        for index, address in enumerate(addresses):
            if not re.fullmatch(r"\S+:\d{1,5}", address):
                raise ValueError(f"TF_CONFIG cluster.{task_type} address {address!r} is not 'host:port'")
            if address in seen:
                raise ValueError(f"TF_CONFIG gives address {address} to both {seen[address]} and "
                                 f"{task_type} {index}: each task needs its own host:port")
            seen[address] = f"{task_type} {index}"
    rpc_layer = tf_config.get("rpc_layer")
    if rpc_layer is not None and not isinstance(rpc_layer, str):
        raise ValueError(f"TF_CONFIG 'rpc_layer' must be a string such as \"grpc\", got {json.dumps(rpc_layer)}")
    num_tasks = sum(len(v) for v in cluster_spec.values())
    if num_tasks == 0:
        return None  # no cluster at all
    task = tf_config.get("task")
    if task is None and num_tasks == 1:
        return None  # a one-task cluster trains alone
    if not isinstance(task, dict) or "type" not in task or "index" not in task:
        raise ValueError(f"TF_CONFIG needs 'task': {{'type': ..., 'index': ...}} for a cluster of {num_tasks} tasks, "
                         f"got {json.dumps(task)}")
    task_type, task_id = task["type"], task["index"]
    if not isinstance(task_type, str) or task_type not in cluster_spec:
        raise ValueError(f"TF_CONFIG task type {task_type!r} is not in the cluster ({', '.join(cluster_spec)})")
    if isinstance(task_id, str) and task_id.isdigit():
        task_id = int(task_id)
    if not isinstance(task_id, int) or isinstance(task_id, bool) or not 0 <= task_id < len(cluster_spec[task_type]):
        raise ValueError(f"TF_CONFIG task index {task['index']!r} is out of range: cluster has "
                         f"{len(cluster_spec[task_type])} {task_type} task(s), valid indices 0.."
                         f"{len(cluster_spec[task_type]) - 1}")
    if task_type not in TRAINING_TASK_TYPES:
        hint = " (evaluate a run's checkpoints with python -m tfgpu.evaluate)" if task_type == "evaluator" else ""
        raise ValueError(f"TF_CONFIG makes this process the {task_type} task {task_id}: tfgpu.train runs chief and "
                         f"worker tasks only{hint}")
    if num_tasks == 1:
        return None  # a one-task cluster trains alone
    if not any(cluster_spec.get(t) for t in TRAINING_TASK_TYPES):
        raise ValueError(f"TF_CONFIG cluster has no chief or worker tasks: {', '.join(cluster_spec)}")
    if cluster_spec.get("ps"):
        raise ValueError("TF_CONFIG has 'ps' tasks: parameter-server clusters are not supported, "
                         "MultiWorkerMirroredStrategy takes chief and worker tasks")
    if len(cluster_spec.get("chief", ())) > 1:
        raise ValueError(f"TF_CONFIG cluster has {len(cluster_spec['chief'])} chief tasks; at most one is allowed")
    return _describe(cluster_spec, task_type, task_id, "tf_config", rpc_layer)


# -- Kubernetes Indexed Job -----------------------------------------------------------------------------------------

# Set in every pod by tools/k8s/indexed_job.py and jobset.py; Kubernetes itself sets JOB_COMPLETION_INDEX.
INDEXED_JOB_VARS = ("TFGPU_K8S_JOB", "TFGPU_K8S_SERVICE", "TFGPU_K8S_WORKERS")
INDEXED_JOB_PORT = 2222


def indexed_job_tf_config(environ) -> str:
    """TF_CONFIG (JSON) for one pod of a Kubernetes Indexed Job, computed from its completion index.

    Pod i of Job J whose template names the headless Service S as its subdomain is reachable as ``J-i.S``, so
    every pod can list the same workers in index order without an operator injecting anything: pod i is worker i
    and pod 0 the chief. ``python -m tfgpu.runtime.cluster`` prints it for the pod's entrypoint to export."""
    for name in INDEXED_JOB_VARS + ("JOB_COMPLETION_INDEX",):
        if not environ.get(name, "").strip():
            raise ValueError(f"{name} is not set: run this in a pod of the Indexed Job rendered by tools/k8s")
    for name in ("TFGPU_K8S_JOB", "TFGPU_K8S_SERVICE"):
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", environ[name]):
            raise ValueError(f"{name}={environ[name]!r} is not a DNS label (lowercase letters, digits, '-')")
    numbers = {}
    for name, default in (("TFGPU_K8S_WORKERS", None), ("JOB_COMPLETION_INDEX", None),
                          ("TFGPU_K8S_PORT", INDEXED_JOB_PORT)):
        raw = environ.get(name, "").strip() or str(default)
        if not raw.isdigit():
            raise ValueError(f"{name}={raw!r} is not a number")
        numbers[name] = int(raw)
    workers, index, port = numbers["TFGPU_K8S_WORKERS"], numbers["JOB_COMPLETION_INDEX"], numbers["TFGPU_K8S_PORT"]
    if workers < 1 or not 1 <= port <= 65535:
        raise ValueError(f"TFGPU_K8S_WORKERS={workers} must be at least 1 and TFGPU_K8S_PORT={port} a port")
    if index >= workers:
        raise ValueError(f"JOB_COMPLETION_INDEX={index} is out of range for TFGPU_K8S_WORKERS={workers}")
    job, service = environ["TFGPU_K8S_JOB"], environ["TFGPU_K8S_SERVICE"]
    return json.dumps({"cluster": {"worker": [f"{job}-{i}.{service}:{port}" for i in range(workers)]},
                       "task": {"type": "worker", "index": index}})


def _print_indexed_job_tf_config() -> int:
    try:
        print(indexed_job_tf_config(os.environ))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


# -- Slurm ----------------------------------------------------------------------------------------------------------


def _from_slurm(environ, required: bool):
    found = slurm.worker_addresses(environ, required)
    if found is None:
        return None
    addresses, rank = found
    return _describe({"worker": addresses}, "worker", rank, "slurm")


if __name__ == "__main__":
    sys.exit(_print_indexed_job_tf_config())
