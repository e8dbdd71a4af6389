"""The training loop: boundaries, checkpoints, evaluation, preemption, the target and what gets logged.

The compiled part (several steps per host call under any strategy, metric sums, the count of skipped
steps) is ``tfgpu.training.loop``. Loops end early at checkpoint, evaluation, profiling and the task's
boundaries, so those happen at exact steps. The loop names no task and no task's metric: what it logs,
counts as skipped (non-finite) steps and shows in the progress bar comes from the task's metric
declarations (``Task.metrics``), written with the loop's own (``metric_specs.LOOP_METRICS``) to
``<model_dir>/metric_specs.json`` for the report. How a run fails is ``tfgpu.training.failures``; what it
logs is ``tfgpu.training.history``; --target's rule is ``tfgpu.training.target``; the results it returns
(metrics.json) are ``tfgpu.training.results``; --profile_input is ``tfgpu.training.input_profile``. The
Trainer reads only its ``TrainerConfig`` and hands the pipeline its ``InputConfig``. It stays one module
(~400 lines) because boundaries, preemption, evaluation, the target and the startup record all act on the
same loop state between two compiled calls.
"""
import contextlib
import logging
import math
import os
import time

import numpy as np
import tensorflow as tf

from tfgpu import durations
from tfgpu.config import ConfigError, InputConfig, TrainerConfig
from tfgpu.data import pipeline, records
from tfgpu.data.input_position import InputPosition
from tfgpu.runtime import precision
from tfgpu.runtime import heartbeat
from tfgpu.runtime import process_exit
from tfgpu.runtime.distribute import Placement
from tfgpu.training import checkpoint as checkpoint_lib
from tfgpu.training import failures, input_profile, interrupts, loop, metric_specs, results
from tfgpu.training import target as target_lib
from tfgpu.training.failures import KernelFailed, NonFiniteError, Preempted, WorkerLost  # noqa: F401 (re-exported)
from tfgpu.training import history
from tfgpu.training.history import History, Progress
from tfgpu.training.hooks import LoopHooks

log = logging.getLogger("tfgpu")


