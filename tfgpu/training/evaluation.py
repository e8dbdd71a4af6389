"""The run's evaluation: the compiled eval loop over the eval split, what it read around (--skip_corrupt_records),
and its record in history.jsonl, TensorBoard and the log. A stop signal part way raises ``Stopped`` (no metric
comes from part of the split), in the compiled loop or, for a task that evaluates by other means (the GAN's FID),
at its next ``EvalRun.check_stop``; the trainer then saves and stops."""
import logging
import time

import tensorflow as tf

from tfgpu.data.input import pipeline
from tfgpu.runtime import feed as feed_lib
from tfgpu.tasks.base import EvalRun, Stopped
from tfgpu.training import loop

log = logging.getLogger("tfgpu")


def evaluates(info, task) -> bool:
    """Whether a run evaluates: with an eval split, or with a task that evaluates without one."""
    return bool(info.eval_split) or task.evaluates_without_eval_split


class Evaluation:
    """Evaluates ``task`` on ``info``'s eval split with ``inputs`` under ``placement``: ``declarations``, the run's
    metrics; ``history`` and ``summaries`` record it; ``input`` (``InputPosition``) names an unreadable record;
    ``stop``: the loops' ``StopFlag``; ``model_dir``: where a task's own evaluation keeps its files."""

    def __init__(self, placement, task, inputs, info, declarations, history, summaries, input, stop, model_dir):
        self.strategy = placement.strategy
        self.placement = placement
        self.task = task
        self.inputs = inputs
        self.info = info
        self.declarations = declarations
        self.history = history
        self.summaries = summaries
        self.input = input
        self.model_dir = model_dir
        self.stop = stop
        self.sums = loop.accumulators(self.strategy, task.eval_metric_names())
        # The task's step as it is when the loop traces (tests wrap it after construction).
        self.loop = loop.build_loop(self.strategy, lambda batch: self.task.eval_step(batch), self.sums, stop=stop)

    def __call__(self, step: int, record: bool = True) -> dict:
        """Runs the task's evaluation; ``record`` appends it to history.jsonl and TensorBoard."""
        if not evaluates(self.info, self.task):
            return {}

        def run_eval():
            steps = pipeline.eval_steps(self.inputs, self.info, self.placement.num_workers,
                                        self.placement.num_replicas)
            with feed_lib.Feed(loop.input_iterator(self.strategy, self.placement,
                                               pipeline.eval_dataset_fn(self.inputs, self.info, steps,
                                                                        self.task.examples()))) as feed:
                sums, _, ran = self.loop(feed.iterator, tf.constant(steps))
                if int(ran) < steps:  # a stop signal: no metric from part of the split
                    raise Stopped()
            return loop.as_floats(sums)

        start = time.time()
        with self.input.reading():
            metrics = self.task.evaluate(EvalRun(run_eval, self.stop), step, self.model_dir)
        read = [metrics[s.name] for s in self.declarations.metrics
                if s.kind == "eval" and s.counts_examples and s.name in metrics]
        if self.inputs.skip_corrupt_records and read:
            skipped = self.info.split_sizes.get(self.info.eval_split, 0) - read[0]
            if skipped:
                metrics["skipped_corrupt_records"] = skipped
                log.warning("eval skipped %d unreadable records of split %s", skipped, self.info.eval_split)
        if metrics and record:
            metrics["eval_time_s"] = round(time.time() - start, 3)
            self.history.write("eval", step, metrics)
            self.summaries.write("eval", step, metrics)
            log.info("eval step %d: %s", step, _fmt(metrics))
        return metrics


def _fmt(values: dict) -> str:
    return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items())
