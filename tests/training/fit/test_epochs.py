"""tfgpu.fit's epoch loop is Keras' (epochs.py): ``stop_training`` set in a batch hook stops at the step it stops
at under ``model.fit``, a second fit continues the optimizer, validation data as a Dataset or (x, y, w) tuples every
``validation_freq`` epochs. Each test compares with plain ``model.fit`` on the same seeded model and data."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.training.fit import helpers
from tests.training.fit.helpers import both


@pytest.fixture(scope="module")
def data():
    return helpers.digits(320)


class StopAfter(keras.callbacks.Callback):
    """Sets ``model.stop_training`` in ``on_train_batch_end`` once the batch index reaches ``batch``."""

    def __init__(self, batch):
        super().__init__()
        self.batch, self.seen = batch, []

    def on_train_batch_end(self, batch, logs=None):
        self.seen.append(batch)
        if batch >= self.batch:
            self.model.stop_training = True


@pytest.mark.parametrize("steps_per_execution", [1, 4])
def test_stop_training_in_a_batch_hook_stops_at_the_same_step(data, tmp_path, steps_per_execution):
    x, y = data

    def args(record):
        record["stop"] = StopAfter(10)
        return (x, y), dict(batch_size=16, epochs=3, shuffle=False, verbose=0, callbacks=[record["stop"]])

    plain, ours = both(lambda: helpers.classifier(steps_per_execution=steps_per_execution), args, tmp_path)
    assert plain.iterations == (11 if steps_per_execution == 1 else 12)  # 20 steps an epoch: stopped in epoch 1
    assert ours.record["stop"].seen == plain.record["stop"].seen
    assert ours.history.epoch == [0]


def test_a_second_fit_continues_the_optimizer(data, tmp_path):
    x, y = data
    import tfgpu

    def model():
        return helpers.classifier(optimizer=keras.optimizers.Adam(0.01))

    kwargs = dict(batch_size=32, epochs=2, shuffle=False, verbose=0)
    plain, ours = both(model, lambda r: ((x, y), kwargs), tmp_path)
    assert ours.iterations == 20
    again = plain.model.fit(x, y, **kwargs)
    ours_again = tfgpu.fit(ours.model, x, y, model_dir=str(tmp_path / "second"), **kwargs)
    assert ours.iterations == plain.iterations == 40  # Adam's step count went on (a restart would say 20)
    helpers.assert_same_history(again, ours_again)
    helpers.assert_same_weights(plain.model, ours.model)  # and its moments: model.fit's Adam continued too


@pytest.mark.slow  # the default set stays near a minute on 2 cores
def test_validation_data_as_a_dataset_every_second_epoch(data, tmp_path):
    x, y = data

    def args(record):
        val = tf.data.Dataset.from_tensor_slices((x[256:], y[256:])).batch(20)
        return (x[:256], y[:256]), dict(batch_size=32, epochs=4, shuffle=False, verbose=0, validation_data=val,
                                        validation_freq=2)

    plain, ours = both(helpers.classifier, args, tmp_path)
    assert len(ours.history.history["loss"]) == 4 and len(ours.history.history["val_loss"]) == 2


def test_validation_data_as_x_y_weight_tuples_every_second_epoch(data, tmp_path):
    x, y = data
    weights = np.random.default_rng(3).uniform(0.1, 2.0, size=64).astype("float32")

    def args(record):
        return (x[:256], y[:256]), dict(batch_size=32, epochs=4, shuffle=False, verbose=0,
                                        validation_data=(x[256:], y[256:], weights), validation_freq=2,
                                        validation_batch_size=24)

    model = lambda: helpers.classifier(weighted_metrics=["accuracy"])  # noqa: E731
    plain, ours = both(model, args, tmp_path)
    h = ours.history.history
    assert len(h["val_loss"]) == 2 and h["val_weighted_accuracy"] != h["val_accuracy"]  # the weights counted
