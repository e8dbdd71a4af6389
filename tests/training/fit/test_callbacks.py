"""Keras' callbacks on tfgpu.fit's loop (callbacks.py): EarlyStopping restoring the best weights, ModelCheckpoint
writing the best model, a callback's own Keras metric. Each test compares with plain ``model.fit`` on the same seeded
model and data."""
import os

import keras
import numpy as np
import pytest

from tests.training.fit import helpers
from tests.training.fit.helpers import both
from tfgpu.training.fit import callbacks as callbacks_lib


@pytest.fixture(scope="module")
def data():
    return helpers.digits(320)


def test_early_stopping_restores_the_best_weights(data, tmp_path):
    x, y = data

    def args(record):
        record["stop"] = keras.callbacks.EarlyStopping(monitor="val_loss", patience=2, restore_best_weights=True)
        return (x, y), dict(batch_size=32, epochs=12, shuffle=False, verbose=0, validation_split=0.25,
                            callbacks=[record["stop"]])

    # a learning rate this high makes val_loss bounce: the best epoch is not the last one
    plain, ours = both(lambda: helpers.classifier(optimizer=keras.optimizers.SGD(1.5)), args, tmp_path)
    stop = plain.record["stop"]
    assert 0 < stop.stopped_epoch < 11 and stop.best_epoch < stop.stopped_epoch  # it stopped early and restored
    assert (ours.record["stop"].stopped_epoch, ours.record["stop"].best_epoch) == (stop.stopped_epoch,
                                                                                  stop.best_epoch)
    assert len(ours.history.epoch) == stop.stopped_epoch + 1
    # the weights the two runs were left with (compared in both()) are the best epoch's: evaluating gives its loss
    val = ours.model.evaluate(x[240:], y[240:], batch_size=32, verbose=0, return_dict=True)
    assert val["loss"] == pytest.approx(min(ours.history.history["val_loss"]), abs=1e-5)


@pytest.mark.slow  # the default set stays near a minute on 2 cores
def test_model_checkpoint_saves_the_best_model_compiled(data, tmp_path):
    x, y = data

    def args(record):
        record["path"] = path = tmp_path / f"best-{len(list(tmp_path.glob('best-*')))}.keras"
        record["checkpoint"] = keras.callbacks.ModelCheckpoint(path, monitor="val_loss", save_best_only=True)
        return (x, y), dict(batch_size=32, epochs=6, shuffle=False, verbose=0, validation_split=0.25,
                            callbacks=[record["checkpoint"]])

    plain, ours = both(lambda: helpers.classifier(optimizer=keras.optimizers.SGD(1.5)), args, tmp_path)
    assert ours.record["path"].exists() and ours.record["path"] != plain.record["path"]
    loaded = keras.models.load_model(ours.record["path"])
    assert loaded.compiled and isinstance(loaded.optimizer, keras.optimizers.SGD)
    keras_saved = keras.models.load_model(plain.record["path"])
    helpers.assert_same_weights(keras_saved, loaded)
    assert int(loaded.optimizer.iterations.numpy()) == int(keras_saved.optimizer.iterations.numpy())
    val = loaded.evaluate(x[240:], y[240:], batch_size=32, verbose=0, return_dict=True)
    assert val["loss"] == pytest.approx(min(ours.history.history["val_loss"]), abs=1e-5)


class MeanLoss(keras.callbacks.Callback):
    """A callback with a Keras metric of its own, made before fit: the mean of the batches' losses."""

    def __init__(self):
        super().__init__()
        self.mean = keras.metrics.Mean(name="mean_batch_loss")
        self.epoch_means = []

    def on_epoch_begin(self, epoch, logs=None):
        self.mean.reset_state()

    def on_train_batch_end(self, batch, logs=None):
        self.mean.update_state(logs["loss"])

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_means.append(float(self.mean.result()))


def test_a_callbacks_own_metric_made_before_fit_works_in_and_after_it(data, tmp_path):
    x, y = data

    def args(record):
        record["callback"] = MeanLoss()
        return (x, y), dict(batch_size=32, epochs=2, shuffle=False, verbose=0, callbacks=[record["callback"]])

    plain, ours = both(helpers.classifier, args, tmp_path)
    mine, keras_own = ours.record["callback"], plain.record["callback"]
    np.testing.assert_allclose(mine.epoch_means, keras_own.epoch_means, rtol=1e-5)
    assert float(mine.mean.result()) == pytest.approx(float(keras_own.mean.result()), abs=1e-5)
    mine.mean.update_state(1.0)  # still usable after fit
    keras_own.mean.update_state(1.0)
    assert float(mine.mean.result()) == pytest.approx(float(keras_own.mean.result()), abs=1e-5)


def test_a_worker_that_is_not_the_chief_writes_its_callbacks_files_to_its_own_directory(tmp_path):
    """ModelCheckpoint's and CSVLogger's files go, off the chief, to the worker's temporary directory (the one its
    checkpoints use, distribute.scratch_dir), deleted with the paths put back at the end; no progress bar there. On
    the chief nothing moves."""
    import types

    real = {"checkpoint": str(tmp_path / "best.keras"), "csv": str(tmp_path / "log.csv")}
    given = [keras.callbacks.ModelCheckpoint(real["checkpoint"]), keras.callbacks.CSVLogger(real["csv"]),
             keras.callbacks.ProgbarLogger()]
    worker = callbacks_lib.ChiefOutputs(given, types.SimpleNamespace(is_chief=False, worker_index=1))
    assert worker.callbacks == given[:2]
    moved = [given[0].filepath, given[1].filename]
    assert all(os.path.dirname(path) == worker.scratch for path in moved)
    assert os.path.basename(worker.scratch).startswith("tfgpu-worker1-") and os.path.isdir(worker.scratch)
    worker.close()
    assert (given[0].filepath, given[1].filename) == (real["checkpoint"], real["csv"])
    assert not os.path.exists(worker.scratch)
    chief = callbacks_lib.ChiefOutputs(given, types.SimpleNamespace(is_chief=True, worker_index=0))
    assert chief.callbacks == given and chief.scratch is None and given[0].filepath == real["checkpoint"]