def step_counter(strategy) -> tf.Variable:
    """The run's one step counter, made before the task so that the task is built with it (``Task.__init__``): it
    counts every step, skipped or not; the train loop advances it, checkpoints save it, schedules and a GAN's
    random draws follow it."""
    with strategy.scope():
        return tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step",
                           aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)


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
        self.target = target_lib.resolve(config.target, self.declarations) if config.target else None
        if self.target and not self._evaluates:
            raise ConfigError("target", "needs evaluations, and this run has no eval split (--eval_split=none)")
        # time_to_target_s counts from the startup timer's start (python -m tfgpu.train: the process's), else now.
        self.started_at = startup.started_at if startup else time.time()
        self.startup = startup
        self.on_restored = tuple(on_restored)
        self._target_hit = None  # step, epochs and seconds of the evaluation that reached the target
        self._target_best = None  # the best value of the target's metric evaluated so far
        self._resumed_eval = {}  # the evaluation of a checkpoint resumed from that already reaches the target
        self.step = task.global_step  # the run's one step counter (``step_counter``), which the task was built with
        self.input = InputPosition(inputs, info, placement, "data_dir" if config.data_dir else "dataset",
                                   config.allowed_config_changes, self.step)  # where the input is, what it names
        # A run that will load --init_weights (no checkpoint to restore) checks their file before building anything.
        self._fresh = checkpoint_lib.latest(self.model_dir) is None
        task.check_fine_tuning(loads_initial_weights=self._fresh)
        self._steps_done = 0
        self._checkpoint_every_s = (durations.seconds(durations.parse(config.checkpoint_every, "checkpoint_every"))
                                    if config.checkpoint_every else 0.0)
        self._saved_step = None  # the step of the checkpoint last saved or restored
        self._compiling = False  # inside the first train loop call, which compiles before its first step
        with self._failures_named():  # creating variables under several workers broadcasts them: a collective
            self._build()

    def _declared(self, train_names) -> tuple:
        """The train-step keys that count skipped steps; a ValueError for a key the task does not declare."""
        declared = {s.name: s for s in self.declarations.metrics if s.kind == "train"}
        missing = [name for name in train_names if name not in declared]
        if missing:
            raise ValueError(f"task {self.task.name!r} returns train metrics {', '.join(missing)} that "
                             f"{type(self.task).__name__}.metrics does not declare")
        return tuple(name for name in train_names if declared[name].counts_nonfinite)

    def write_metric_specs(self) -> None:
        """The run's metric declarations, for the report (chief only)."""
        if self.chief:
            metric_specs.write(self.model_dir, self.declarations)

    # -- setup ---------------------------------------------------------------
    def _build(self):
        """The task's models and optimizers, the loops' accumulators and compiled loops, the checkpointer and (on the
        chief, with --tensorboard) the writers."""
        with self.strategy.scope():
            self.task.build()
        train_names = tuple(self.task.train_metric_names)
        self.nonfinite_names = self._declared(train_names)
        self.train_sums = loop.accumulators(self.strategy, train_names)
        self.eval_sums = loop.accumulators(self.strategy, self.task.eval_metric_names())
        self.skipped_run = loop.SkippedRun(self.strategy)
        self._stop = loop.StopFlag(self.strategy, self.placement.num_workers)  # Ctrl-C, SIGTERM: read between steps
        self.checkpointer = checkpoint_lib.Checkpointer(
            self.model_dir, self.placement, self.task.checkpoint_items(), self.step, self.config.keep_checkpoints,
            self.input.record)

        self._trace_train_loop()
        # The task's step as it is when the loop traces (tests wrap it after construction).
        self._eval_loop = loop.build_loop(self.strategy, lambda batch: self.task.eval_step(batch), self.eval_sums,
                                          stop=self._stop)
        # TensorBoard's runs (chief, --tensorboard), each writer made at its first record: after train() has cut
        # what an earlier process recorded past the checkpoint (history.cut_summaries) from the files it left.
        self._summary_dirs = ({kind: os.path.join(self.model_dir, "summaries", run)
                               for kind, run in (("train", "train"), ("eval", "validation"))}
                              if self.chief and self.config.tensorboard else {})
        self._writers = {}

    def _trace_train_loop(self):
        """A fresh train loop; the task's ``at_step`` asks for one when a step trains other variables."""
        self._train_loop = loop.build_loop(self.strategy, lambda batch: self.task.train_step(batch), self.train_sums,
                                           self.step, self.inputs.batches_per_step, self.skipped_run,
                                           self.nonfinite_names, stop=self._stop)

    def _eval_steps(self) -> set:
        """Steps before the last at which the run evaluates: every --eval_every_steps; with a target and no
        --eval_every_steps, the first step at or after each epoch's end."""
        c = self.config
        if not self._evaluates:
            return set()
        asked = {s for s in self.hooks.evaluations() if 0 < s < self.total_steps}
        if c.eval_every_steps:
            return asked | set(range(c.eval_every_steps, self.total_steps, c.eval_every_steps))
        if asked:
            return asked
        if not self.target:
            return set()
        per_epoch = pipeline.steps_per_epoch(self.inputs, self.info)
        ends = (math.ceil(k * per_epoch - 1e-9) for k in range(1, int(self.total_steps / per_epoch) + 1))
        return {s for s in ends if 0 < s < self.total_steps}

    def _boundaries(self) -> list:
        c = self.config
        marks = set(self._eval_steps())
        if c.checkpoint_every_steps:
            marks.update(range(c.checkpoint_every_steps, self.total_steps, c.checkpoint_every_steps))
        if c.profile_steps:
            marks.update(int(s) for s in c.profile_steps.split(","))
        marks.update(self.task.step_boundaries())
        marks.update(self.hooks.boundaries())
        return sorted(m for m in marks if 0 < m < self.total_steps) + [self.total_steps]

    @property
    def _evaluates(self) -> bool:
        """Whether this run evaluates: with an eval split, or with a task that evaluates without one."""
        return bool(self.info.eval_split) or self.task.evaluates_without_eval_split

    def _profile_input(self, start_step: int) -> dict:
        """--profile_input's measurement; a record it cannot read is the same one line as in training."""
        with self.input.reading():
            return input_profile.measure(
                self.strategy, lambda dataset_fn: loop.input_iterator(self.strategy, self.placement, dataset_fn),
                pipeline.train_dataset_fn(self.inputs, self.info, start_step, plan=self.input.plan,
                                          examples=self.task.examples()), self._train_loop,
                {"step": self.step, **self.task.checkpoint_items()}, self.inputs.global_batch_size,
                self.inputs.examples_per_step, self.skipped_run.reset)

    # -- stopping: SIGTERM (preemption), Ctrl-C ---------------------------------
    def _on_stop_signal(self, signum: int) -> None:
        """The first SIGTERM or SIGINT (``interrupts.StopSignals``, maybe from its watcher thread while a loop runs):
        the loops stop after the step in flight; the trainer then saves and raises (``_stop_at``)."""
        error = failures.stopped_by(signum)
        if self._nothing_to_save():
            interrupts.end_now(failures.EXIT_CODES[error], f"{interrupts.name(signum)} before this run's first step "
                               f"(its train loop still compiling): nothing trained since "
                               f"{'step ' + str(self._saved_step) if self._saved_step else 'the start'}, nothing to "
                               "save; run the same command again to resume")
        self._stop.request(signum)
        log.warning("%s: stopping after the current step to save a checkpoint there, then exiting %d%s",
                    interrupts.name(signum), failures.EXIT_CODES[error],
                    " (Ctrl-C again: stop at once without saving)" if error is failures.Interrupted else "")

    def _nothing_to_save(self) -> bool:
        """Whether a command on one worker may end at once: the first loop call is still tracing and compiling (a
        ResNet-56 with XLA on a loaded 2-core CPU took 158 s) and no step ran since the restored checkpoint. Several
        workers stop together after a step instead (one ending alone would leave its peers a lost worker)."""
        if not (self._compiling and process_exit.in_command() and self.placement.num_workers == 1):
            return False
        with tf.init_scope():  # Python may run the signal's handler while the main thread traces the loop
            return int(self.step.numpy()) == self._steps_done

    def _checkpoint_due(self) -> bool:
        """--checkpoint_every in time: due when the chief's clock says the interval has passed since the last timed
        save (or the start); the chief decides and every worker learns it in one collective, so all take part in
        the save at the same step."""
        every = self._checkpoint_every_s
        if not every:
            return False
        due = self.chief and time.monotonic() - self._last_timed_save >= every
        if not self._any_worker(due):
            return False
        self._last_timed_save = time.monotonic()
        return True

    def _any_worker_preempted(self) -> bool:
        """Whether a stop was requested on any worker (after a loop that ran all its steps: a request made as it
        ended, which its own checks did not see)."""
        return self._any_worker(self._stop.requested_by is not None)

    def _save(self) -> str:
        path = self.checkpointer.save()
        self._saved_step = int(self.step.numpy())
        return path

    def _stop_at(self, step: int):
        """Saves the checkpoint at ``step`` (unless there is one) and raises the stop's exception (Preempted,
        Interrupted): what a stop signal ends training with. Every worker calls it at the same step."""
        saved_to = (self._save() if self._saved_step != step else
                    tf.train.latest_checkpoint(self.checkpointer.real_dir))
        signum = self._stop.requested_by
        error = failures.stopped_by(signum if isinstance(signum, int) else 0)
        log.warning("%s: checkpoint saved at step %d; rerun the same command to resume",
                    "interrupted" if error is failures.Interrupted else "preempted", step)
        # A worker's own save is a temporary copy: the chief's directory is the one to resume.
        raise error(step, saved_to if self.chief else self.checkpointer.real_dir)

    def _unsaved(self) -> str:
        """What a second Ctrl-C loses (said from the signal watcher: no TensorFlow call)."""
        if self._saved_step is None:
            return f"no checkpoint was saved in {self.checkpointer.real_dir}; a rerun starts at step 0"
        return (f"training after step {self._saved_step} is not saved (the last checkpoint, in "
                f"{self.checkpointer.real_dir}); a rerun resumes there")

    def _any_worker(self, flag: bool) -> bool:
        """Whether ``flag`` is true on any worker: the same answer on every worker (a collective when there are
        several, so every worker must ask at the same point)."""
        if self.placement.num_workers == 1:
            return flag
        value = tf.constant(1.0 if flag else 0.0)
        per_replica = self.strategy.experimental_distribute_values_from_function(lambda ctx: value)
        return float(self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)) > 0

    # -- the target ------------------------------------------------------------
    def _reaches_target(self, step: int, metrics: dict, progress=None, timed: bool = True) -> bool:
        """Whether the evaluation ``metrics`` at ``step`` reaches --target, decided together by all workers
        (a GAN scores FID on the chief alone, so the others have no value to compare); records when it did, with
        the time from this process's start unless the evaluation is not ``timed`` (it reran one of an earlier
        process, whose time is unknown)."""
        if self.target is None or self._target_hit is not None:
            return False
        value = metrics.get(self.target.metric)
        self._target_best = self.target.better(value, self._target_best)
        if progress is not None:
            progress.set_best(self._target_best)
        if not self._any_worker(self.target.reached(value)):
            return False
        self._target_hit = {"step": step, "seconds": time.time() - self.started_at if timed else None,
                            "epochs": durations.epochs_at(step, pipeline.steps_per_epoch(self.inputs, self.info),
                                                          self.inputs.examples_per_step, self.input.resumed_examples)}
        return True

    # -- resuming --------------------------------------------------------------
    def _resume(self, step: int) -> bool:
        """What a run resumed at ``step`` owes before it trains on; returns True when it trains no further.

        A target metrics.json records as reached at this step keeps its time, step and epochs: the checkpoint
        is evaluated for the final metrics but not recorded again. An evaluation step whose record is missing
        from history.jsonl (a preemption saved the checkpoint before it ran) is evaluated and recorded now, as
        an uninterrupted run would have; with a target, a recorded one is evaluated again (not recorded) to see
        whether it reached the target."""
        recorded = self._recorded_target(step)
        if recorded is not None:
            self._target_hit = recorded
            self._resumed_eval = self.evaluate(step, record=False)
            self._target_best = self.target.better(self._resumed_eval.get(self.target.metric), None)
            log.info("target %s already reached at step %d (the checkpoint resumed from): not training further",
                     self.target.describe(), step)
            return True
        if not (0 < step < self.total_steps) or step not in self._eval_steps():
            return False
        owed = self._owes_evaluation(step)
        if not owed and self.target is None:
            return False
        if owed:
            log.info("evaluating step %d first: the run that saved its checkpoint stopped before evaluating it", step)
        self._resumed_eval = self.evaluate(step, record=owed)
        if owed and self.startup:
            self.startup.mark("owed_evaluation")  # its own phase of the startup record, not the first loop's
        return self._reaches_target(step, self._resumed_eval, timed=owed)

    def _owes_evaluation(self, step: int) -> bool:
        """Whether history.jsonl lacks the evaluation of ``step``; the chief's record decides for every worker."""
        return self._any_worker(self.chief and step not in self.history.steps("eval"))

    def _recorded_target(self, step: int) -> dict | None:
        """The target's hit (step, epochs, seconds) as metrics.json records it, when it records this --target as
        reached at ``step``; the chief's file decides for every worker. A metrics.json that does not read
        records nothing (said in the log): the evaluation of the checkpoint then decides."""
        if self.target is None:
            return None
        outcome = None
        if self.chief:
            try:
                before = results.read(self.model_dir)
            except ConfigError as e:
                log.warning("%s: whether the target was reached is decided by evaluating the checkpoint", e.reason)
                before = None
            outcome = before.target if before is not None else None
        reached = (outcome is not None and outcome.target == str(self.target) and outcome.reached
                   and outcome.step == step)
        if not self._any_worker(reached):
            return None
        return {"step": step, "seconds": outcome.seconds if outcome else None,
                "epochs": outcome.epochs if outcome else None}

    # -- evaluation ------------------------------------------------------------
    def evaluate(self, step: int, record: bool = True) -> dict:
        """Runs the task's evaluation; ``record`` appends it to history.jsonl and TensorBoard."""
        if not self._evaluates:
            return {}

        def run_eval():
            steps = pipeline.eval_steps(self.inputs, self.info, self.placement.num_workers,
                                        self.placement.num_replicas)
            with loop.Feed(loop.input_iterator(self.strategy, self.placement,
                                               pipeline.eval_dataset_fn(self.inputs, self.info, steps,
                                                                        self.task.examples()))) as feed:
                sums, _, ran = self._eval_loop(feed.iterator, tf.constant(steps))
                if int(ran) < steps:  # a stop signal: no metric from part of the split
                    raise _EvaluationStopped()
            return loop.as_floats(sums)

        start = time.time()
        with self.input.reading():
            metrics = self.task.evaluate(run_eval, step, self.model_dir)
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
            self._summaries("eval", step, metrics)
            log.info("eval step %d: %s", step, _fmt(metrics))
        return metrics

    # -- logging ---------------------------------------------------------------
    def _summaries(self, kind: str, step: int, values: dict):
        """TensorBoard scalars as Keras writes them: runs ``summaries/train`` and ``summaries/validation`` with the
        same tag for the same metric (``loss``, ``accuracy``: an evaluation's ``val_`` prefix is the run's name),
        so train and validation curves overlay."""
        if kind not in self._summary_dirs:
            return
        if kind not in self._writers:
            self._writers[kind] = tf.summary.create_file_writer(self._summary_dirs[kind])
        writer = self._writers[kind]
        with writer.as_default(step=step):
            for name, value in values.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                    tf.summary.scalar(name[len("val_"):] if kind == "eval" and name.startswith("val_") else name,
                                      value)
        writer.flush()

    # -- the loop ----------------------------------------------------------------
    def restore(self, checkpoint_path: str = "", initial_weights: bool = False) -> int:
        """Restores the latest (or the given) checkpoint into the built task; returns its step (0 when there is
        none). With ``initial_weights`` (training) and no checkpoint to restore, the task loads --init_weights
        instead: a restored checkpoint always wins, so a resumed run never reloads them."""
        fresh = not checkpoint_path and self._fresh
        if checkpoint_path:
            step = self.checkpointer.restore(checkpoint_path, "checkpoint")
        else:
            step = self.checkpointer.restore_latest()
        if initial_weights and fresh and self.config.init_weights:
            self.task.load_initial_weights()  # on every worker: each builds its own copy of the model
        if self.task.at_step(step):
            self._trace_train_loop()
        if self.task.describe():
            log.info("%s", self.task.describe())
        return step

    @contextlib.contextmanager
    def _failures_named(self):
        """A TensorFlow error inside as the failure it is: WorkerLost when a collective lost a peer, KernelFailed
        when a kernel failed here (each naming this worker, the last step done and the last checkpoint)."""
        try:
            yield
        except tf.errors.OpError as e:
            last = tf.train.latest_checkpoint(checkpoint_lib.checkpoint_dir(self.model_dir))
            if self.placement.num_workers > 1 and failures.lost_peer(e):
                raise failures.worker_lost(e, self.placement.worker_index, self._steps_done, last) from None
            if isinstance(e, failures.kernel_errors()):
                raise failures.kernel_failed(e, self.placement.worker_index, self._steps_done, last) from e
            raise

    def train(self) -> "results.RunResult":
        """Trains to ``total_steps`` (resuming from the latest checkpoint) and returns the run's results; raises
        ``Preempted`` after the checkpoint a SIGTERM asks for (``Interrupted`` after a Ctrl-C's), at the step in
        flight when it came (``interrupts``)."""
        self._steps_done = 0
        with self._failures_named():
            # Restoring broadcasts variables: a collective too.
            start_step = self._steps_done = self.restore(initial_weights=True)
            self._saved_step = start_step if start_step else None
            self.input.start(start_step, self.checkpointer.data_position.restored,
                             getattr(self.checkpointer, "restored_path", self.checkpointer.real_dir), self.history)
            if self.startup:
                self.startup.mark("restore")
            # What an earlier process recorded past the checkpoint resumed from: one record per step from here on.
            self.history.cut_after(start_step)
            history.cut_summaries(self._summary_dirs.values(), start_step)
            self.write_metric_specs()
            for call in self.on_restored:
                call(start_step, self.history)
            self._stop.clear()
            heartbeat.beat("restored", start_step, self.model_dir)  # tfgpu.launch's view of this worker's progress
            self.hooks.on_train_begin(start_step)
            try:
                with interrupts.StopSignals(self._on_stop_signal, self._unsaved, process_exit.in_command()), \
                        self._stop.ticking():
                    try:
                        result = self._train_from(start_step)
                        heartbeat.beat("done", result.step, self.model_dir)
                        return result
                    except _EvaluationStopped:
                        pass  # raised below, not inside this handler: the stop is the one exception its caller sees
                    self._stop_at(self._steps_done)
            finally:
                self.checkpointer.close()

    def _train_from(self, start_step: int) -> "results.RunResult":
        config = self.config
        step = start_step
        last, last_eval, rates = {}, {}, []
        eval_steps = self._eval_steps()
        self._last_timed_save = time.monotonic()
        stopped = self._resume(step)  # at the target: no more training, no more evaluation
        if step < self.total_steps and not stopped:
            # Released on leaving the block, an error or a preemption included (loop.Feed: TF can block that)
            with loop.Feed(loop.input_iterator(self.strategy, self.placement,
                                               pipeline.train_dataset_fn(self.inputs, self.info, step,
                                                                         plan=self.input.plan,
                                                                         examples=self.task.examples()))) as feed:
                profiled = self._profile_input(step) if config.profile_input else None
                progress = Progress(config.verbose, self.total_steps, step, self.chief,
                                    [s.name for s in self.declarations.metrics if s.progress],
                                    self.target.metric if self.target else "")
                progress.set_best(self._target_best)
                profile = [int(s) for s in config.profile_steps.split(",")] if config.profile_steps else []
                for boundary in (b for b in self._boundaries() if b > step):
                    while step < boundary:
                        if profile and step == profile[0] and self.chief:
                            tf.profiler.experimental.start(os.path.join(self.model_dir, "profile"))
                        num_steps = min(config.steps_per_loop, boundary - step)
                        started = time.perf_counter()
                        self._compiling = step == start_step  # the first call traces and compiles the loop first
                        with self.input.reading():
                            sums, longest_skipped_run, ran = self._train_loop(feed.iterator,
                                                                              tf.constant(num_steps, tf.int64))
                            sums = loop.as_floats(sums)  # reading waits for the steps to finish
                            ran = int(ran)  # fewer than num_steps when a stop signal came (every worker alike)
                        self._compiling = False
                        elapsed = time.perf_counter() - started
                        first_loop = step == start_step
                        step += ran
                        self._steps_done = step
                        heartbeat.beat("training", step, self.model_dir)
                        if profile and step == profile[-1] and self.chief:
                            tf.profiler.experimental.stop()
                        if ran:
                            last = self._log_loop(step, ran, sums, elapsed, progress)
                            if self.hooks.on_loop_end(step, ran, last["step_metrics"]):
                                boundary = step  # the hooks ask to stop: this loop's end is a boundary
                            if not first_loop:  # the first loop includes tracing and compilation
                                rates.append(last["record"]["examples_per_sec"])
                            elif self.startup:
                                self._end_startup(start_step)
                        self._stop_on_skipped_run(step, int(round(float(longest_skipped_run))))
                        if ran < num_steps or self._any_worker_preempted():
                            self._stop_at(step)
                        if step < self.total_steps and self._checkpoint_due():
                            self._save()
                    if step < self.total_steps:
                        saved = bool(config.checkpoint_every_steps and step % config.checkpoint_every_steps == 0)
                        if saved:
                            self._save()
                        if step in eval_steps:
                            last_eval = self.evaluate(step)
                            stopped = self._reaches_target(step, last_eval, progress)
                        stopped = self.hooks.on_boundary(step, last_eval if step in eval_steps else {}) or stopped
                        if stopped:
                            if not saved:
                                self._save()
                            break
                        if self.task.at_step(step):
                            self._trace_train_loop()
                progress.close()
            if not stopped:
                self._save()
            if profiled:
                input_profile.finish(profiled, float(np.median(rates)) if rates else
                                     last["record"]["examples_per_sec"], self.model_dir, self.chief)
        elif not stopped:
            log.info("already trained to step %d (--train_steps=%d); evaluating only", step, self.total_steps)
        if not stopped:  # a finished run's evaluation is recorded once
            owed = step > start_step or self._owes_evaluation(step)
            last_eval = self.evaluate(step, record=owed) or last_eval
            self._reaches_target(step, last_eval, timed=owed)
        elif not last_eval:  # resumed at the target: the evaluation of the checkpoint, not recorded again
            last_eval = self._resumed_eval
        self.hooks.on_train_end(step, last_eval)
        values = {}
        if last:  # the train step's metrics as train_<name>; learning rates and loss scales as they are
            values.update({f"train_{k}": v for k, v in last["step_metrics"].items()})
            values.update(last["task_state"])
        values.update(last_eval)
        result = self.task.extend_result(results.RunResult(
            step=step, values=values,
            examples_per_sec=(float(np.median(rates)) if rates else last["record"]["examples_per_sec"] if last
                              else 0.0),
            # the unreadable records read around, every epoch / evaluation
            skipped_records=records.skipped_records(self.info) if self.inputs.skip_corrupt_records else None,
            target=results.TargetOutcome.of(self.target, self._target_hit) if self.target else None))
        if self.target:
            log.info("%s", target_lib.sentence(result, self.declarations, self._target_best))
        return result

    def _end_startup(self, step: int) -> None:
        self.startup.mark("first_loop")
        self.history.write("startup", step, self.startup.record())
        log.info("%s", self.startup.describe())
        self.startup = None

    def _log_loop(self, step: int, num_steps: int, sums: dict, elapsed: float, progress) -> dict:
        """One loop's record (history.jsonl, TensorBoard, progress): the step metrics averaged over the loop
        (those that count skipped steps summed), the task's learning rates and loss scales, and throughput.
        Returns the record and its parts."""
        step_metrics = {name: (int(round(value)) if name in self.nonfinite_names else value / num_steps)
                        for name, value in sums.items()}
        task_state = {**self.task.learning_rates(), **self.task.loss_scales()}
        record = {**step_metrics, **task_state,
                  "examples_per_sec": num_steps * self.inputs.examples_per_step / elapsed,
                  "step_time_ms": 1000 * elapsed / num_steps}
        self.history.write("train", step, record)
        self._summaries("train", step, record)
        progress.update(step, record)
        return {"record": record, "step_metrics": step_metrics, "task_state": task_state}

    def _stop_on_skipped_run(self, step: int, longest_skipped_run: int) -> None:
        """Raises NonFiniteError when --max_nonfinite_steps steps in a row were skipped (``longest_skipped_run``:
        the longest run that reached into the loop ending at ``step``)."""
        limit = self.config.max_nonfinite_steps
        if longest_skipped_run >= limit:
            counted = ", ".join(self.nonfinite_names)
            raise NonFiniteError(
                f"{longest_skipped_run} consecutive steps (no finite step between them, counted across "
                f"loops) had a non-finite loss or gradient and were skipped, by step {step} "
                f"(--max_nonfinite_steps={limit}; scattered skips do not count, "
                f"each loop's are in history.jsonl as {counted}). A skipped step changes no "
                f"weight, so the last checkpoint in {self.checkpointer.real_dir} is good. "
                + precision.nonfinite_advice(self.task.checkpoint_items().values(), self.placement.num_replicas))


class _EvaluationStopped(Exception):
    """A stop signal ended an evaluation part way (``Trainer.train`` saves and stops)."""


def _fmt(values: dict) -> str:
    return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items())
