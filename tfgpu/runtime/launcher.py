"""What N MultiWorkerMirroredStrategy workers on one host are given: the command, ports and TF_CONFIG, each
worker's GPUs and cores, the group sizes the global batch allows, and the exit-code rules. The processes
themselves are ``runtime/supervisor.py``'s; ``python -m tfgpu.launch`` (``tfgpu/launch.py``) parses its flags
and hands them to ``supervisor.Launcher``.
"""
import contextlib
import json
import os
import re
import signal
import subprocess

from tfgpu.runtime import failures as exit_codes  # the one table of exit codes (loads no TensorFlow)

LAST_LINES = 20


class LaunchError(Exception):
    """A bad launcher flag or host setting, found before any worker starts."""


def worker_command(args, worker_args) -> list:
    """``python -m <--module> <worker args>`` (``tfgpu.train`` by default); or, without ``--module``, when the worker
    args start with a program rather than a flag (``-- python script.py``), that command as given (a tfgpu.fit
    script run by every worker). With ``--module`` every worker arg goes to the module, positional ones too."""
    module = getattr(args, "module", None)
    if module is None and worker_args and not worker_args[0].startswith("-"):
        return list(worker_args)
    return [args.python, "-m", module or "tfgpu.train", *worker_args]


def core_sets(num_workers: int, cores_per_worker: int, available=None):
    """Disjoint core sets, one per worker, from the cores this process may run on (sorted)."""
    if cores_per_worker <= 0:
        return [None] * num_workers
    available = sorted(os.sched_getaffinity(0) if available is None else available)
    needed = num_workers * cores_per_worker
    if needed > len(available):
        raise LaunchError(f"--cpu_cores_per_worker={cores_per_worker} x --num_workers={num_workers} needs {needed} "
                          f"cores but this process may use {len(available)} ({_ranges(available)})")
    return [set(available[i * cores_per_worker:(i + 1) * cores_per_worker]) for i in range(num_workers)]


def _ranges(cores):
    return ",".join(map(str, cores))


# -- GPUs: each worker gets its own share --------------------------------------------------------------------------

def parse_visible_devices(value: str) -> list:
    """CUDA_VISIBLE_DEVICES as CUDA reads it: indices or GPU-/MIG- UUIDs, cut at the first negative index
    ("-1" hides every GPU); a device listed twice is an error rather than two workers on one GPU."""
    devices = []
    for entry in (e.strip() for e in value.split(",")):
        if not entry or entry.startswith("-"):
            break
        if entry in devices:
            raise LaunchError(f"CUDA_VISIBLE_DEVICES={value!r} lists GPU {entry} twice")
        devices.append(entry)
    return devices


def parse_nvidia_smi_list(text: str) -> list:
    """The devices ``nvidia-smi -L`` lists, as CUDA_VISIBLE_DEVICES entries: a GPU's index, or the UUIDs of its
    MIG instances when it is partitioned (CUDA then sees the instances, not the GPU)."""
    devices, current, migs = [], None, []
    for line in text.splitlines():
        gpu = re.match(r"GPU (\d+):", line.strip())
        mig = re.search(r"\(UUID: (MIG-[^)]+)\)", line)
        if gpu:
            if current is not None:
                devices += migs or [current]
            current, migs = gpu.group(1), []
        elif mig and current is not None:
            migs.append(mig.group(1))
    if current is not None:
        devices += migs or [current]
    return devices


def host_gpus(environ=None) -> tuple:
    """(devices, where they came from): the launcher's CUDA_VISIBLE_DEVICES when set, else what the driver
    reports (``nvidia-smi -L``, else /proc/driver/nvidia/gpus); ([], ...) on a host without NVIDIA GPUs."""
    environ = os.environ if environ is None else environ
    if "CUDA_VISIBLE_DEVICES" in environ:
        return parse_visible_devices(environ["CUDA_VISIBLE_DEVICES"]), \
            f"CUDA_VISIBLE_DEVICES={environ['CUDA_VISIBLE_DEVICES']}"
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                timeout=30, check=True).stdout
        return parse_nvidia_smi_list(listed), "nvidia-smi -L"
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        count = len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        count = 0
    return [str(i) for i in range(count)], "/proc/driver/nvidia/gpus"


