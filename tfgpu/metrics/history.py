"""What a run logs as it trains: ``<model_dir>/history.jsonl`` and the progress bar or lines.

One JSON object per loop of steps (``kind: train``) or evaluation (``kind: eval``) with its ``step`` and
``time``, one ``kind: startup`` per process (where the time before its first loop went) and one
``kind: shutdown`` per run (where the time after its last record went: the trainer's teardown, the export,
metrics.json, the report), both timed by ``PhaseTimer``, and one ``kind: config_change`` (``field``, ``old``,
``new``) per field a resume changed under --allow_config_change (``training.config_change``).

This module is also the file's one reader: ``read`` (every record in order, for commands and tools that watch a
run) and ``read_by_kind`` (by kind, one point per step, for the report) both parse it through ``_parsed``, which
reads any file system and leaves out a line that does not read (a killed run's half-written last line).

A resumed run first cuts what an earlier process recorded past the checkpoint it resumes from (``cut_after``:
steps it trained without saving, killed or stopped before a save), in history.jsonl and in the TensorBoard event
files (``cut_summaries``), so each shows one record per step: the resumed run's.
"""
import json
import logging
import os
import sys
import time

from tfgpu.runtime import fileio, progress, run_dir

log = logging.getLogger("tfgpu")

# Kinds that record an event rather than a point of a curve: two may share a step (two fields changed at one
# resume, two restarts from one checkpoint), so ``read_by_kind`` keeps every one. ``restart`` is the launcher's
# (``runtime/supervisor.py``).
CONFIG_CHANGE = "config_change"  # a change --allow_config_change let a resume make (``training.config_change``)
EVENT_KINDS = (CONFIG_CHANGE, "restart")


class History:
    """Appends one JSON object per loop or evaluation to ``<model_dir>/history.jsonl`` (chief only); on an object
    store without appends (``gs://``) TensorFlow rewrites the whole object each time."""

    def __init__(self, model_dir: str, enabled: bool):
        self.path = run_dir.history(model_dir)
        self.enabled = enabled
        self.last_time = None  # time.time() of the last record written: where a run's shutdown starts

    def write(self, kind: str, step: int, values: dict) -> None:
        if not self.enabled:
            return
        line = json.dumps({"kind": kind, "step": step, "time": round(time.time(), 3), **values})
        fileio.append_text(self.path, line + "\n")
        self.last_time = time.time()

    def cut_after(self, step: int) -> int:
        """Rewrites history.jsonl (atomically) without the records past ``step``, and without lines that do not
        read (a killed run's half-written last line, onto which the next record would be appended); returns how
        many records were cut. Chief only; the file is left alone when there is nothing to cut."""
        if not self.enabled:
            return 0
        lines, text = _parsed(self.path)
        kept = [line for line, record in lines if record is not None and record["step"] <= step]
        readable = sum(record is not None for _, record in lines)
        cut = readable - len(kept)
        if len(kept) != len(lines) or (text and not text.endswith("\n")):
            fileio.atomic_write_bytes(self.path, "".join(line + "\n" for line in kept).encode())
        if cut:
            log.info("history.jsonl: removed %d record(s) past step %d, the checkpoint this run resumes from (an "
                     "earlier run trained past it without saving)", cut, step)
        return cut

    def steps(self, kind: str) -> set:
        """The steps with a ``kind`` record in history.jsonl so far (an unreadable line, such as a killed run's
        half-written last one, records nothing). Reads the whole file: once per resume."""
        return {record["step"] for _, record in _parsed(self.path)[0] if record is not None and record["kind"] == kind}


def _parsed(path: str) -> tuple:
    """([(line, record or None)] for every non-blank line of the history file at ``path``, on any file system;
    the file's text). A line reads when it is a JSON object with a ``kind`` and an integer ``step`` (made an int);
    one that does not (a killed run's half-written last line, a line being written) has None. ([], "") when there
    is no file."""
    try:
        text = fileio.read_text(path, errors="replace")
    except FileNotFoundError:
        return [], ""
    lines = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            record = {**record, "kind": str(record["kind"]), "step": int(record["step"])}
        except (ValueError, KeyError, TypeError):
            record = None
        lines.append((line, record))
    return lines, text


def read(model_dir: str) -> list:
    """Every record of ``<model_dir>/history.jsonl`` that reads, in the order written (a line being written, or
    a killed run's half-written last line, is left out); [] when there is no file. For commands and tools that
    watch a run."""
    return [record for _, record in _parsed(run_dir.history(model_dir))[0] if record is not None]


