"""Keras callbacks and ``History`` on tfgpu's loop: ``tfgpu.fit``'s ``LoopHooks``.

Epochs are Keras': each ends at a step the loop stops at (``fit_arguments.epoch_ends``), where the epoch's train
``logs`` are the step-weighted mean of its loops (Keras' running mean over its batches) and, when the epoch
validates (``validation_freq``), the evaluation's ``val_loss`` and ``val_<metric>``. Batch-level calls come once
per loop (``steps_per_loop`` steps; ``batch`` is the loop's last step in the epoch) with the epoch's running
``logs``. Callbacks see the model being trained (inside the strategy scope, ``model.optimizer`` its optimizer), so
``EarlyStopping`` (with ``restore_best_weights``), ``LearningRateScheduler``, ``ReduceLROnPlateau``,
``TerminateOnNaN`` and a user's ``Callback`` act on the run; ``model.stop_training`` ends it at the loop's end (a
checkpoint is saved). Every worker runs the same callbacks on the same (all-reduced) logs, so they decide alike;
those that write files (``ModelCheckpoint``, ``TensorBoard``, ``CSVLogger``) run on the chief only.
``BackupAndRestore`` is tfgpu's own resume: its ``backup_dir`` becomes ``model_dir`` (``backup_dir``).
"""
import logging
import math

from tfgpu.config import ConfigError
from tfgpu.training import fit_arguments
from tfgpu.training.hooks import LoopHooks

log = logging.getLogger("tfgpu")

CHIEF_ONLY = ("ModelCheckpoint", "TensorBoard", "CSVLogger")
REFUSED = {
    "ProgbarLogger": "tfgpu draws its own progress (verbose=...)",
    "SwapEMAWeights": "evaluation runs in tfgpu's loop, not through callbacks; compile with use_ema=True and the "
                      "model ends with the averaged weights, as after model.fit",
    "History": "tfgpu.fit returns the History",
}


def _kind(callback) -> str:
    """The Keras callback class ``callback`` is (its nearest keras.callbacks base), or its own class name."""
    import keras

    for cls in type(callback).__mro__:
        if cls.__module__.startswith("keras") and hasattr(keras.callbacks, cls.__name__):
            return cls.__name__
    return type(callback).__name__


def prepare(callbacks, is_chief: bool):
    """(the callbacks this worker runs, BackupAndRestore's backup_dir or ""); ConfigError naming a callback that
    cannot work under tfgpu's loop."""
    import keras

    if callbacks is None:
        return [], ""
    if isinstance(callbacks, keras.callbacks.Callback):
        callbacks = [callbacks]
    runs, backup_dir = [], ""
    for callback in callbacks:
        if not isinstance(callback, keras.callbacks.Callback):
            raise ConfigError("callbacks", f"{type(callback).__name__} is not a keras.callbacks.Callback")
        kind = _kind(callback)
        if kind in REFUSED and type(callback).__name__ == kind:
            raise ConfigError("callbacks", f"{kind}: {REFUSED[kind]}")
        if kind == "BackupAndRestore":  # tfgpu's checkpoints (each epoch) and exact resume do its job
            log.info("BackupAndRestore(%s): served by tfgpu's checkpoints in the run directory; a rerun resumes at "
                     "the step it stopped at", callback.backup_dir)
            backup_dir = callback.backup_dir
            continue
        if kind in CHIEF_ONLY and not is_chief:
            continue
        runs.append(callback)
    return runs, backup_dir


