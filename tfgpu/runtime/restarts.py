"""What ``tfgpu.launch`` decides when a worker group fails: which worker caused it, whether a restart can help,
which slots the next group runs on, and the line and ``restart`` record that say so. Pure logic: the processes
are ``runtime/launcher.py``'s.

A slot is one worker's place on the host (its cores and GPUs). The cause's slot is left out of the next group
when the cause was killed by a signal or hung (its GPU, its memory or the process itself is suspect), unless
--reuse_failed_slots; a group that lost a peer (129) or was preempted (143) with no other cause found comes back
on the same slots. Exit codes 1-127 are permanent (``runtime/failures.py``: a bad flag, non-finite steps, a
failed kernel): a restart would fail the same way, so the job stops.
"""
import dataclasses
import json
import re
import signal

from tfgpu.runtime import failures, run_dir


@dataclasses.dataclass(frozen=True)
class Failure:
    """The failure that ends a group: its cause (index in the group, slot), how it ended and when."""
    worker: int
    slot: int
    code: int | None  # the cause's exit code; None when it hung (it was still running)
    reason: str  # for the log line, e.g. "was killed by SIGKILL (exit 137)"
    hung: bool = False
    no_progress_s: float = 0.0  # for a hang: how long the group had shown no progress when it was stopped
    last_step: int | None = None  # the last step any worker of the group reported finishing
    stopped_after_s: float = 0.0  # from the group's last progress to every worker stopped

    @property
    def retryable(self) -> bool:
        return self.hung or (self.code is not None and self.code >= 128)

    @property
    def slot_suspect(self) -> bool:
        """Whether the cause's slot should not be used again: it was killed by a signal or hung."""
        return self.hung or (self.code is not None and self.code > 128
                             and self.code not in (failures.WORKER_LOST, failures.PREEMPTED))

    @property
    def exit_code(self) -> int:
        """The code the job ends with when it is not restarted: a hang is a timeout (124)."""
        return failures.TIMEOUT if self.hung else self.code


def describe_exit(code: int) -> str:
    """``code`` as a person reads it: "was killed by SIGKILL (exit 137)", "lost a peer (exit 129)"..."""
    if code == failures.WORKER_LOST:
        return "lost a peer (exit 129)"
    if code == failures.PREEMPTED:
        return "was preempted by SIGTERM and saved (exit 143)"
    if code > 128:
        try:
            return f"was killed by {signal.Signals(code - 128).name} (exit {code})"
        except ValueError:
            pass
    return f"exited with code {code}"


def choose_cause(exits: dict, exited_at: dict, stopped: set, running: set) -> int | None:
    """The worker whose failure ended the group: the first to exit with a code other than 0 and 129 (the peers
    of a dead worker exit 129 a moment later); with only 129s, a worker stopped by a signal (SIGSTOP) or, else,
    one still running while its peers lost it (it is the one they lost); else the first 129. None: no failure.
    ``exits``: index -> exit code of the workers that ended; ``exited_at``: index -> when."""
    failed = [i for i, code in exits.items() if code not in (0, None)]
    if not failed:
        return None
    real = [i for i in failed if exits[i] != failures.WORKER_LOST]
    if real:
        return min(real, key=lambda i: exited_at[i])
    for suspects in (sorted(stopped & running), sorted(running)):
        if suspects:
            return suspects[0]
    return min(failed, key=lambda i: exited_at[i])


def next_slots(active: list, failure: Failure, min_workers: int, fits=lambda n: True, reuse_failed: bool = False):
    """(slots for the next group, why not): the active slots less the cause's when it is suspect, cut to the
    largest count >= ``min_workers`` that ``fits`` (e.g. divides the global batch); ([], reason) when none."""
    keep = list(active) if reuse_failed or not failure.slot_suspect else [s for s in active if s != failure.slot]
    for n in range(len(keep), min_workers - 1, -1):
        if n > 0 and fits(n):
            return keep[:n], ""
    if len(keep) < min_workers:
        return [], f"{len(keep)} worker slot(s) left, fewer than --min_workers={min_workers}"
    return [], (f"no group of {min_workers}..{len(keep)} workers divides the global batch (the workers' "
                "--global_batch_size over their replicas)")


def checkpoint_step(model_dir: str) -> int | None:
    """The step of the newest checkpoint of a local ``model_dir`` (its ``checkpoints/checkpoint`` state file names
    ``ckpt-<step>``), or None when there is none or it is not a local path (the launcher loads no TensorFlow)."""
    if not model_dir or "://" in model_dir:
        return None
    try:
        with open(run_dir.checkpoint_state(model_dir)) as f:
            text = f.read()
    except OSError:
        return None
    match = re.search(r'^model_checkpoint_path:\s*"(?:.*/)?' + re.escape(run_dir.CHECKPOINT_PREFIX) + r'(\d+)"', text, re.M)
    return int(match.group(1)) if match else None


def steps_lost(last_step, resumed_step):
    """Finished steps the restart trains again, when both ends are known."""
    if last_step is None or resumed_step is None:
        return None
    return max(last_step - resumed_step, 0)


def restart_line(number: int, max_restarts: int, failure: Failure, before: int, after: int, resumed_step) -> str:
    """The one line a restart logs: why, which worker, old -> new size, the step resumed from, the steps lost."""
    at = f" after step {failure.last_step}" if failure.last_step is not None else " before its first loop"
    if resumed_step is None:
        resumed = "from the newest checkpoint (none found yet: from the start)" if failure.last_step is None else \
            "from the newest checkpoint"
    else:
        resumed = f"from the checkpoint at step {resumed_step}"
    lost = steps_lost(failure.last_step, resumed_step)
    lost = f" ({lost} step(s) lost)" if lost is not None else ""
    return (f"restart {number} of --max_restarts={max_restarts}: worker {failure.worker} {failure.reason}{at}; "
            f"{before} -> {after} workers, resuming {resumed}{lost}")


def restart_record(number: int, failure: Failure, before: int, after: int, resumed_step, failed_at: float) -> dict:
    """history.jsonl's ``restart`` record (its ``step`` is the step resumed from, 0 without a checkpoint)."""
    return {"restart": number, "reason": failure.reason, "worker": failure.worker, "exit_code": failure.code,
            "hung": failure.hung, "no_progress_s": round(failure.no_progress_s, 3) if failure.hung else None,
            "workers_before": before, "workers_after": after, "last_step": failure.last_step,
            "steps_lost": steps_lost(failure.last_step, resumed_step), "failed_at": round(failed_at, 3),
            "stopped_after_progress_s": round(failure.stopped_after_s, 3)}


# The restart record handed to the new group when the launcher cannot write it itself (a ``gs://`` --model_dir: it
# loads no TensorFlow; or across hosts, where the chief may be on another host): its chief writes it through
# history.jsonl's writer once it restored, with the step it actually resumed from.
RECORD_ENV = "TFGPU_RESTART_RECORD"


def handoff(record: dict) -> str:
    """``record`` (``restart_record``'s, its step not known yet) as the new group's ``RECORD_ENV`` value."""
    return json.dumps(record)


def take_handed_record(environ, resumed_step: int):
    """The restart record the launcher handed this process (removed from ``environ``, so an in-place re-exec does
    not write it twice), completed with the step it resumed from and the steps lost; None when none was handed or
    it does not parse."""
    raw = environ.pop(RECORD_ENV, "")
    try:
        record = json.loads(raw) if raw else None
    except ValueError:
        return None
    if not isinstance(record, dict):
        return None
    return {**record, "steps_lost": steps_lost(record.get("last_step"), resumed_step), "resumed_by": "chief"}
