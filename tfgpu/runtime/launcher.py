"""Running N MultiWorkerMirroredStrategy workers on one host: ports, TF_CONFIG, each worker's GPUs and cores,
and supervision (output prefixed ``[worker i]``, failures, hangs seen in the workers' heartbeat files, signals,
exit codes) and, with --max_restarts, a new group after a failure (``runtime/restarts.py`` decides what it
runs on). ``python -m tfgpu.launch`` (``tfgpu/launch.py``) parses its flags and hands them to ``Launcher``; see
its docstring for the behaviour.
"""
import collections
import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from tfgpu.runtime import heartbeat, restarts
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


def batch_rule(args, worker_args, gpus_per_worker_share):
    """``fits(n)``: whether n workers divide the workers' global (and eval) batch over their replicas, read from
    the tfgpu.train flags they are given (no TensorFlow); always True for another program or flags that do not
    parse (the workers then say what is wrong). ``gpus_per_worker_share``: one worker's CUDA_VISIBLE_DEVICES."""
    if worker_command(args, worker_args)[1:3] != ["-m", "tfgpu.train"] or any(
            "://" in a for a in worker_args if a.startswith(("--config", "--flagfile"))):
        return lambda n: True  # another program, or a remote --config/--flagfile (reading it would load TensorFlow)
    try:
        from tfgpu import cli

        parser = cli.ArgumentParser(prog="tfgpu.train")
        parser.add_config_flags(config_file=True)
        namespace = parser.parse_args(list(worker_args))
        config = cli.resolve(namespace, namespace.config, references=False)
    except Exception:  # noqa: BLE001 - the workers report their own flag errors
        return lambda n: True
    gpus = len(gpus_per_worker_share.split(",")) if gpus_per_worker_share else 0
    replicas = config.cpu_logical_devices or gpus or 1
    batches = [config.global_batch_size, config.eval_batch_size or config.global_batch_size]
    return lambda n: all(b % (n * replicas) == 0 for b in batches)


