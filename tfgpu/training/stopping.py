"""How a run stops and saves: a stop signal (SIGTERM: preemption; Ctrl-C), a checkpoint due by --checkpoint_every's
clock, and the votes that make every worker decide alike. The trainer's stop state, behind one object: the loops'
``StopFlag``, the step last saved, and whether the first loop call is still compiling."""
import contextlib
import logging
import time

import tensorflow as tf

from tfgpu.runtime import failures, process_exit
from tfgpu.training import interrupts

log = logging.getLogger("tfgpu")


class Stopping:
    """The stop state of a run on ``placement`` (with ``strategy``): ``flag`` is the loops' ``loop.StopFlag``,
    ``checkpointer`` saves the run's state at ``step`` (its step counter); ``checkpoint_every_s``: --checkpoint_every
    in seconds (0: none)."""

    def __init__(self, placement, step, flag, checkpointer, checkpoint_every_s: float):
        self.strategy = placement.strategy
        self.placement = placement
        self.chief = placement.is_chief
        self.step = step
        self.flag = flag
        self.checkpointer = checkpointer
        self.checkpoint_every_s = checkpoint_every_s
        self.saved_step = None  # the step of the checkpoint last saved or restored
        self.compiling_from = None  # while the first train loop call traces and compiles: the step it starts at
        self.last_timed_save = time.monotonic()  # --checkpoint_every's clock: the last timed save (or the start)

    @contextlib.contextmanager
    def watching(self):
        """Training inside: the first Ctrl-C or SIGTERM asks the loops to stop after the step in flight (a second
        Ctrl-C ends at once, saying what it loses); the flag's clock ticks for several workers' checks."""
        self.flag.clear()
        self.last_timed_save = time.monotonic()
        with interrupts.StopSignals(self.on_signal, self.unsaved, process_exit.in_command()), self.flag.ticking():
            yield

    def on_signal(self, signum: int) -> None:
        """The first SIGTERM or SIGINT (``interrupts.StopSignals``, maybe from its watcher thread while a loop runs):
        the loops stop after the step in flight; the trainer then saves and raises (``stop_at``)."""
        error = failures.stopped_by(signum)
        if self.nothing_to_save():
            interrupts.end_now(failures.EXIT_CODES[error], f"{interrupts.name(signum)} before this run's first step "
                               f"(its train loop still compiling): nothing trained since "
                               f"{'step ' + str(self.saved_step) if self.saved_step else 'the start'}, nothing to "
                               "save; run the same command again to resume")
        self.flag.request(signum)
        log.warning("%s: stopping after the current step to save a checkpoint there, then exiting %d%s",
                    interrupts.name(signum), failures.EXIT_CODES[error],
                    " (Ctrl-C again: stop at once without saving)" if error is failures.Interrupted else "")

    def nothing_to_save(self) -> bool:
        """Whether a command on one worker may end at once: the first loop call is still tracing and compiling (a
        ResNet-56 with XLA on a loaded 2-core CPU took 158 s) and no step ran since the restored checkpoint. Several
        workers stop together after a step instead (one ending alone would leave its peers a lost worker)."""
        if not (self.compiling_from is not None and process_exit.in_command() and self.placement.num_workers == 1):
            return False
        with tf.init_scope():  # Python may run the signal's handler while the main thread traces the loop
            return int(self.step.numpy()) == self.compiling_from

    def checkpoint_due(self) -> bool:
        """--checkpoint_every in time: due when the chief's clock says the interval has passed since the last timed
        save (or the start); the chief decides and every worker learns it in one collective, so all take part in
        the save at the same step."""
        every = self.checkpoint_every_s
        if not every:
            return False
        due = self.chief and time.monotonic() - self.last_timed_save >= every
        if not self.any_worker(due):
            return False
        self.last_timed_save = time.monotonic()
        return True

    def any_worker_preempted(self) -> bool:
        """Whether a stop was requested on any worker (after a loop that ran all its steps: a request made as it
        ended, which its own checks did not see)."""
        return self.any_worker(self.flag.requested_by is not None)

    def save(self) -> str:
        path = self.checkpointer.save()
        self.saved_step = int(self.step.numpy())
        return path

    def stop_at(self, step: int):
        """Saves the checkpoint at ``step`` (unless there is one) and raises the stop's exception (Preempted,
        Interrupted): what a stop signal ends training with. Every worker calls it at the same step."""
        saved_to = (self.save() if self.saved_step != step else
                    tf.train.latest_checkpoint(self.checkpointer.real_dir))
        signum = self.flag.requested_by
        error = failures.stopped_by(signum if isinstance(signum, int) else 0)
        log.warning("%s: checkpoint saved at step %d; rerun the same command to resume",
                    "interrupted" if error is failures.Interrupted else "preempted", step)
        # A worker's own save is a temporary copy: the chief's directory is the one to resume.
        raise error(step, saved_to if self.chief else self.checkpointer.real_dir)

    def unsaved(self) -> str:
        """What a second Ctrl-C loses (said from the signal watcher: no TensorFlow call)."""
        if self.saved_step is None:
            return f"no checkpoint was saved in {self.checkpointer.real_dir}; a rerun starts at step 0"
        return (f"training after step {self.saved_step} is not saved (the last checkpoint, in "
                f"{self.checkpointer.real_dir}); a rerun resumes there")

    def any_worker(self, flag: bool) -> bool:
        """Whether ``flag`` is true on any worker: the same answer on every worker (a collective when there are
        several, so every worker must ask at the same point)."""
        if self.placement.num_workers == 1:
            return flag
        value = tf.constant(1.0 if flag else 0.0)
        per_replica = self.strategy.experimental_distribute_values_from_function(lambda ctx: value)
        return float(self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)) > 0
