"""Who is in a multi-worker job and which task this process is, from TF_CONFIG or Slurm.

``resolve_cluster`` reads the environment once and returns a plain dict that the
rest of tfgpu (``distribute.py``, ``keras_fit.py``) and the logs can use; it has
no side effects. ``make_cluster_resolver`` turns that dict into the
``ClusterResolver`` that ``MultiWorkerMirroredStrategy`` takes. Malformed
environments raise ``ValueError`` with a one-line message naming the variable.

A description looks like::

    {"cluster_spec": {"worker": ["node01:12340", "node02:12340"]}, "task_type": "worker",
     "task_id": 1, "num_workers": 2, "worker_index": 1, "is_chief": False, "rpc_layer": "grpc", "source": "slurm"}
"""
import json
import os
import re

SOURCES = ("auto", "tf_config", "slurm")
# Task types that run training steps; "ps" and "evaluator" tasks take no part in MWMS collectives.
TRAINING_TASK_TYPES = ("chief", "worker")


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
    if environ.get("SLURM_JOB_ID") and _slurm_num_tasks(environ) > 1:
        return _from_slurm(environ, required=False)
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
    for task_type, addresses in cluster_spec.items():
        for address in addresses:
            if not re.fullmatch(r"\S+:\d{1,5}", address):
                raise ValueError(f"TF_CONFIG cluster.{task_type} address {address!r} is not 'host:port'")
    num_tasks = sum(len(v) for v in cluster_spec.values())
    if num_tasks <= 1:
        return None  # a one-task cluster trains alone
    task = tf_config.get("task")
    if not isinstance(task, dict) or "type" not in task or "index" not in task:
        raise ValueError(f"TF_CONFIG needs 'task': {{'type': ..., 'index': ...}} for a cluster of {num_tasks} tasks, "
                         f"got {json.dumps(task)}")
    task_type, task_id = task["type"], task["index"]
    if task_type not in cluster_spec:
        raise ValueError(f"TF_CONFIG task type {task_type!r} is not in the cluster ({', '.join(cluster_spec)})")
    if isinstance(task_id, str) and task_id.isdigit():
        task_id = int(task_id)
    if not isinstance(task_id, int) or isinstance(task_id, bool) or not 0 <= task_id < len(cluster_spec[task_type]):
        raise ValueError(f"TF_CONFIG task index {task['index']!r} is out of range: cluster has "
                         f"{len(cluster_spec[task_type])} {task_type} task(s), valid indices 0.."
                         f"{len(cluster_spec[task_type]) - 1}")
    if not any(cluster_spec.get(t) for t in TRAINING_TASK_TYPES):
        raise ValueError(f"TF_CONFIG cluster has no chief or worker tasks: {', '.join(cluster_spec)}")
    if cluster_spec.get("ps"):
        raise ValueError("TF_CONFIG has 'ps' tasks: parameter-server clusters are not supported, "
                         "MultiWorkerMirroredStrategy takes chief and worker tasks")
    if len(cluster_spec.get("chief", ())) > 1:
        raise ValueError(f"TF_CONFIG cluster has {len(cluster_spec['chief'])} chief tasks; at most one is allowed")
    return _describe(cluster_spec, task_type, task_id, "tf_config", tf_config.get("rpc_layer"))


# -- Slurm ----------------------------------------------------------------------------------------------------------

def _slurm_num_tasks(environ) -> int:
    raw = environ.get("SLURM_STEP_NUM_TASKS") or environ.get("SLURM_NTASKS") or environ.get("SLURM_NPROCS") or "1"
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"SLURM_NTASKS={raw!r} is not a number") from None


def _slurm_var(environ, *names):
    for name in names:
        if environ.get(name):
            return environ[name]
    raise ValueError(f"{names[0]} is not set: start tfgpu with srun inside the Slurm job (one srun task per worker)")