def gpu_sets(num_workers: int, gpus_per_worker: int, devices: list, source: str = "this host") -> list:
    """Each worker's CUDA_VISIBLE_DEVICES value: disjoint, consecutive slices of ``devices``; ``""`` hides every
    GPU (``--gpus_per_worker=0``); None leaves the variable alone (a host without GPUs, default split).

    Without this every worker would see every GPU, and all of them would start on GPU 0."""
    n, k = num_workers, gpus_per_worker
    if k == 0:
        return [""] * n
    if not devices:
        if k > 0:
            raise LaunchError(f"--gpus_per_worker={k} but no GPU is visible ({source})")
        return [None] * n
    if k < 0:
        if len(devices) % n:
            divisors = [d for d in range(1, len(devices) + 1) if len(devices) % d == 0]
            raise LaunchError(f"--num_workers={n} does not divide the {len(devices)} GPUs visible ({source}): pass "
                              f"--gpus_per_worker=K with K x {n} <= {len(devices)}, a --num_workers among "
                              f"{','.join(map(str, divisors))}, or --gpus_per_worker=0 for CPU workers")
        k = len(devices) // n
    elif k * n > len(devices):
        raise LaunchError(f"--gpus_per_worker={k} x --num_workers={n} needs {k * n} GPUs but {len(devices)} "
                          f"are visible ({source})")
    return [",".join(devices[i * k:(i + 1) * k]) for i in range(n)]


def free_ports(n: int) -> list:
    """n distinct free TCP ports on this host (portpicker when installed, else the kernel's choice)."""
    try:
        import portpicker
    except ImportError:
        portpicker = None
    ports = []
    while len(ports) < n:
        if portpicker is not None:
            port = portpicker.pick_unused_port()
        else:
            import socket
            with socket.socket() as s:
                s.bind(("", 0))
                port = s.getsockname()[1]
        if port not in ports:
            ports.append(port)
    return ports


def tf_configs(host: str, ports: list) -> list:
    """One TF_CONFIG JSON string per worker: a workers-only cluster, worker 0 is the chief."""
    cluster = {"worker": [f"{host}:{p}" for p in ports]}
    return [json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}}) for i in range(len(ports))]


def exit_code(returncode: int) -> int:
    """A Popen returncode as a shell would report it: killed by signal s → 128 + s."""
    return 128 - returncode if returncode < 0 else returncode


def worst_exit_code(codes) -> int:
    """The code a whole job reports: a real failure beats 143 (saved after SIGTERM), which beats 0."""
    codes = [c for c in codes if c is not None]
    failures = [c for c in codes if c not in (exit_codes.OK, exit_codes.PREEMPTED)]
    if failures:
        return failures[0]
    return exit_codes.PREEMPTED if exit_codes.PREEMPTED in codes else exit_codes.OK


def _child_setup(cores):
    """Runs in the child between fork and exec: die with the launcher, then pin cores."""
    def setup():
        with contextlib.suppress(Exception):
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG: no orphaned workers if the launcher is killed
        if cores:
            os.sched_setaffinity(0, cores)
    return setup


def batch_rule(batches, gpus_per_worker_share):
    """``fits(n)``: whether n workers divide the workers' global and eval batches over their replicas.
    ``batches``: (global batch, eval batch, CPU logical devices) as the launch command read them from the workers'
    tfgpu.train flags (``tfgpu.launch.train_batches``); None (another program, flags that do not parse) fits any
    n. ``gpus_per_worker_share``: one worker's CUDA_VISIBLE_DEVICES."""
    if batches is None:
        return lambda n: True
    global_batch, eval_batch, cpu_logical_devices = batches
    gpus = len(gpus_per_worker_share.split(",")) if gpus_per_worker_share else 0
    replicas = cpu_logical_devices or gpus or 1
    return lambda n: all(b % (n * replicas) == 0 for b in (global_batch, eval_batch))
