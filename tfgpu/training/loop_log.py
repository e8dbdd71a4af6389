"""What each train loop leaves: its record (history.jsonl, TensorBoard, the progress bar) and, kept across loops,
the last record and the throughput of every loop but the first, from which the run's results are made."""
import numpy as np

from tfgpu.metrics import results


class LoopLog:
    """The train loops' records of a run: ``history`` and ``summaries`` receive them; ``task`` adds its learning
    rates and loss scales; ``examples_per_step`` makes the rate; ``nonfinite_names``: the step metrics that count
    skipped steps (summed over a loop, the others averaged)."""

    def __init__(self, history, summaries, task, examples_per_step: int, nonfinite_names):
        self.history = history
        self.summaries = summaries
        self.task = task
        self.examples_per_step = examples_per_step
        self.nonfinite_names = tuple(nonfinite_names)
        self.last = {}  # the last loop's record, step metrics and task state
        self.rates = []  # examples/s of each loop but the first (which includes tracing and compilation)

    def write(self, step: int, num_steps: int, sums: dict, elapsed: float, progress, first: bool) -> dict:
        """One loop's record: the step metrics averaged over the loop (those that count skipped steps summed), the
        task's learning rates and loss scales, and throughput. Returns the step metrics."""
        step_metrics = {name: (int(round(value)) if name in self.nonfinite_names else value / num_steps)
                        for name, value in sums.items()}
        task_state = {**self.task.learning_rates(), **self.task.loss_scales()}
        record = {**step_metrics, **task_state,
                  "examples_per_sec": num_steps * self.examples_per_step / elapsed,
                  "step_time_ms": 1000 * elapsed / num_steps}
        self.history.write("train", step, record)
        self.summaries.write("train", step, record)
        progress.update(step, record)
        self.last = {"record": record, "step_metrics": step_metrics, "task_state": task_state}
        if not first:
            self.rates.append(record["examples_per_sec"])
        return step_metrics

    def examples_per_sec(self) -> float:
        """The median rate of the loops after the first; the first's alone when it was the only one; else 0."""
        if self.rates:
            return float(np.median(self.rates))
        return self.last["record"]["examples_per_sec"] if self.last else 0.0

    def result(self, step: int, eval_metrics: dict, **fields) -> results.RunResult:
        """The run's results at ``step``: the last loop's step metrics as train_<name>, its learning rates and loss
        scales as they are, then ``eval_metrics``; ``fields``: the rest of ``RunResult``."""
        values = {}
        if self.last:
            values.update({f"train_{k}": v for k, v in self.last["step_metrics"].items()})
            values.update(self.last["task_state"])
        values.update(eval_metrics)
        return results.RunResult(step=step, values=values, examples_per_sec=self.examples_per_sec(), **fields)