def _from_slurm(environ, required: bool):
    if not environ.get("SLURM_JOB_ID"):
        if required:
            raise ValueError("--cluster=slurm but SLURM_JOB_ID is not set: not running inside a Slurm job")
        return None
    num_tasks = _slurm_num_tasks(environ)
    if num_tasks <= 1:
        return None
    if not (environ.get("SLURM_STEP_ID") or environ.get("SLURM_STEPID")):
        # The batch script itself is one process; only `srun` starts one process per task.
        raise ValueError(f"the Slurm job has {num_tasks} tasks but this process is not in an srun step: start "
                         "training with `srun python -m tfgpu.train ...` (or pass --cluster=tf_config to train "
                         "alone)")
    rank = int(_slurm_var(environ, "SLURM_PROCID"))
    hosts = expand_hostlist(_slurm_var(environ, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"))
    tasks_per_node = expand_tasks_per_node(
        _slurm_var(environ, "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"))
    if len(tasks_per_node) == 1 and len(hosts) > 1:
        tasks_per_node *= len(hosts)
    if len(tasks_per_node) != len(hosts):
        raise ValueError(f"Slurm gives {len(hosts)} nodes ({','.join(hosts)}) but tasks-per-node for "
                         f"{len(tasks_per_node)}: {tasks_per_node}")
    if sum(tasks_per_node) != num_tasks:
        raise ValueError(f"Slurm tasks per node {tasks_per_node} add up to {sum(tasks_per_node)}, not the "
                         f"{num_tasks} tasks of the step")
    if not 0 <= rank < num_tasks:
        raise ValueError(f"SLURM_PROCID={rank} is out of range for {num_tasks} tasks")
    port_base = slurm_port_base(environ)
    # Slurm's default (block) distribution gives ranks in node-list order, each node's tasks consecutively.
    addresses, owners = [], []
    for host, count in zip(hosts, tasks_per_node):
        for local in range(count):
            addresses.append(f"{host}:{port_base + local}")
            owners.append(host)
    node = environ.get("SLURMD_NODENAME")
    if node and node != owners[rank]:
        raise ValueError(f"Slurm placed task {rank} on {node}, but block distribution puts it on {owners[rank]}: "
                         "run srun with --distribution=block (the default)")
    return _describe({"worker": addresses}, "worker", rank, "slurm")


def slurm_port_base(environ) -> int:
    """First port of this job's workers on each node: $TFGPU_SLURM_PORT_BASE, else one derived from the job id
    (so two jobs sharing a node rarely collide; each node uses port_base .. port_base + tasks_on_node - 1)."""
    raw = environ.get("TFGPU_SLURM_PORT_BASE")
    if raw:
        if not raw.isdigit() or not 1024 <= int(raw) <= 65000:
            raise ValueError(f"TFGPU_SLURM_PORT_BASE={raw!r} must be a port number in 1024..65000")
        return int(raw)
    return 12000 + int(re.sub(r"\D", "", environ["SLURM_JOB_ID"]) or 0) % 4000 * 10


def expand_hostlist(hostlist: str) -> list:
    """Slurm's compressed host list in order: ``"node[01-02,05],gpu3"`` → node01, node02, node05, gpu3."""
    hosts = []
    for part in _split_outside_brackets(hostlist.strip()):
        hosts.extend(_expand_host(part, hostlist))
    if not hosts:
        raise ValueError(f"Slurm node list {hostlist!r} is empty")
    return hosts


def _split_outside_brackets(text: str):
    depth, current = 0, ""
    for c in text:
        depth += (c == "[") - (c == "]")
        if c == "," and depth == 0:
            yield current
            current = ""
        else:
            current += c
    if current:
        yield current


def _expand_host(part: str, whole: str) -> list:
    m = re.fullmatch(r"([^\[\]]*)\[([^\[\]]+)\](.*)", part)
    if m is None:
        if "[" in part or "]" in part or not part:
            raise ValueError(f"Slurm node list {whole!r} has a malformed entry {part!r}")
        return [part]
    prefix, ranges, rest = m.groups()
    names = []
    for item in ranges.split(","):
        bounds = item.split("-")
        if len(bounds) > 2 or not all(b.isdigit() for b in bounds):
            raise ValueError(f"Slurm node list {whole!r} has a malformed range [{ranges}]")
        lo, hi = bounds[0], bounds[-1]
        names += [prefix + str(i).zfill(len(lo)) for i in range(int(lo), int(hi) + 1)]
    tails = _expand_host(rest, whole) if rest else [""]
    return [name + tail for name in names for tail in tails]


def expand_tasks_per_node(text: str) -> list:
    """Slurm's tasks-per-node string in order: ``"2(x3),1"`` → [2, 2, 2, 1]."""
    counts = []
    for part in text.strip().split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if m is None:
            raise ValueError(f"Slurm tasks-per-node {text!r} is malformed at {part!r}")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts
