"""The loop driver: trains to the last step in compiled loops (``loop``) that end at the boundaries
(``schedule``: evaluations, checkpoints, profiling, the task's and the caller's ``hooks``), and calls the checkpoint,
the evaluation and the logs there. Each part it drives keeps its own state behind one object, built once here:
where the input is (``data.index.input_position``), how the run stops and saves (``stopping``), --target and owed
evaluations (``target.Tracker``), the evaluation (``evaluation``), each loop's record (``loop_log``, ``summaries``).
How a run fails is ``failures``; metrics.json is ``results``. The Trainer reads only its ``TrainerConfig`` and hands
the pipeline its ``InputConfig``.
"""
import logging
import os
import time

import tensorflow as tf

from tfgpu import durations
from tfgpu.config import ConfigError, InputConfig, TrainerConfig
from tfgpu.data.input import pipeline, records
from tfgpu.data.index.input_position import InputPosition
from tfgpu.runtime import failures, heartbeat, precision, restarts, run_dir
from tfgpu.runtime import feed as feed_lib
from tfgpu.runtime.distribute import Placement
from tfgpu.training import checkpoint as checkpoint_lib
from tfgpu.metrics import target as target_lib
from tfgpu.training import evaluation, input_profile, loop, schedule
from tfgpu.metrics import history, metric_specs, results
from tfgpu.training.stopping import Stopping
from tfgpu.training.summaries import Summaries
from tfgpu.metrics.history import History, Progress
from tfgpu.training.hooks import LoopHooks
from tfgpu.training.loop_log import LoopLog

log = logging.getLogger("tfgpu")


class Trainer:
    """Trains and evaluates ``task`` under ``placement``'s strategy: ``config`` holds the loop's options,
    ``inputs`` what the input pipelines read (and the examples per step, for rates).

    Built whole by its constructor: the task's models and optimizers (after ``Task.check_fine_tuning``), the
    compiled loops, the checkpointer and the TensorBoard writers; ``restore`` then only restores. ``startup``:
    the PhaseTimer ``experiment.setup`` began (the first loop finishes it; time_to_target_s counts from its
    start); ``on_restored``: callables(step, history) run once the checkpoint, if any, is restored;
    ``history_class``: the history.jsonl writer (default ``History``); ``hooks``: a ``LoopHooks`` (extra loop
    boundaries and evaluations, told of every loop and boundary, may stop the run; ``tfgpu.fit``'s Keras callbacks)."""

    def __init__(self, config: TrainerConfig, inputs: InputConfig, placement: Placement, task, info,
                 total_steps: int, startup=None, on_restored=(), history_class=None, hooks=None):
        self.config = config
        self.inputs = inputs
        self.placement = placement
        self.strategy = placement.strategy
        self.task = task
        self.info = info
        self.total_steps = total_steps
        self.model_dir = config.model_dir
        self.chief = placement.is_chief
        self.history = (history_class or History)(self.model_dir, self.chief)
        self.hooks = hooks or LoopHooks()
        self.declarations = metric_specs.of_task(task)
        target = target_lib.resolve(config.target, self.declarations) if config.target else None
        if target and not evaluation.evaluates(info, task):
            raise ConfigError("target", "needs evaluations, and this run has no eval split (--eval_split=none)")
        self.startup = startup
        self.on_restored = tuple(on_restored)
        # TensorBoard's runs (chief, --tensorboard), ``summaries.Summaries``.
        self.summaries = Summaries({kind: run_dir.summaries(self.model_dir, run)
                                    for kind, run in (("train", "train"), ("eval", "validation"))}
                                   if self.chief and self.config.tensorboard else {})
        self.step = task.global_step  # the run's one step counter (``loop.step_counter``), the task's
        self.input = InputPosition(inputs, info, placement, "data_dir" if config.data_dir else "dataset",
                                   config.allowed_config_changes, self.step)  # where the input is, what it names
        # A run that will load --init_weights (no checkpoint to restore) checks their file before building anything.
        self._fresh = checkpoint_lib.latest(self.model_dir) is None
        task.check_fine_tuning(loads_initial_weights=self._fresh)
        self._steps_done = 0  # the last step done, named by a failure
        checkpoint_every_s = (durations.seconds(durations.parse(config.checkpoint_every, "checkpoint_every"))
                              if config.checkpoint_every else 0.0)
        with self._failures_named():  # creating variables under several workers broadcasts them: a collective
            with self.strategy.scope():
                task.build()
            train_names = tuple(task.train_metric_names)
            self.nonfinite_names = metric_specs.counting_skips(self.declarations, train_names, task)
            self.train_sums = loop.accumulators(self.strategy, train_names)
            stop_flag = loop.StopFlag(self.strategy, placement.num_workers)  # Ctrl-C, SIGTERM: read between steps
            self.evaluation = evaluation.Evaluation(placement, task, inputs, info, self.declarations, self.history,
                                                    self.summaries, self.input, stop_flag, self.model_dir)
            self.skipped_run = loop.SkippedRun(self.strategy)
            self.checkpointer = checkpoint_lib.Checkpointer(
                self.model_dir, placement, task.checkpoint_items(), self.step, config.keep_checkpoints,
                self.input.record)
            self.stopping = Stopping(placement, self.step, stop_flag, self.checkpointer, checkpoint_every_s)
            self._train_loop = self._traced_train_loop()
        self.loop_log = LoopLog(self.history, self.summaries, task, inputs.examples_per_step, self.nonfinite_names)
        # time_to_target_s counts from the startup timer's start (python -m tfgpu.train: the process's), else now.
        self.tracker = target_lib.Tracker(
            target, startup.started_at if startup else time.time(), self.chief, self.model_dir, self.history,
            self.stopping.any_worker,
            lambda step: durations.epochs_at(step, pipeline.steps_per_epoch(self.inputs, self.info),
                                             self.inputs.examples_per_step, self.input.resumed_examples))

    def _traced_train_loop(self):
        """A fresh train loop; the task's ``at_step`` asks for one when a step trains other variables."""
        return loop.build_loop(self.strategy, lambda batch: self.task.train_step(batch), self.train_sums,
                               self.step, self.inputs.batches_per_step, self.skipped_run, self.nonfinite_names,
                               stop=self.stopping.flag, models=tuple(self.task.checkpoint_items().values()))

    def _every(self, duration, round_up: bool = False) -> set:
        """The steps of each multiple of ``duration`` before the end, epochs counted across the segments of a
        resumed run (``durations.every``: after a batch change an epoch still ends where its records do)."""
        return durations.every(duration, self.total_steps, pipeline.steps_per_epoch(self.inputs, self.info),
                               self.inputs.examples_per_step, self.input.resumed_examples, round_up)

    def _eval_steps(self) -> set:
        return schedule.eval_steps(self.total_steps, self._every(durations.of(self.config, "eval_every")),
                                   self.hooks.evaluations(), evaluation.evaluates(self.info, self.task),
                                   self.tracker.target is not None,
                                   lambda: self._every(durations.Duration(1.0, durations.EPOCHS), round_up=True))

    def _boundaries(self) -> list:
        return schedule.boundaries(self.total_steps, self._eval_steps(), self.config.checkpoint_every_steps,
                                   self.config.profile_steps, self.task.step_boundaries(), self.hooks.boundaries())

    def _profile_input(self, start_step: int) -> dict:
        """--profile_input's measurement; a record it cannot read is the same one line as in training."""
        with self.input.reading():
            return input_profile.measure(
                self.strategy, lambda dataset_fn: loop.input_iterator(self.strategy, self.placement, dataset_fn),
                pipeline.train_dataset_fn(self.inputs, self.info, start_step, plan=self.input.plan,
                                          examples=self.task.examples()), self._train_loop,
                {"step": self.step, **self.task.checkpoint_items()}, self.inputs.global_batch_size,
                self.inputs.examples_per_step, self.skipped_run.reset)

    def evaluate(self, step: int, record: bool = True) -> dict:
        """Runs the task's evaluation; ``record`` appends it to history.jsonl and TensorBoard."""
        return self.evaluation(step, record)

    # -- the loop ----------------------------------------------------------------
    def restore(self, checkpoint_path: str = "") -> int:
        """Restores the latest (or the given) checkpoint into the built task, which it puts in the state of that
        step (``Task.at_step``); returns the step (0 when there is none). Loads nothing else (--init_weights:
        ``start_weights``)."""
        if checkpoint_path:
            step = self.checkpointer.restore(checkpoint_path, "checkpoint")
        else:
            step = self.checkpointer.restore_latest()
        if self.task.at_step(step):
            self._train_loop = self._traced_train_loop()
        if self.task.describe():
            log.info("%s", self.task.describe())
        return step

    def start_weights(self) -> int:
        """The weights training starts from: the latest checkpoint (``restore``), else --init_weights (a restored
        checkpoint always wins: a resumed run never reloads them); returns the step."""
        if self._fresh and self.config.init_weights:
            self.task.load_initial_weights()  # on every worker: each builds its own copy of the model
        return self.restore()

    def _failures_named(self):
        """A TensorFlow error inside as the failure it is (``failures.named``): a lost peer, a failed kernel."""
        return failures.named(self.placement.worker_index, self.placement.num_workers, lambda: self._steps_done,
                              lambda: tf.train.latest_checkpoint(run_dir.checkpoints(self.model_dir)))

    def train(self) -> "results.RunResult":
        """Trains to ``total_steps`` (resuming from the latest checkpoint) and returns the run's results; raises
        ``Preempted`` after the checkpoint a SIGTERM asks for (``Interrupted`` after a Ctrl-C's), at the step in
        flight when it came (``interrupts``)."""
        self._steps_done = 0
        with self._failures_named():
            # Restoring broadcasts variables: a collective too.
            start_step = self._steps_done = self.start_weights()
            self.stopping.saved_step = start_step if start_step else None
            self.input.start(start_step, self.checkpointer.data_position.restored,
                             getattr(self.checkpointer, "restored_path", self.checkpointer.real_dir), self.history)
            if self.startup:
                self.startup.mark("restore")
            # What an earlier process recorded past the checkpoint resumed from: one record per step from here on.
            self.history.cut_after(start_step)
            history.cut_summaries(self.summaries.dirs.values(), start_step)
            if self.chief:  # the run's metric declarations, for the report
                metric_specs.write(self.model_dir, self.declarations)
            for call in self.on_restored:
                call(start_step, self.history)
            handed = restarts.take_handed_record(os.environ, start_step)  # tfgpu.launch could not write it itself
            if handed is not None:
                self.history.write("restart", start_step, handed)
            heartbeat.beat("restored", start_step, self.model_dir)  # tfgpu.launch's view of this worker's progress
            self.hooks.on_train_begin(start_step)
            try:
                with self.stopping.watching():
                    try:
                        result = self._train_from(start_step)
                        heartbeat.beat("done", result.step, self.model_dir)
                        return result
                    except evaluation.Stopped:
                        pass  # raised below, not inside this handler: the stop is the one exception its caller sees
                    self.stopping.stop_at(self._steps_done)
            finally:
                self.checkpointer.close()
                self.summaries.close()

    def _train_from(self, start_step: int) -> "results.RunResult":
        config = self.config
        step = start_step
        last_eval = {}
        eval_steps = self._eval_steps()
        # What a resumed run owes first; at the target: no more training, no more evaluation.
        stopped = self.tracker.resume(step, self.evaluate, 0 < step < self.total_steps and step in eval_steps,
                                      self.startup)
        if step < self.total_steps and not stopped:
            # Released on leaving the block, an error or a preemption included (runtime/feed.py: TF can block that)
            with feed_lib.Feed(loop.input_iterator(self.strategy, self.placement,
                                               pipeline.train_dataset_fn(self.inputs, self.info, step,
                                                                         plan=self.input.plan,
                                                                         examples=self.task.examples()))) as feed:
                profiled = self._profile_input(step) if config.profile_input else None
                progress = Progress(config.verbose, self.total_steps, step, self.chief,
                                    [s.name for s in self.declarations.metrics if s.progress],
                                    self.tracker.target.metric if self.tracker.target else "")
                progress.set_best(self.tracker.best)
                profile = [int(s) for s in config.profile_steps.split(",")] if config.profile_steps else []
                for boundary in (b for b in self._boundaries() if b > step):
                    while step < boundary:
                        if profile and step == profile[0] and self.chief:
                            tf.profiler.experimental.start(run_dir.profile(self.model_dir))
                        num_steps = min(config.steps_per_loop, boundary - step)
                        started = time.perf_counter()
                        # the first call traces and compiles the loop first
                        self.stopping.compiling_from = step if step == start_step else None
                        with self.input.reading():
                            sums, longest_skipped_run, ran = self._train_loop(feed.iterator,
                                                                              tf.constant(num_steps, tf.int64))
                            sums = loop.as_floats(sums)  # reading waits for the steps to finish
                            ran = int(ran)  # fewer than num_steps when a stop signal came (every worker alike)
                        self.stopping.compiling_from = None
                        elapsed = time.perf_counter() - started
                        first_loop = step == start_step
                        step += ran
                        self._steps_done = step
                        heartbeat.beat("training", step, self.model_dir)
                        if profile and step == profile[-1] and self.chief:
                            tf.profiler.experimental.stop()
                        if ran:
                            step_metrics = self.loop_log.write(step, ran, sums, elapsed, progress, first_loop)
                            if self.hooks.on_loop_end(step, ran, step_metrics):
                                boundary = step  # the hooks ask to stop: this loop's end is a boundary
                            if first_loop and self.startup:  # the first loop includes tracing and compilation
                                self._end_startup(start_step)
                        longest_skipped_run = int(round(float(longest_skipped_run)))
                        if longest_skipped_run >= config.max_nonfinite_steps:
                            raise failures.skipped_too_long(
                                longest_skipped_run, config.max_nonfinite_steps, step, self.nonfinite_names,
                                self.checkpointer.real_dir, precision.nonfinite_advice(
                                    self.task.checkpoint_items().values(), self.placement.num_replicas))
                        if ran < num_steps or self.stopping.any_worker_preempted():
                            self.stopping.stop_at(step)
                        if step < self.total_steps and self.stopping.checkpoint_due():
                            self.stopping.save()
                    if step < self.total_steps:
                        saved = bool(config.checkpoint_every_steps and step % config.checkpoint_every_steps == 0)
                        if saved:
                            self.stopping.save()
                        if step in eval_steps:
                            last_eval = self.evaluate(step)
                            stopped = self.tracker.reaches(step, last_eval, progress)
                        stopped = self.hooks.on_boundary(step, last_eval if step in eval_steps else {}) or stopped
                        if stopped:
                            if not saved:
                                self.stopping.save()
                            break
                        if self.task.at_step(step):
                            self._train_loop = self._traced_train_loop()
                progress.close()
            if not stopped:
                self.stopping.save()
            if profiled:
                input_profile.finish(profiled, self.loop_log.examples_per_sec(), self.model_dir, self.chief)
        elif not stopped:
            log.info("already trained to step %d (--train_steps=%d); evaluating only", step, self.total_steps)
        if not stopped:  # a finished run's evaluation is recorded once
            owed = step > start_step or self.tracker.owes_evaluation(step)
            last_eval = self.evaluate(step, record=owed) or last_eval
            self.tracker.reaches(step, last_eval, timed=owed)
        elif not last_eval:  # resumed at the target: the evaluation of the checkpoint, not recorded again
            last_eval = self.tracker.resumed_eval
        self.hooks.on_train_end(step, last_eval)
        result = self.task.extend_result(self.loop_log.result(
            step, last_eval,  # the unreadable records read around, every epoch / evaluation
            skipped_records=records.skipped_records(self.info) if self.inputs.skip_corrupt_records else None,
            target=self.tracker.outcome()))
        if self.tracker.target:
            log.info("%s", target_lib.sentence(result, self.declarations, self.tracker.best))
        return result

    def _end_startup(self, step: int) -> None:
        self.startup.mark("first_loop")
        self.history.write("startup", step, self.startup.record())
        log.info("%s", self.startup.describe())
        self.startup = None
