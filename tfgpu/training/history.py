"""What a run logs as it trains: ``<model_dir>/history.jsonl`` and the progress bar or lines.

One JSON object per loop of steps (``kind: train``) or evaluation (``kind: eval``) with its ``step`` and
``time``; the report reads them back (``tfgpu.reporting.report.read_history``).
"""
import json
import os
import sys
import time


class History:
    """Appends one JSON object per loop or evaluation to ``<model_dir>/history.jsonl`` (chief only)."""

    def __init__(self, model_dir: str, enabled: bool):
        self.path = os.path.join(model_dir, "history.jsonl")
        self.enabled = enabled

    def write(self, kind: str, step: int, values: dict) -> None:
        if not self.enabled:
            return
        line = json.dumps({"kind": kind, "step": step, "time": round(time.time(), 3), **values})
        with open(self.path, "a") as f:
            f.write(line + "\n")
            f.flush()


class Progress:
    """A Keras-style progress bar on a terminal, one line per loop otherwise; chief only."""

    def __init__(self, verbose: int, total: int, start: int, chief: bool, keys):
        """``verbose``: --verbose; ``keys``: the metrics declared ``progress``, in order."""
        self.keys = tuple(keys)
        self.total = total
        verbose = verbose if verbose >= 0 else (1 if sys.stdout.isatty() else 2)
        self.verbose = verbose if chief else 0
        self.bar = None
        if self.verbose == 1:
            import keras

            self.bar = keras.utils.Progbar(total, stateful_metrics=self.keys, unit_name="step")
            self.bar.update(start)

    def update(self, step: int, values: dict):
        shown = [(k, values[k]) for k in self.keys if k in values]
        if self.bar is not None:
            self.bar.update(step, shown)
        elif self.verbose == 2:
            print(f"step {step}/{self.total} " + " ".join(f"{k}={v:.4g}" for k, v in shown), flush=True)

    def close(self):
        if self.bar is not None:
            print(flush=True)
