"""Keras callbacks and History on tfgpu's loop, driven as the trainer drives them: epochs end at their steps with
the epoch's step-weighted means and val_* when the epoch validates; model.stop_training stops; the callbacks a
worker runs (file writers on the chief only), BackupAndRestore as the run directory, refusals by name."""
import types

import keras
import pytest

from tfgpu.config import ConfigError
from tfgpu.training import fit_callbacks, fit_compile


def loop(callbacks, ends=(2, 4, 6), validation_freq=1):
    """KerasLoop over a model compiled with metrics=[SparseCategoricalAccuracy(name="acc")], its state summed on the
    default strategy (``add_examples`` adds a loop's examples to it, as the train steps do)."""
    import tensorflow as tf

    from tfgpu.training import fit_metrics

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2)])
    metrics = fit_metrics.CompiledMetrics(fit_metrics.resolve([keras.metrics.SparseCategoricalAccuracy(name="acc")],
                                                              [], one_hot=False, num_outputs=2))
    metrics.build(tf.distribute.get_strategy())
    given = types.SimpleNamespace(built=model, compiled=fit_compile.Compiled(metric_names=("acc",), metrics=metrics))
    history = keras.callbacks.History()
    return fit_callbacks.KerasLoop(callbacks, history, ends, 0, validation_freq, given), history, model


def add_examples(hooks, right: int, wrong: int):
    """Adds ``right`` correctly and ``wrong`` wrongly classified examples to the train metrics' state."""
    import numpy as np

    labels = np.array([0] * (right + wrong))
    predicted = np.array([[0.9, 0.1]] * right + [[0.1, 0.9]] * wrong, "float32")
    hooks.metrics.add("train", hooks.metrics.increments(labels, predicted))


def test_epochs_end_at_their_steps_with_keras_logs():
    """The epoch's loss is the step-weighted mean of its loops; a metric is its value over the epoch's examples
    (its state reset when an epoch begins); val_ from the evaluation."""
    seen = []
    hooks, history, _ = loop([keras.callbacks.LambdaCallback(on_epoch_end=lambda e, logs: seen.append((e, logs)))],
                             validation_freq=2)
    assert hooks.boundaries() == (2, 4, 6) and hooks.evaluations() == (4,)
    hooks.on_train_begin(0)
    add_examples(hooks, 1, 1)
    hooks.on_loop_end(1, 1, {"loss": 1.0, "accuracy": 0.5})
    add_examples(hooks, 2, 0)
    hooks.on_loop_end(2, 1, {"loss": 3.0, "accuracy": 1.0})
    assert hooks.on_boundary(2, {}) is False
    add_examples(hooks, 1, 3)
    hooks.on_loop_end(4, 2, {"loss": 1.0, "accuracy": 0.25})
    hooks.on_boundary(4, {"val_loss": 0.5, "val_accuracy": 0.5, "val_acc": 0.75, "val_examples": 8})
    add_examples(hooks, 4, 0)
    hooks.on_loop_end(6, 2, {"loss": 0.5, "accuracy": 1.0})
    hooks.on_train_end(6, {"val_loss": 0.25, "val_acc": 1.0})
    assert seen[0] == (0, {"loss": 2.0, "acc": 0.75})
    assert seen[1] == (1, {"loss": 1.0, "acc": 0.25, "val_loss": 0.5, "val_acc": 0.75})
    assert [e for e, _ in seen] == [0, 1, 2] and "val_loss" not in seen[2][1]  # epoch 3 does not validate
    assert history.history["loss"] == [2.0, 1.0, 0.5] and history.history["val_loss"] == [0.5]
    assert history.history["acc"] == [0.75, 0.25, 1.0]


def test_stop_training_stops_at_the_loop_and_a_resumed_run_starts_at_its_epoch():
    class Stop(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            self.model.stop_training = True

    hooks, history, _ = loop([Stop()])
    hooks.on_train_begin(2)  # resumed after epoch 0
    assert hooks.epoch == 1
    assert hooks.on_loop_end(3, 1, {"loss": 1.0}) is True and hooks.on_boundary(3, {}) is True
    assert history.epoch == [1]


def test_the_callbacks_a_worker_runs():
    writer, lr = keras.callbacks.CSVLogger("log.csv"), keras.callbacks.LearningRateScheduler(lambda e, r: r)
    backup = keras.callbacks.BackupAndRestore("some/dir")
    assert fit_callbacks.prepare([writer, lr, backup], is_chief=True) == ([writer, lr], "some/dir")
    assert fit_callbacks.prepare([writer, lr], is_chief=False) == ([lr], "")
    with pytest.raises(ConfigError, match="callbacks: ProgbarLogger"):
        fit_callbacks.prepare([keras.callbacks.ProgbarLogger()], True)
    with pytest.raises(ConfigError, match="callbacks: str is not a keras.callbacks.Callback"):
        fit_callbacks.prepare(["early_stopping"], True)
