"""Running N MultiWorkerMirroredStrategy workers on one host: ports, TF_CONFIG, each worker's GPUs and cores,
and supervision (output prefixed ``[worker i]``, failures and signals, exit codes). ``python -m tfgpu.launch``
(``tfgpu/launch.py``) parses its flags and hands them to ``Launcher``; see its docstring for the behaviour.
"""
import collections
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

from tfgpu.training import failures as exit_codes  # the one table of exit codes (loads no TensorFlow)

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


class Worker:
    """One worker process, the thread that copies its output and the last lines it printed."""

    def __init__(self, index, proc, out):
        self.index = index
        self.proc = proc
        self.last_lines = collections.deque(maxlen=LAST_LINES)
        self.exit_code = None
        self.exited_at = None  # monotonic time the process ended, to tell the first failure from its echoes
        self._reaped_group = False
        self._out = out
        self._reader = threading.Thread(target=self._copy_output, daemon=True)
        self._waiter = threading.Thread(target=self._wait, daemon=True)

    def start_threads(self):
        self._reader.start()
        self._waiter.start()

    def _wait(self):
        self.proc.wait()
        self.exited_at = time.monotonic()

    def _copy_output(self):
        prefix = f"[worker {self.index}] ".encode()
        for raw in iter(self.proc.stdout.readline, b""):
            line = raw.rstrip(b"\n")
            self.last_lines.append(line.decode("utf-8", "replace"))
            self._out(prefix + line + b"\n")
        self.proc.stdout.close()

    def finish_output(self, timeout=5.0):
        self._reader.join(timeout)

    def finish_waiter(self):
        self._waiter.join()

    def running(self):
        return self.exited_at is None

    def signal(self, signum):
        """Sends ``signum`` to the worker's whole process group (it started its own)."""
        if self._reaped_group:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signum)

    def kill_leftovers(self):
        """After the worker exited: SIGKILL anything it started that is still in its process group, once."""
        self.signal(signal.SIGKILL)
        self._reaped_group = True


class Launcher:
    """Starts and supervises the workers; ``run`` returns the job's exit code."""

    def __init__(self, args, worker_args, out=None, err=None):
        self.args = args
        self.worker_args = list(worker_args)
        self._out_lock = threading.Lock()
        self._stdout = out or sys.stdout.buffer
        self._stderr = err or sys.stderr
        self.workers = []
        self._signal = None

    def _write(self, data: bytes):
        with self._out_lock:
            self._stdout.write(data)
            self._stdout.flush()

    def say(self, message):
        with self._out_lock:
            print(f"tfgpu.launch: {message}", file=self._stderr, flush=True)

    def start(self):
        """Starts every worker; no thread of ours runs yet (preexec_fn is not thread-safe)."""
        n = self.args.num_workers
        cores = core_sets(n, self.args.cpu_cores_per_worker)
        gpus = gpu_sets(n, self.args.gpus_per_worker, *host_gpus())
        configs = tf_configs(self.args.host, free_ports(n))
        command = worker_command(self.args, self.worker_args)
        try:
            for index in range(n):
                env = {**os.environ, "TF_CONFIG": configs[index], "PYTHONUNBUFFERED": "1"}
                if gpus[index] is not None:
                    env["CUDA_VISIBLE_DEVICES"] = gpus[index]
                proc = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, start_new_session=True,
                                        preexec_fn=_child_setup(cores[index]))
                self.workers.append(Worker(index, proc, self._write))
        except OSError as e:
            raise LaunchError(f"cannot start {' '.join(command[:3])}: {e} (check --python)") from None
        finally:
            for worker in self.workers:  # also those started before a failure, so stop() can reap them
                worker.start_threads()
        pinned = "" if cores[0] is None else " pinned to cores " + " | ".join(_ranges(sorted(c)) for c in cores)
        split = "" if gpus[0] is None else " with GPUs " + " | ".join(g or "none" for g in gpus)
        self.say(f"started {n} worker(s): {' '.join(command)}{pinned}{split}")

    def _on_signal(self, signum, frame):
        if self._signal is not None:  # second Ctrl-C: no more waiting
            for worker in self.workers:
                worker.signal(signal.SIGKILL)
        self._signal = signum

    def run(self) -> int:
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            self.start()
            return self._supervise()
        finally:
            self.stop(grace_s=0.0)  # whatever happened above, no worker outlives the launcher
            for s, handler in previous.items():
                signal.signal(s, handler)

    def _supervise(self) -> int:
        started = time.monotonic()
        timeout = self.args.worker_timeout_s
        while True:
            for worker in self.workers:
                if worker.exit_code is None and not worker.running():
                    worker.exit_code = exit_code(worker.proc.returncode)
            failures = [w for w in self.workers if w.exit_code not in (None, 0)]
            if failures:  # the first to fail is the cause; peers that lost it exit a moment later
                return self._worker_failed(min(failures, key=lambda w: w.exited_at))
            if all(w.exit_code is not None for w in self.workers):
                for worker in self.workers:
                    worker.finish_output()
                self.say(f"all {len(self.workers)} workers finished")
                return 0
            if self._signal is not None:
                return self._interrupted(self._signal)
            if timeout and time.monotonic() - started > timeout:
                self.say(f"error: the job ran longer than --worker_timeout_s={timeout:g}; stopping every worker")
                self.stop(self.args.stop_grace_s)
                self._report_codes()
                return exit_codes.TIMEOUT
            time.sleep(0.05)

    def _worker_failed(self, failed) -> int:
        others = [w for w in self.workers if w.exit_code is None]
        if others:
            self.say(f"worker {failed.index} exited with code {failed.exit_code}; stopping the other "
                     f"{len(others)} worker(s) (SIGTERM, SIGKILL after {self.args.stop_grace_s:g}s)")
        self.stop(self.args.stop_grace_s)
        failed.finish_output()
        lines = "\n".join(f"  {line}" for line in failed.last_lines) or "  (no output)"
        self._report_codes()
        self.say(f"error: worker {failed.index} failed with exit code {failed.exit_code}. "
                 f"Its last {len(failed.last_lines)} lines:\n{lines}")
        return failed.exit_code

    def _interrupted(self, signum) -> int:
        name = signal.Signals(signum).name
        self.say(f"{name}: forwarding SIGTERM to every worker so they can save "
                 f"(SIGKILL after {self.args.stop_grace_s:g}s)")
        self.stop(self.args.stop_grace_s)
        codes = [w.exit_code for w in self.workers]
        self._report_codes()
        code = worst_exit_code(codes)
        return code if code else 128 + signum

    def _report_codes(self):
        self.say("exit codes: " + ", ".join(f"worker {w.index}={w.exit_code}" for w in self.workers))

    def stop(self, grace_s: float):
        """SIGTERM to every running worker, SIGKILL to those still running after ``grace_s``; waits for all."""
        running = [w for w in self.workers if w.running()]
        for worker in running:
            worker.signal(signal.SIGTERM if grace_s > 0 else signal.SIGKILL)
        deadline = time.monotonic() + grace_s
        while any(w.running() for w in running) and time.monotonic() < deadline:
            time.sleep(0.05)
        for worker in self.workers:
            if worker.running():
                worker.signal(signal.SIGKILL)
            worker.proc.wait()
            worker.finish_waiter()
            if worker.exit_code is None:
                worker.exit_code = exit_code(worker.proc.returncode)
            worker.kill_leftovers()
        for worker in self.workers:
            worker.finish_output(timeout=2.0)
