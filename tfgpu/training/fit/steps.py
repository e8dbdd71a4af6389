"""The model's own ``train_step``/``test_step``, several per host call, under ``strategy.run``.

Keras 3's ``fit`` cannot run several steps per call under MirroredStrategy (its loop calls ``strategy.run`` inside a
``tf.cond``) nor start under MultiWorkerMirroredStrategy; this loop does neither: the call's first step runs before
the loop of the rest (``training.loop.run_steps``, tfgpu's one loop over steps), whose condition checks the stop
flag (``training.loop.StopFlag``: a Ctrl-C or SIGTERM ends the call after the step in flight) and, for an input of
unknown length, whether a next batch exists. Each step
is the model's own (its ``compute_loss``, compiled losses and metrics, ``add_loss``, loss scaling, a GAN's two
optimizers); its logs are reduced over replicas as Keras reduces them (``model.distribute_reduction_method``; over
workers element-wise). ``jit_compile=True`` compiles the replica step with XLA; ``run_eagerly=True`` runs each step
eagerly, one per call, as Keras does. A training call ends by averaging the weights Keras 3 leaves replica-local
(BatchNormalization's moving statistics: ``training.replica_local``), so every replica and worker holds one model.
"""
import tensorflow as tf

from tfgpu.runtime import replica_batches
from tfgpu.training import keras_adapter, loop as loop_lib, replica_local
from tfgpu.training.fit import inputs


class StepLoop:
    """The compiled loops of one model's ``step`` (``"train"`` or ``"test"``) on ``strategy``; ``stop``: the run's
    ``loop.StopFlag`` (None: the call runs all its steps)."""

    def __init__(self, model, strategy, step: str, stop=None):
        self.model, self.strategy, self.stop = model, strategy, stop
        step_fn = model.train_step if step == "train" else model.test_step
        self.eager = bool(model.run_eagerly)
        if model.jit_compile is True and not self.eager:
            step_fn = tf.function(step_fn, jit_compile=True, reduce_retracing=True)
        if step == "test" and strategy.num_replicas_in_sync > 1:  # a last batch smaller than the replicas
            step_fn = replica_batches.guard(model, step_fn, "test")
        self.step_fn = step_fn
        self.training = step == "train"
        self._known = self._optional = self._single = None
        # One step (strategy.run and the reduction of its logs) is a function of its own inside the loop, as Keras'
        # one_step_on_data: its graph is then optimized as model.fit's is (inlined in the loop's body, a
        # gradient-of-a-gradient step was rounded otherwise: a WGAN-GP's weights 1e-7 apart after 4 steps,
        # tests/tasks/gan/test_model.py).
        self._one_step = self._replica_step if self.eager else tf.function(self._replica_step, reduce_retracing=True,
                                                                             autograph=False)

    def _replica_step(self, batch):
        return keras_adapter.run_step(self.strategy, self.step_fn, batch,
                                      getattr(self.model, "_distribute_reduction_method", None) or "auto")

    def trace_first_step(self, batch_spec) -> None:
        """Traces one step on batches of ``batch_spec`` without running it, so that what the model's first step
        creates (the optimizers of a model with no ``call``, which Keras builds there) exists before a checkpoint is
        restored into it; nothing is trained and no data is drawn."""
        tf.function(self._one_step).get_concrete_function(batch_spec)

    def _end_of_call(self):
        """Averages the replica-local weights after a training call (they exist once the first step has built the
        model, so this is traced after it)."""
        if self.training:
            replica_local.average_over_replicas(self.strategy,
                                                replica_local.replica_local_weights(self.model, self.strategy))

    def _step_and_average(self, batch):
        logs = self._one_step(batch)
        self._end_of_call()
        return logs

    def _stopping(self, logs):
        if self.stop is None:
            return tf.constant(False)
        return self.stop.after_step(tf.nest.flatten(logs))

    def run(self, iterator, num_steps: int):
        """Runs up to ``num_steps`` steps on an iterator that holds at least that many batches; returns (the last
        step's logs, steps run, whether a stop was asked for: the same on every worker, which all stop after that
        step)."""
        if self.eager:
            return self._step_and_average(next(iterator)), 1, self._asked()
        if self._known is None:
            self._known = self._compile_known()
        logs, ran, stopped = self._known(iterator, tf.constant(num_steps, tf.int64))
        return logs, int(ran.numpy()), bool(stopped.numpy())

    def run_on(self, data, iterator, num_steps: int):
        """``run`` for arrays (their length is known on every worker), ``run_until_end`` for a pipeline."""
        if data.kind in inputs.BY_INDEX:
            return self.run(iterator, num_steps)
        return self.run_until_end(iterator, num_steps)

    def _asked(self) -> bool:
        """After an eager step (one worker): whether a stop was asked for."""
        return self.stop is not None and self.stop.requested_by is not None

    def run_until_end(self, iterator, num_steps: int):
        """As ``run`` on an iterator that may end first: (logs, steps run, stopped), or (None, 0, False) when it held
        no batch.
        The call's first batch is asked for here (one host sync a call; several workers agree whether it exists)."""
        first = iterator.get_next_as_optional()
        if not bool(first.has_value()):
            return None, 0, False
        if self.eager:
            return self._step_and_average(first.get_value()), 1, self._asked()
        if num_steps == 1:  # the loop below draws a second batch before its first iteration
            if self._single is None:
                self._single = tf.function(lambda batch: self._with_stop(self._step_and_average(batch)), autograph=False,
                                           reduce_retracing=True)
            logs, stopped = self._single(first.get_value())
            return logs, 1, bool(stopped.numpy())
        if self._optional is None:
            self._optional = self._compile_optional()
        logs, ran, stopped = self._optional(first.get_value(), iterator, tf.constant(num_steps, tf.int64))
        return logs, int(ran.numpy()), bool(stopped.numpy())

    def _with_stop(self, logs):
        return logs, self._stopping(logs)

    def _step(self, batch, logs):
        """One step for ``loop.run_steps``: its logs are what the loop carries, and what a stop waits for."""
        logs = self._one_step(batch)
        return logs, tf.nest.flatten(logs)

    def _compile_known(self):
        @tf.function(autograph=False, reduce_retracing=True)
        def loop(iterator, num_steps):
            ran, stopped, logs = loop_lib.run_steps(self._step, num_steps, None, next_batch=lambda: next(iterator),
                                                    first=next(iterator), stop=self.stop)
            self._end_of_call()
            return logs, ran, stopped

        return loop

    def _compile_optional(self):
        @tf.function(autograph=False, reduce_retracing=True)
        def loop(first, iterator, num_steps):
            ran, stopped, logs = loop_lib.run_steps(self._step, num_steps, None, iterator=iterator, first=first,
                                                    stop=self.stop)
            self._end_of_call()
            return logs, ran, stopped

        return loop
