"""Supervising the worker groups ``tfgpu.launch`` starts on one host: each worker's process, output (prefixed
``[worker i]``) and heartbeat file; a failure or a hang stops the group, and with --max_restarts a new group
starts on the slots ``runtime/restarts.py`` chooses; signals to the launcher are forwarded. What each worker is
given (command, TF_CONFIG, GPUs, cores) is ``runtime/launcher.py``'s.
"""
import collections
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from tfgpu.runtime import heartbeat, restarts
from tfgpu.runtime.launcher import (LAST_LINES, LaunchError, _child_setup, _ranges, batch_rule, core_sets, exit_code,
                                    free_ports, gpu_sets, host_gpus, tf_configs, worker_command, worst_exit_code)
from tfgpu.runtime import failures as exit_codes, run_dir


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

    def __init__(self, args, worker_args, out=None, err=None, train_batches=None):
        self.args = args
        self.train_batches = train_batches  # the workers' batches, as the launch command read them (batch_rule)
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
        self._handoff = None  # a restart record for the next group's chief to write (restarts.RECORD_ENV)

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
        self.fits = batch_rule(self.train_batches, self.gpus[0])
        self._heartbeats = tempfile.mkdtemp(prefix="tfgpu-launch-")

    def start(self, slots=None, configs=None):
        """Starts one worker per slot (every slot by default), with a fresh TF_CONFIG (``configs``: one per slot,
        given by an agent across hosts; else free ports on this host) and its own heartbeat file. No thread of ours runs yet (preexec_fn is not thread-safe): a restart starts the next group
        after ``stop`` joined the previous group's threads."""
        if not hasattr(self, "command"):
            self.prepare()
        slots = list(range(self.args.num_workers)) if slots is None else list(slots)
        n = len(slots)
        self.groups += 1
        configs = list(configs) if configs is not None else tf_configs(self.args.host, free_ports(n))
        self.workers = []
        try:
            for index, slot in enumerate(slots):
                beat_path = os.path.join(self._heartbeats, f"group{self.groups}-worker{index}.json")
                env = {**os.environ, "TF_CONFIG": configs[index], "PYTHONUNBUFFERED": "1",
                       heartbeat.ENV: beat_path}
                if self._handoff:
                    env[restarts.RECORD_ENV] = self._handoff
                if self.gpus[slot] is not None:
                    env["CUDA_VISIBLE_DEVICES"] = self.gpus[slot]
                proc = subprocess.Popen(self.command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, start_new_session=True,
                                        preexec_fn=_child_setup(self.cores[slot]))
                self.workers.append(Worker(index, slot, proc, self._write, beat_path))
        except OSError as e:
            raise LaunchError(f"cannot start {' '.join(self.command[:3])}: {e} (check --python)") from None
        finally:
            self._handoff = None  # one group writes it
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
                change = self._membership_change()
                if change is not None:
                    return change
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

    def _group_size(self) -> int:
        """Workers in the group (across hosts, more than this launcher's)."""
        return len(self.workers)

    def _membership_change(self):
        """What ends the group from outside it (an agent across hosts: a new round, a lost host); None here."""
        return None

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
        longest) is killed, the others stopped; a hang is a failure like an exit. A stopped worker is the cause even
        when a peer waiting for it fell silent first (its last beat can be a moment older than the stopped one's)."""
        stopped = [w for w in self.workers if w.running() and w.stopped()]
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
        record = restarts.restart_record(self.restarts, failure, len(slots), len(new_slots), resumed, failed_at)
        if model_dir and "://" not in model_dir:
            with contextlib.suppress(OSError), open(run_dir.history(model_dir), "a") as f:
                f.write(json.dumps({"kind": "restart", "step": resumed or 0, "time": round(failed_at, 3),
                                    **record}) + "\n")
        elif model_dir:  # gs://...: the new group's chief writes it through TensorFlow, with the step it restored
            self._handoff = restarts.handoff(record)
        self._recovering = (self.restarts, failed_at)
        return new_slots

    def _note_recovery(self):
        """One line when the group started by a restart finishes its first loop: how long the restart took."""
        if self._recovering is None or not any(w.phase in ("training", "done") for w in self.workers):
            return
        number, failed_at = self._recovering
        self._recovering = None
        step = self._last_step()
        self.say(f"restart {number}: the new group of {self._group_size()} finished its first loop (step {step}) "
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