def read_by_kind(model_dir: str) -> tuple:
    """({kind: records sorted by step}, number of unreadable lines) of ``<model_dir>/history.jsonl``, for the
    report: a step recorded twice (a resume before the cut, an older tfgpu's file) keeps its last record, except
    events (``EVENT_KINDS``), which are all kept. ({}, 0) when there is no file."""
    by_key, bad = {}, 0
    for _, record in _parsed(run_dir.history(model_dir))[0]:
        if record is None:
            bad += 1
            continue
        key = (record["kind"], record["step"])
        if key[0] in EVENT_KINDS:
            key += (len(by_key),)
        by_key[key] = record
    kinds = {}
    for key, record in sorted(by_key.items(), key=lambda kv: kv[0][1]):
        kinds.setdefault(key[0], []).append(record)
    return kinds, bad


def cut_summaries(run_dirs, step: int) -> int:
    """Rewrites each TensorBoard event file in ``run_dirs`` (atomically) without the scalars of steps past ``step``,
    so that a resumed run's curve is not drawn over the lost steps of an earlier process; returns the number of
    events removed. Files with nothing to remove are left alone."""
    import tensorflow as tf

    removed = 0
    for summary_dir in run_dirs:
        for path in sorted(fileio.glob(os.path.join(summary_dir, "events.out.tfevents.*"))):
            kept, past = [], 0
            try:
                for record in tf.data.TFRecordDataset(path):
                    data = record.numpy()
                    event = tf.compat.v1.Event.FromString(data)
                    if event.HasField("summary") and event.step > step:
                        past += 1
                    else:
                        kept.append(data)
            except tf.errors.DataLossError:  # a killed run's truncated last event: cut it too
                past += 1
            if past:
                with fileio.atomic_path(path) as tmp:
                    with tf.io.TFRecordWriter(tmp) as writer:
                        for data in kept:
                            writer.write(data)
                removed += past
    return removed


class PhaseTimer:
    """Times consecutive phases from ``started_at``: by default the startup, from process start to the end of
    the first loop (imports, TensorFlow, strategy, dataset, task, restore, the first loop's tracing and steps),
    which counts in --target's time to target; with ``name="shutdown"`` from the last record to the outputs
    written, which the user waits for after the target too. ``record`` goes to ``history.jsonl``, ``describe``
    to the log."""

    def __init__(self, started_at: float, name: str = "startup", until: str = "the end of the first loop"):
        self.started_at = self._last = started_at
        self.name, self.until = name, until
        self.phases = {}

    def mark(self, phase: str) -> None:
        """Ends ``phase`` now: it took the time since the previous mark (or the start)."""
        now = time.time()
        self.phases[phase] = self.phases.get(phase, 0.0) + now - self._last
        self._last = now

    def record(self) -> dict:
        return {**{f"{phase}_s": round(seconds, 3) for phase, seconds in self.phases.items()},
                "total_s": round(self._last - self.started_at, 3)}

    def describe(self) -> str:
        parts = ", ".join(f"{phase.replace('_', ' ')} {seconds:.1f}" for phase, seconds in self.phases.items())
        return f"{self.name}: {self._last - self.started_at:.1f} s to {self.until} ({parts})"


class Progress:
    """The trainer's progress (``runtime.progress``: a Keras-style bar on a terminal, one line per loop
    otherwise); chief only.

    A line reads ``step N/TOTAL <declared metrics> elapsed=T eta=T``: the time since training started and the
    time left to the end of the schedule at the recent rate (evaluations included). With --target it also shows
    ``best_<metric>=V``, the best value of the target's metric evaluated so far (the bar shows its own times)."""

    def __init__(self, verbose: int, total: int, start: int, chief: bool, keys, best_name: str = ""):
        """``verbose``: --verbose; ``keys``: the metrics declared ``progress``, in order; ``best_name``: the
        target's metric, when there is a target."""
        self.keys = tuple(keys)
        self.best_key = f"best_{best_name}" if best_name else ""
        self.best = None
        verbose = verbose if verbose >= 0 else (1 if sys.stdout.isatty() else 2)
        self.shown = None
        if chief and verbose in (1, 2):
            stateful = self.keys + ((self.best_key,) if self.best_key else ())
            self.shown = progress.Progress(total, sys.stdout, bar=verbose == 1, label="step ", start=start,
                                           stateful=stateful)

    def set_best(self, value) -> None:
        """The best value of the target's metric so far (shown from the next update on)."""
        self.best = value

    def update(self, step: int, values: dict):
        shown = [(k, values[k]) for k in self.keys if k in values]
        if self.best_key and self.best is not None:
            shown.append((self.best_key, self.best))
        if self.shown is not None:
            self.shown.update(step, shown)

    def close(self):
        if self.shown is not None:
            self.shown.close()
