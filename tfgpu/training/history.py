"""What a run logs as it trains: ``<model_dir>/history.jsonl`` and the progress bar or lines.

One JSON object per loop of steps (``kind: train``) or evaluation (``kind: eval``) with its ``step`` and
``time``, one ``kind: startup`` per process (where the time before its first loop went) and one
``kind: shutdown`` per run (where the time after its last record went: the trainer's teardown, the export,
metrics.json, the report), both timed by ``PhaseTimer``, and one ``kind: config_change`` (``field``, ``old``,
``new``) per field a resume changed under --allow_config_change (``training.config_change``); the report
reads them back (``tfgpu.reporting.report.read_history``).

A resumed run first cuts what an earlier process recorded past the checkpoint it resumes from (``cut_after``:
steps it trained without saving, killed or stopped before a save), in history.jsonl and in the TensorBoard event
files (``cut_summaries``), so each shows one record per step: the resumed run's.
"""
import json
import logging
import os
import sys
import time

from tfgpu.runtime import fileio, progress
from tfgpu.training import run_dir

log = logging.getLogger("tfgpu")


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
        try:
            text = fileio.read_text(self.path, errors="replace")
        except FileNotFoundError:
            return 0
        kept, cut, unreadable = [], 0, 0
        for line in text.splitlines():
            if not line.strip():
                continue
            try:
                past = int(json.loads(line)["step"]) > step
            except (ValueError, KeyError, TypeError):
                unreadable += 1
                continue
            if past:
                cut += 1
            else:
                kept.append(line)
        if cut or unreadable or (text and not text.endswith("\n")):
            fileio.atomic_write_bytes(self.path, "".join(line + "\n" for line in kept).encode())
        if cut:
            log.info("history.jsonl: removed %d record(s) past step %d, the checkpoint this run resumes from (an "
                     "earlier run trained past it without saving)", cut, step)
        return cut

    def steps(self, kind: str) -> set:
        """The steps with a ``kind`` record in history.jsonl so far (an unreadable line, such as a killed run's
        half-written last one, records nothing). Reads the whole file: once per resume."""
        from tfgpu.reporting.report import read_history

        return {int(record["step"]) for record in read_history(self.path)[0].get(kind, [])}


def read(model_dir: str) -> list:
    """Every record of ``<model_dir>/history.jsonl`` that reads, in order (a line being written, or a killed run's
    half-written last line, is left out); [] when there is no file. For commands and tools that watch a run."""
    try:
        with open(run_dir.history(model_dir)) as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records


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