class Worker:
    """One worker process, the thread that copies its output, the last lines it printed and its progress (the
    heartbeat file the trainer replaces after every loop: ``runtime/heartbeat.py``)."""

    def __init__(self, index, slot, proc, out, heartbeat_path=""):
        self.index = index
        self.slot = slot
        self.proc = proc
        self.last_lines = collections.deque(maxlen=LAST_LINES)
        self.exit_code = None
        self.exited_at = None  # monotonic time the process ended, to tell the first failure from its echoes
        self.heartbeat_path = heartbeat_path
        self.beat = None  # the last heartbeat read
        self.progress_at = time.monotonic()  # when it started, or when its heartbeat last changed
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

    def read_heartbeat(self, now: float) -> None:
        """Takes in the worker's heartbeat file; a new record is progress."""
        beat = heartbeat.read(self.heartbeat_path) if self.heartbeat_path else None
        if beat is not None and beat != self.beat:
            self.beat, self.progress_at = beat, now

    @property
    def phase(self) -> str:
        return self.beat["phase"] if self.beat else "starting"

    def stopped(self) -> bool:
        """Whether the process is stopped by a signal (SIGSTOP, SIGTSTP): state T in /proc."""
        try:
            with open(f"/proc/{self.proc.pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
        except (OSError, IndexError):
            return False

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
    """Starts and supervises the worker groups; ``run`` returns the job's exit code."""

    def __init__(self, args, worker_args, out=None, err=None):
        self.args = args
        self.worker_args = list(worker_args)
        self._out_lock = threading.Lock()
        self._stdout = out or sys.stdout.buffer
        self._stderr = err or sys.stderr
        self.workers = []
        self.groups = 0
        self.restarts = 0
        self._signal = None
        self._heartbeats = None  # the directory of the workers' heartbeat files
        self._recovering = None  # (restart number, time.time() of the failure) until the new group's first loop

    def _option(self, name, default):
        return getattr(self.args, name, default)

    def _write(self, data: bytes):
        with self._out_lock:
            self._stdout.write(data)
            self._stdout.flush()

    def say(self, message):
        with self._out_lock:
            print(f"tfgpu.launch: {message}", file=self._stderr, flush=True)

    def prepare(self):
        """Each slot's cores and GPUs, the worker command and the group sizes that fit; LaunchError before any
        worker starts."""
        n = self.args.num_workers
        self.cores = core_sets(n, self.args.cpu_cores_per_worker)
        self.gpus = gpu_sets(n, self.args.gpus_per_worker, *host_gpus())
        self.command = worker_command(self.args, self.worker_args)
        self.fits = batch_rule(self.args, self.worker_args, self.gpus[0])
        self._heartbeats = tempfile.mkdtemp(prefix="tfgpu-launch-")

    def start(self, slots=None):
        """Starts one worker per slot (every slot by default), with a fresh TF_CONFIG, free ports and its own
        heartbeat file. No thread of ours runs yet (preexec_fn is not thread-safe): a restart starts the next group
        after ``stop`` joined the previous group's threads."""
        if not hasattr(self, "command"):
            self.prepare()
        slots = list(range(self.args.num_workers)) if slots is None else list(slots)
        n = len(slots)
        self.groups += 1
        configs = tf_configs(self.args.host, free_ports(n))
        self.workers = []
        try:
            for index, slot in enumerate(slots):
                beat_path = os.path.join(self._heartbeats, f"group{self.groups}-worker{index}.json")
                env = {**os.environ, "TF_CONFIG": configs[index], "PYTHONUNBUFFERED": "1",
                       heartbeat.ENV: beat_path}
                if self.gpus[slot] is not None:
                    env["CUDA_VISIBLE_DEVICES"] = self.gpus[slot]
                proc = subprocess.Popen(self.command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, start_new_session=True,
                                        preexec_fn=_child_setup(self.cores[slot]))
                self.workers.append(Worker(index, slot, proc, self._write, beat_path))
        except OSError as e:
            raise LaunchError(f"cannot start {' '.join(self.command[:3])}: {e} (check --python)") from None
        finally:
            for worker in self.workers:  # also those started before a failure, so stop() can reap them
                worker.start_threads()
        cores = [self.cores[s] for s in slots]
        gpus = [self.gpus[s] for s in slots]
        pinned = "" if cores[0] is None else " pinned to cores " + " | ".join(_ranges(sorted(c)) for c in cores)
        split = "" if gpus[0] is None else " with GPUs " + " | ".join(g or "none" for g in gpus)
        self.say(f"started {n} worker(s): {' '.join(self.command)}{pinned}{split}")

    def _on_signal(self, signum, frame):
        if self._signal is not None:  # second Ctrl-C: no more waiting
            for worker in self.workers:
                worker.signal(signal.SIGKILL)
        self._signal = signum

    def run(self) -> int:
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            self.prepare()
            slots = list(range(self.args.num_workers))
            while True:
                self.start(slots)
                outcome = self._supervise()
                if not isinstance(outcome, restarts.Failure):
                    return outcome
                slots = self._restart(outcome, slots)
                if not slots:
                    return self._failed(outcome)
        finally:
            self.stop(grace_s=0.0)  # whatever happened above, no worker outlives the launcher
            for s, handler in previous.items():
                signal.signal(s, handler)
            if self._heartbeats:
                shutil.rmtree(self._heartbeats, ignore_errors=True)

    def _supervise(self):
        """Watches the group until it ends: its exit code (done, interrupted) or the Failure that stopped it
        (the group is stopped by then)."""
        progress_limit = self._option("worker_timeout_s", 0.0)
        startup_limit = self._option("startup_timeout_s", 0.0) or progress_limit
        next_read = 0.0
        while True:
            for worker in self.workers:
                if worker.exit_code is None and not worker.running():
                    worker.exit_code = exit_code(worker.proc.returncode)
            now = time.monotonic()
            if now >= next_read:
                next_read = now + 0.25
                for worker in self.workers:
                    worker.read_heartbeat(now)
                self._note_recovery()
            if any(w.exit_code not in (None, 0) for w in self.workers):
                return self._stopped(self._stop_failed_group())
            if all(w.exit_code is not None for w in self.workers):
                for worker in self.workers:
                    worker.finish_output()
                after = f" after {self.restarts} restart(s)" if self.restarts else ""
                self.say(f"all {len(self.workers)} workers finished{after}")
                return exit_codes.OK
            if self._signal is not None:
                return self._interrupted(self._signal)
            if progress_limit:
                silent = [w for w in self.workers if w.running() and w.phase != "done" and now - w.progress_at >
                          (progress_limit if w.phase == "training" else startup_limit)]
                if silent:
                    return self._stopped(self._stop_hung_group(silent, now))
            time.sleep(0.05)

    def _last_step(self):
        steps = [w.beat["step"] for w in self.workers if w.beat]
        return max(steps) if steps else None

    def _stop_failed_group(self):
        """A worker exited non-zero: find the cause, stop the rest (a stopped cause is killed at once)."""
        time.sleep(0.2)  # the peers of a killed worker fail a moment later; let their exits be seen with it
        for worker in self.workers:
            worker.read_heartbeat(time.monotonic())  # the last beats before the failure count as done
            if worker.exit_code is None and not worker.running():
                worker.exit_code = exit_code(worker.proc.returncode)
        running = {w.index for w in self.workers if w.exit_code is None}
        stopped = {w.index for w in self.workers if w.index in running and w.stopped()}
        index = restarts.choose_cause({w.index: w.exit_code for w in self.workers if w.exit_code is not None},
                                      {w.index: w.exited_at for w in self.workers if w.exit_code is not None},
                                      stopped, running)
        cause = self.workers[index]
        last_step = self._last_step()
        if cause.exit_code is None:  # its peers lost it: it hangs (or is stopped) while they exited 129
            silent_s = time.monotonic() - cause.progress_at
            state = "is stopped (SIGSTOP)" if index in stopped else "still runs"
            failure = restarts.Failure(index, cause.slot, None, f"{state} while its peers lost it (no progress for "
                                       f"{silent_s:.1f} s)", hung=True, no_progress_s=silent_s, last_step=last_step)
            cause.signal(signal.SIGKILL)
        else:
            failure = restarts.Failure(index, cause.slot, cause.exit_code, restarts.describe_exit(cause.exit_code),
                                       last_step=last_step)
        others = [w for w in self.workers if w.exit_code is None and w is not cause]
        if others:
            self.say(f"worker {index} {failure.reason}; stopping the other {len(others)} worker(s) (SIGTERM, "
                     f"SIGKILL after {self.args.stop_grace_s:g}s)")
        self.stop(self.args.stop_grace_s)
        return failure

    def _stop_hung_group(self, silent, now):
        """Workers showed no progress for --worker_timeout_s: the cause (stopped by a signal, else the one silent
        longest) is killed, the others stopped; a hang is a failure like an exit."""
        stopped = [w for w in silent if w.stopped()]
        cause = stopped[0] if stopped else min(silent, key=lambda w: (w.progress_at, w.index))
        silent_s = now - cause.progress_at
        state = ", stopped by a signal" if stopped else ""
        if cause.phase == "training":
            reason = f"made no progress for {silent_s:.1f} s (--worker_timeout_s={self.args.worker_timeout_s:g}{state})"
        else:
            flag = "--startup_timeout_s" if self._option("startup_timeout_s", 0.0) else "--worker_timeout_s"
            reason = (f"did not start training within {silent_s:.1f} s ({flag}="
                      f"{self._option('startup_timeout_s', 0.0) or self.args.worker_timeout_s:g}{state})")
        failure = restarts.Failure(cause.index, cause.slot, None, reason, hung=True, no_progress_s=silent_s,
                                   last_step=self._last_step())
        self.say(f"worker {cause.index} {failure.reason}; killing it and stopping the other "
                 f"{len(self.workers) - 1} worker(s)")
        cause.signal(signal.SIGKILL)
        self.stop(self.args.stop_grace_s)
        return failure

    def _stopped(self, failure):
        """The failure, with how long after the group's last progress (any worker's newest heartbeat, or its
        start) every worker had stopped: what --worker_timeout_s bounds for a hang."""
        last = max(self.workers, key=lambda w: w.progress_at)
        since = time.monotonic() - last.progress_at
        self.say(f"group stopped {since:.1f} s after its last progress (worker {last.index}, {last.phase} at step "
                 f"{last.beat['step'] if last.beat else 0})")
        return dataclasses.replace(failure, stopped_after_s=since)

    def _restart(self, failure, slots) -> list:
        """The slots of the next group after ``failure`` (logged, recorded in history.jsonl); [] when the job
        stops instead."""
        max_restarts = self._option("max_restarts", 0)
        if not failure.retryable or self._signal is not None:
            return []
        if self.restarts >= max_restarts:
            if max_restarts:
                self.say(f"no restart left (--max_restarts={max_restarts})")
            return []
        new_slots, why = restarts.next_slots(slots, failure, self._option("min_workers", 1) or 1, self.fits,
                                             self._option("reuse_failed_slots", False))
        if not new_slots:
            self.say(f"cannot restart: {why}")
            return []
        self.restarts += 1
        model_dir = next((w.beat.get("model_dir") for w in self.workers if w.beat and w.beat.get("model_dir")), "")
        resumed = restarts.checkpoint_step(model_dir)
        failed_at = time.time()
        self.say(restarts.restart_line(self.restarts, max_restarts, failure, len(slots), len(new_slots), resumed))
        if model_dir and "://" not in model_dir:
            record = {"kind": "restart", "step": resumed or 0, "time": round(failed_at, 3),
                      **restarts.restart_record(self.restarts, failure, len(slots), len(new_slots), resumed,
                                                failed_at)}
            with contextlib.suppress(OSError), open(os.path.join(model_dir, "history.jsonl"), "a") as f:
                f.write(json.dumps(record) + "\n")
        self._recovering = (self.restarts, failed_at)
        return new_slots

    def _note_recovery(self):
        """One line when the group started by a restart finishes its first loop: how long the restart took."""
        if self._recovering is None or not any(w.phase in ("training", "done") for w in self.workers):
            return
        number, failed_at = self._recovering
        self._recovering = None
        step = self._last_step()
        self.say(f"restart {number}: the new group of {len(self.workers)} finished its first loop (step {step}) "
                 f"{time.time() - failed_at:.1f} s after the group was stopped")

    def _failed(self, failure) -> int:
        """The job ends with ``failure``: its worker's last lines and its exit code."""
        failed = self.workers[failure.worker]
        failed.finish_output()
        lines = "\n".join(f"  {line}" for line in failed.last_lines) or "  (no output)"
        self._report_codes()
        if failure.hung:
            self.say(f"error: worker {failure.worker} {failure.reason}; exit {failure.exit_code}. Its last "
                     f"{len(failed.last_lines)} lines:\n{lines}")
        else:
            self.say(f"error: worker {failure.worker} failed with exit code {failure.code}. "
                     f"Its last {len(failed.last_lines)} lines:\n{lines}")
        return failure.exit_code

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
