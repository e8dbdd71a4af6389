"""Slurm's view of a multi-worker job: which workers a step has, at which addresses, and which one is us.

Slurm's variables describe the step (node list, tasks per node, this task's rank); block distribution (the
default) gives ranks in node-list order, each node's tasks consecutively, on ports from
``slurm_port_base``. ``tfgpu.runtime.cluster`` turns the result into the job description.
"""
import re


# Where Slurm says how many tasks there are, most specific first (a step may use fewer tasks than its job).
NUM_TASKS_VARS = ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS")


def num_tasks(environ) -> int:
    """Tasks in this Slurm step (1 outside one)."""
    name = next((n for n in NUM_TASKS_VARS if environ.get(n)), None)
    return 1 if name is None else _slurm_int(environ, name)


def _slurm_int(environ, name: str) -> int:
    raw = environ[name]
    if not raw.strip().isdigit():
        raise ValueError(f"{name}={raw!r} is not a number")
    return int(raw)


def _slurm_var(environ, *names):
    for name in names:
        if environ.get(name):
            return environ[name]
    raise ValueError(f"{names[0]} is not set: start tfgpu with srun inside the Slurm job (one srun task per worker)")


def worker_addresses(environ, required: bool):
    """(addresses of every worker in rank order, this task's rank) from the Slurm step's variables, or None
    outside a multi-task srun step (unless ``required``); ValueError naming the variable when they disagree."""
    if not environ.get("SLURM_JOB_ID"):
        if required:
            raise ValueError("--cluster=slurm but SLURM_JOB_ID is not set: not running inside a Slurm job")
        return None
    tasks = num_tasks(environ)
    if tasks <= 1:
        return None
    if not (environ.get("SLURM_STEP_ID") or environ.get("SLURM_STEPID")):
        # The batch script itself is one process; only `srun` starts one process per task.
        raise ValueError(f"the Slurm job has {tasks} tasks but this process is not in an srun step: start "
                         "training with `srun python -m tfgpu.train ...` (or pass --cluster=tf_config to train "
                         "alone)")
    _slurm_var(environ, "SLURM_PROCID")
    rank = _slurm_int(environ, "SLURM_PROCID")
    hosts = expand_hostlist(_slurm_var(environ, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"))
    duplicates = sorted({h for h in hosts if hosts.count(h) > 1})
    if duplicates:
        raise ValueError(f"Slurm node list names {duplicates[0]} more than once ({','.join(hosts)}): workers on it "
                         "would share addresses")
    if environ.get("SLURM_STEP_NODELIST") and environ.get("SLURM_STEP_NUM_NODES"):
        if _slurm_int(environ, "SLURM_STEP_NUM_NODES") != len(hosts):
            raise ValueError(f"SLURM_STEP_NUM_NODES={environ['SLURM_STEP_NUM_NODES']} disagrees with "
                             f"SLURM_STEP_NODELIST={environ['SLURM_STEP_NODELIST']} ({len(hosts)} nodes)")
    tasks_per_node = expand_tasks_per_node(
        _slurm_var(environ, "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"))
    if len(tasks_per_node) == 1 and len(hosts) > 1:
        tasks_per_node *= len(hosts)
    if len(tasks_per_node) != len(hosts):
        raise ValueError(f"Slurm gives {len(hosts)} nodes ({','.join(hosts)}) but tasks-per-node for "
                         f"{len(tasks_per_node)}: {tasks_per_node}")
    if sum(tasks_per_node) != tasks:
        raise ValueError(f"Slurm tasks per node {tasks_per_node} add up to {sum(tasks_per_node)}, not the "
                         f"{tasks} tasks of the step")
    if not 0 <= rank < tasks:
        raise ValueError(f"SLURM_PROCID={rank} is out of range for {tasks} tasks")
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
    local_rank = rank - owners.index(owners[rank])
    if environ.get("SLURM_LOCALID") and _slurm_int(environ, "SLURM_LOCALID") != local_rank:
        raise ValueError(f"SLURM_LOCALID={environ['SLURM_LOCALID']} but block distribution makes task {rank} the "
                         f"task {local_rank} of {owners[rank]}: run srun with --distribution=block (the default)")
    return addresses, rank


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