class KerasLoop(LoopHooks):
    """Drives ``callbacks`` and ``history`` (a ``keras.callbacks.History``) from the loop. ``epoch_ends``: the step
    each epoch from ``initial_epoch`` on ends at; ``given``: ``tfgpu.fit``'s record of the model (``built``: the
    model being trained, ``compiled``: its compile(), with the metrics History names and the optimizer)."""

    def __init__(self, callbacks, history, epoch_ends, initial_epoch: int, validation_freq: int, given):
        self.callbacks, self.history = list(callbacks), history
        self.ends, self.initial_epoch = tuple(epoch_ends), initial_epoch
        self.validation_freq, self.given = validation_freq, given
        self.metric_names = ()
        self.metrics = None
        self.epoch = None  # the current epoch (Keras' index), None before training
        self.sums, self.steps = {}, 0
        self.done = set()  # epochs whose end was told
        self.stop = False

    def model(self):
        return self.given.built

    # -- what the loop asks ------------------------------------------------------------------------------------
    def boundaries(self):
        return self.ends

    def evaluations(self):
        return tuple(end for k, end in enumerate(self.ends) if fit_arguments.validates(self.initial_epoch + k,
                                                                                         self.validation_freq))

    # -- calls -----------------------------------------------------------------------------------------------------
    def _each(self, method: str, *args):
        for callback in self.callbacks:
            getattr(callback, method)(*args)

    def on_train_begin(self, step: int):
        model = self.model()
        compiled = self.given.compiled
        self.metrics = compiled.metrics  # fit_metrics.CompiledMetrics, built by the task (None: uncompiled)
        self.metric_names = self.metrics.names if self.metrics else ()
        if compiled.built_optimizer is not None:  # what LearningRateScheduler and ReduceLROnPlateau set
            # Not tracked: the checkpoint keeps the optimizer under the task's "optimizer" alone, as a resume reads it
            object.__setattr__(model, "optimizer", compiled.built_optimizer)
        model.stop_training = False
        params = {"verbose": 0, "epochs": self.initial_epoch + len(self.ends), "steps": self.ends[0]}
        for callback in self.callbacks:
            callback.set_model(model)
            callback.set_params(params)
        if self.history.model is None:  # a builder's model: History (and model.history) is the one trained
            self.history.set_model(model)
        self.history.set_params(params)
        self.history.on_train_begin()
        self._each("on_train_begin", {})
        # a resumed run: the epochs whose end it passed are done (their History rows are in the first run's)
        passed = sum(1 for end in self.ends if end <= step)
        self.done.update(range(self.initial_epoch, self.initial_epoch + passed))
        self._begin_epoch(self.initial_epoch + passed)

    def _begin_epoch(self, epoch: int):
        self.epoch, self.sums, self.steps = epoch, {}, 0
        if self.metrics:  # Keras resets the metrics at each epoch's start
            self.metrics.reset("train")
        if epoch < self.initial_epoch + len(self.ends):
            self._each("on_epoch_begin", epoch, {})

    def _train_logs(self) -> dict:
        if not self.steps:
            return {}
        logs = {"loss": self.sums.get("loss", math.nan) / self.steps}
        if self.metrics:  # the epoch's compiled metrics so far, over every replica and worker
            logs.update(self.metrics.results("train"))
        return logs

    def on_loop_end(self, step: int, num_steps: int, step_metrics: dict):
        for name in ("loss",):
            if name in step_metrics:
                self.sums[name] = self.sums.get(name, 0.0) + step_metrics[name] * num_steps
        self.steps += num_steps
        self._each("on_train_batch_end", self.steps - 1, self._train_logs())
        if getattr(self.model(), "stop_training", False):
            self.stop = True
        return self.stop

    def on_boundary(self, step: int, eval_metrics: dict) -> bool:
        k = self.epoch - self.initial_epoch
        if 0 <= k < len(self.ends) and self.ends[k] == step:
            self._end_epoch(eval_metrics)
            if not self.stop:
                self._begin_epoch(self.epoch + 1)
        elif self.stop and self.epoch not in self.done:  # stopped inside an epoch: Keras ends it with what it has
            self._end_epoch({})
        return self.stop

    def _end_epoch(self, eval_metrics: dict):
        logs = self._train_logs()
        if eval_metrics and fit_arguments.validates(self.epoch, self.validation_freq):
            logs["val_loss"] = eval_metrics["val_loss"]
            for name in self.metric_names:
                logs[f"val_{name}"] = eval_metrics[f"val_{name}"]
        self._each("on_epoch_end", self.epoch, logs)
        self.history.on_epoch_end(self.epoch, dict(logs))
        self.done.add(self.epoch)
        if getattr(self.model(), "stop_training", False):
            self.stop = True

    def on_train_end(self, step: int, eval_metrics: dict):
        k = (self.epoch or 0) - self.initial_epoch
        if self.epoch not in self.done and 0 <= k < len(self.ends) and self.ends[k] <= step:
            self._end_epoch(eval_metrics)
        logs = {key: values[-1] for key, values in self.history.history.items()} if self.history.history else {}
        optimizer = self.given.compiled.built_optimizer
        if optimizer is not None and getattr(optimizer, "use_ema", False):  # as model.fit ends: the averages
            optimizer.finalize_variable_values(self.model().trainable_variables)
        self._each("on_train_end", logs)
