"""tfgpu.fit reads arrays as ``model.fit`` reads them (inputs.py, Keras' array adapter): dict inputs, dict targets of
a two-output model, the last partial batch, class and sample weights. Each test compares with plain ``model.fit``
on the same seeded model and data (``shuffle=False``: tfgpu draws its own order, so only an unshuffled run can be
compared batch for batch)."""
import keras
import numpy as np
import pytest

from tests.training.fit import helpers
from tests.training.fit.helpers import both


@pytest.fixture(scope="module")
def data():
    return helpers.digits(320)


def test_dict_inputs_to_a_functional_model_with_two_named_inputs(data, tmp_path):
    pixels, y = data
    extra = np.random.default_rng(1).normal(size=(len(y), 3)).astype("float32")
    x = {"pixels": pixels, "extra": extra}

    def model():
        keras.utils.set_random_seed(0)
        a, b = keras.Input((64,), name="pixels"), keras.Input((3,), name="extra")
        h = keras.layers.Dense(16, activation="relu")(keras.layers.Concatenate()([a, b]))
        m = keras.Model({"pixels": a, "extra": b}, keras.layers.Dense(10, activation="softmax")(h))
        m.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
        return m

    both(model, lambda r: ((x, y), dict(batch_size=32, epochs=2, shuffle=False, verbose=0)), tmp_path)


@pytest.mark.slow  # the default set stays near a minute on 2 cores
def test_two_outputs_with_a_loss_dict_and_loss_weights(data, tmp_path):
    x, digit = data
    targets = {"digit": digit, "parity": (digit % 2).astype("float32")[:, None]}

    def model():
        keras.utils.set_random_seed(0)
        inputs = keras.Input((64,))
        h = keras.layers.Dense(16, activation="relu")(inputs)
        m = keras.Model(inputs, {"digit": keras.layers.Dense(10, activation="softmax", name="digit")(h),
                                 "parity": keras.layers.Dense(1, activation="sigmoid", name="parity")(h)})
        m.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss={"digit": "sparse_categorical_crossentropy", "parity": "binary_crossentropy"},
                  loss_weights={"digit": 1.0, "parity": 0.5},
                  metrics={"digit": ["accuracy"], "parity": ["accuracy"]})
        return m

    plain, ours = both(model, lambda r: ((x, targets), dict(batch_size=32, epochs=2, shuffle=False, verbose=0)),
                       tmp_path)
    assert {"digit_loss", "parity_loss", "digit_accuracy", "parity_accuracy"} <= set(ours.history.history)


def test_the_last_partial_batch_makes_steps_as_in_keras(tmp_path):
    x, y = helpers.digits(1500)
    plain, ours = both(helpers.classifier, lambda r: ((x, y), dict(batch_size=8, epochs=1, shuffle=False, verbose=0)),
                       tmp_path)
    assert ours.iterations == plain.iterations == 188  # ceil(1500 / 8): the last batch holds 4 examples


@pytest.fixture(scope="module")
def binary():
    """Tabular (N, 30) features and an imbalanced 0/1 label (about a quarter ones)."""
    x, target = helpers.tabular(256, 30)
    return x, (target > np.quantile(target, 0.75)).astype("float32")


def binary_model():
    keras.utils.set_random_seed(0)
    m = keras.Sequential([keras.Input((30,)), keras.layers.Dense(8, activation="relu"),
                          keras.layers.Dense(1, activation="sigmoid")])
    m.compile(optimizer=keras.optimizers.Adam(0.01), loss="binary_crossentropy", metrics=["accuracy"],
              weighted_metrics=["accuracy"])
    return m


@pytest.mark.slow  # the default set stays near a minute on 2 cores
def test_class_weight_on_tabular_data(binary, tmp_path):
    x, y = binary
    weights = {0: 1.0, 1: 3.0}
    plain, ours = both(binary_model, lambda r: ((x, y), dict(batch_size=32, epochs=3, shuffle=False, verbose=0,
                                                             class_weight=weights)), tmp_path)
    unweighted = helpers.keras_run(binary_model, lambda r: ((x, y), dict(batch_size=32, epochs=3, shuffle=False,
                                                                         verbose=0)))
    assert abs(unweighted.history.history["loss"][-1] - ours.history.history["loss"][-1]) > 1e-3  # weights counted


def test_sample_weight_on_tabular_data(binary, tmp_path):
    x, y = binary
    weights = np.random.default_rng(2).uniform(0.2, 2.0, size=len(y)).astype("float32")
    val_weights = weights[:64] * 0.5
    plain, ours = both(binary_model, lambda r: ((x[64:], y[64:]), dict(
        sample_weight=weights[64:], batch_size=32, epochs=3, shuffle=False, verbose=0,
        validation_data=(x[:64], y[:64], val_weights))), tmp_path)
    h = ours.history.history
    assert h["weighted_accuracy"] != h["accuracy"] and h["val_weighted_accuracy"] != h["val_accuracy"]
