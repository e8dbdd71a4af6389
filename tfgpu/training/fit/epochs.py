"""The loop of ``tfgpu.fit``: Keras' ``fit`` loop, epoch by epoch, around tfgpu's compiled steps.

It is ``keras.Model.fit``'s loop as Keras 3.15 writes it (``keras/src/backend/tensorflow/trainer.py``): metrics reset
at each epoch's start, ``on_train_batch_begin/end`` around each host call with the last step's logs, the epoch's logs
read from the model's metrics (``_get_metrics_result_or_logs``), validation through the model's ``test_step`` with
the same callbacks (``on_test_*``) and ``val_`` logs, ``stop_training`` honoured after the call it is set in,
``finalize_variable_values`` at the end. What tfgpu adds: the batches come from its inputs (arrays by index, a
Dataset as written), a host call runs ``steps_per_loop`` steps when no callback acts on single batches (else
``steps_per_execution``, as Keras), a Ctrl-C or SIGTERM stops after the step in flight and saves, checkpoints on a
timer, a resumed run starts at the checkpoint's epoch and step, the launcher sees a heartbeat after every call.
"""
import contextlib
import logging

import tensorflow as tf

from tfgpu.runtime import failures, heartbeat
from tfgpu.training.fit import inputs, placement as placement_lib
from tfgpu.training.fit.steps import StepLoop

log = logging.getLogger("tfgpu")
RAN_OUT = ("Your input ran out of data; interrupting training. Make sure that your dataset or generator can generate "
           "at least `steps_per_epoch * epochs` batches.")  # Keras' epoch iterator's words


class Epochs:
    """One ``tfgpu.fit`` call's training: ``model`` on ``placement``, ``train``/``val`` inputs (``ArrayInput`` or
    ``DatasetInput``; val may be None), Keras' ``callbacks`` (a ``CallbackList``), the run's ``state``
    (``state.RunState``) and ``stopping`` (``training.stopping.Stopping``)."""

    def __init__(self, model, placement, train, val, callbacks, state, stopping, steps_per_call: int,
                 validation_freq: int, model_dir: str):
        self.model, self.placement, self.train, self.val = model, placement, train, val
        self.callbacks, self.state, self.stopping = callbacks, state, stopping
        self.steps_per_call, self.validation_freq, self.model_dir = steps_per_call, validation_freq, model_dir
        self.train_steps = StepLoop(model, placement.strategy, "train", stopping.flag)
        self.test_steps = StepLoop(model, placement.strategy, "test")
        self.held = None  # the iterator Keras' epoch iterator holds (with steps_per_epoch it runs on across epochs)
        self.running_seen = 0  # batches the held iterator gave (a pipeline of known length: Keras' _steps_seen)

    def run(self, epochs: int, initial_epoch: int = 0):
        """Trains from the state's position to the end of epoch ``epochs - 1``; returns the model's History.
        ``initial_epoch``: Keras' argument, where the run this one may resume began."""
        model, position = self.model, self.state.position
        model.stop_training = False
        self._replay_iterators(position.epoch - initial_epoch)
        # Keras' fit resets its epoch iterator after the model's build, which calls the data adapter's on_epoch_end
        # once before the first epoch: a PyDataset that reshuffles there (the documented pattern) starts its first
        # epoch reshuffled under model.fit, so it must here too.
        self.train.on_epoch_end()
        self.callbacks.on_train_begin()
        training_logs = None
        with self._named():
            with self.stopping.watching():
                while position.epoch < epochs:
                    epoch_logs = self._epoch(position.epoch)
                    self.callbacks.on_epoch_end(position.epoch, epoch_logs)
                    training_logs = epoch_logs
                    position.epoch, position.step = position.epoch + 1, 0
                    if model.stop_training:
                        break
            if model.optimizer is not None and epochs > 0:
                model.optimizer.finalize_variable_values(model.trainable_weights)
            self._save()
        heartbeat.beat("done", int(self.state.steps.numpy()), self.model_dir)
        self.callbacks.on_train_end(logs=training_logs)
        return model.history

    def _epoch(self, epoch: int) -> dict:
        model, position = self.model, self.state.position
        model.reset_metrics()
        self.callbacks.on_epoch_begin(epoch)
        self.train.on_epoch_begin()
        # arrays: exactly this many steps; a Dataset: until it ends (or Keras' steps_per_epoch), as every worker agrees
        steps = self.train.steps_per_epoch if self.train.kind in inputs.BY_INDEX else self.train.fixed_steps
        known = getattr(self.train, "num_batches", None) if self.train.kind == "dataset" and steps else None
        if known:  # Keras' epoch iterator: the epoch ends where the pipeline does (a warning), the next one reruns it
            if steps > known - self.running_seen:
                log.warning("%s", RAN_OUT)
            steps = min(steps, known - self.running_seen)
        iterator = self._iterator(epoch)
        alone = self._last_step_alone(steps if steps is not None else getattr(self.train, "num_batches", None))
        logs, stopped = {}, False
        while steps is None or position.step < steps:
            count = self.steps_per_call if steps is None else min(self.steps_per_call, steps - position.step)
            if alone is not None and position.step < alone:
                count = min(count, alone - position.step)
            self.callbacks.on_train_batch_begin(position.step)
            if self.stopping.any_worker_preempted():
                self.stopping.stop_at(int(self.state.steps.numpy()))
            step_logs, ran, stopped = self.train_steps.run_on(self.train, iterator, count)
            if ran == 0:
                if self.train.fixed_steps:
                    log.warning("%s", RAN_OUT)
                    model.stop_training = True
                    self.held = None
                break
            logs = step_logs
            position.step += ran
            self.state.steps.assign_add(ran)
            done = int(self.state.steps.numpy())
            heartbeat.beat("training", done, self.model_dir)
            if stopped:  # asked on some worker: every worker stopped after this same step
                self.stopping.stop_at(done)
            self.callbacks.on_train_batch_end(position.step - 1, logs)
            if self.stopping.checkpoint_due():
                self._save()
            if model.stop_training:
                stopped = True
                break
        if known:
            self.running_seen += position.step
            if self.running_seen >= known:  # a pipeline of known length that ended: rerun from its start
                self.held, self.running_seen = placement_lib.iterator(self.placement, self.train, epoch + 1, 0), 0
        elif self._pipeline_ran_to_its_end(self.train, position.step, stopped):
            self.held = placement_lib.iterator(self.placement, self.train, epoch + 1, 0)
        # As Keras' epoch iterator: the adapter's on_epoch_end after every epoch that ran to its end, also when the
        # iterator runs on across epochs (steps_per_epoch; a PyDataset's next on_epoch_begin refuses to come
        # without it), not after an epoch that stop_training broke off.
        if not stopped:
            self.train.on_epoch_end()
        epoch_logs = dict(model._get_metrics_result_or_logs(logs))
        if self.val is not None and (epoch + 1) % self.validation_freq == 0:
            epoch_logs.update({f"val_{name}": value for name, value in self.evaluate().items()})
        return epoch_logs

    def _last_step_alone(self, steps):
        """The step that starts a call of its own (else None): on several workers, an epoch's last step when its batch
        may be smaller. TensorFlow's collectives keep the shape an instance first had for the rest of a call, and the
        all-gather of sparse gradients (an Embedding's) follows the batch: one call must not mix batch sizes."""
        if self.placement.num_workers == 1 or not steps or self.train.fixed_steps or \
                not self.train.last_batch_smaller():
            return None
        return steps - 1

    def _iterator(self, epoch: int):
        """The epoch's iterator, made when Keras' epoch iterator makes it: with a Dataset's ``steps_per_epoch``, the
        one held from before (made at the end of the epoch its pipeline ended in); else a new one every epoch."""
        if self.train.kind == "dataset" and self.train.fixed_steps and self.held is not None:
            return self.held
        self.held = placement_lib.iterator(self.placement, self.train, epoch, self.state.position.step)
        return self.held

    def _replay_iterators(self, epochs_done: int) -> None:
        """On a resume after ``epochs_done`` whole epochs: makes and drops the iterators the run it continues made in
        them (as many as Keras' epoch iterator makes: two an epoch of a pipeline of known length, else one; a
        validation pipeline's at each validation), so that a reshuffling pipeline seeded as before gives the resumed
        epochs the orders of the uninterrupted run. Not for a Dataset with ``steps_per_epoch``, whose one iterator
        runs on across epochs (its resume reruns the pipeline as before)."""
        if epochs_done <= 0:
            return
        validations = sum(1 for epoch in range(epochs_done) if (epoch + 1) % self.validation_freq == 0)
        for data, times in ((self.train, epochs_done), (self.val, validations)):
            if data is None or data.kind != "dataset" or (data is self.train and data.fixed_steps):
                continue
            for _ in range(times * (2 if data.num_batches else 1)):
                placement_lib.iterator(self.placement, data, 0, 0)

    def _pipeline_ran_to_its_end(self, data, steps_run: int, stopped: bool = False) -> bool:
        """Whether Keras' epoch iterator, on an epoch of ``data``, a pipeline of known length (for training: without
        ``steps_per_epoch``), would reach its end: then it makes the next epoch's iterator at once and drops it unused
        when the next epoch makes its own. That iterator must be made here too: making an iterator draws a
        reshuffling pipeline's next order (``Dataset.shuffle``, ``image_dataset_from_directory``), so without it every
        epoch from the second on sees another order than under ``model.fit``. Keras gets there unless a
        ``stop_training`` broke the epoch off (also when its last host call of ``steps_per_execution`` steps ran out
        of batches: that error reaches it only after its loop)."""
        known = getattr(data, "num_batches", None) if data.kind == "dataset" else None
        return bool(known) and not stopped and steps_run >= known

    def evaluate(self) -> dict:
        """The validation data through the model's ``test_step`` (Keras' ``evaluate`` inside ``fit``): every worker's
        share, metrics read over all replicas and workers."""
        model, val = self.model, self.val
        self.callbacks.on_test_begin()
        model.reset_metrics()
        # Keras' evaluate inside fit: its cached epoch iterator is reset (the adapter's on_epoch_end), then iterated
        # for one epoch between on_epoch_begin and on_epoch_end (a validation PyDataset sees all three)
        val.on_epoch_end()
        val.on_epoch_begin()
        iterator = placement_lib.iterator(self.placement, val, 0, 0)
        logs, step = {}, 0
        steps = val.steps_per_epoch if val.kind in inputs.BY_INDEX else val.fixed_steps
        while steps is None or step < steps:
            count = self.steps_per_call if steps is None else min(self.steps_per_call, steps - step)
            self.callbacks.on_test_batch_begin(step)
            step_logs, ran, _ = self.test_steps.run_on(val, iterator, count)
            if ran == 0:
                break
            logs, step = step_logs, step + ran
            self.callbacks.on_test_batch_end(step - 1, logs)
        if self._pipeline_ran_to_its_end(val, step):  # made and dropped unused, as Keras' (see there)
            placement_lib.iterator(self.placement, val, 0, 0)
        val.on_epoch_end()
        from tfgpu.runtime.keras_internals import internal

        logs = internal("python_utils").pythonify_logs(model._get_metrics_result_or_logs(logs))
        self.callbacks.on_test_end(logs)
        return logs

    def _save(self) -> None:
        self.stopping.save()
        self.stopping.checkpoint_every_s = self.state.every_s

    @contextlib.contextmanager
    def _named(self):
        """A collective that lost a peer as ``failures.WorkerLost`` (exit 129 under the launcher: a new group
        resumes from the last checkpoint)."""
        try:
            yield
        except tf.errors.OpError as e:
            if self.placement.num_workers > 1 and failures.lost_peer(e):
                last = tf.train.latest_checkpoint(self.state.real_dir)
                raise failures.worker_lost(e, self.placement.worker_index, int(self.state.steps.numpy()),
                                           last) from None
            raise
