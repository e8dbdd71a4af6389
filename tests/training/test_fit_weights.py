"""sample_weight under tfgpu.fit: weights checked in one line, taken from (x, y, w) elements, carried so that a
weight-0 example is not the evaluation's padding, and the loss, val_loss and weighted metrics equal plain
model.fit's on 2 replicas."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfgpu
from tfgpu.config import ConfigError
from tfgpu.data import builtin
from tfgpu.training import fit_weights


@pytest.mark.parametrize("weights, message", [
    (np.ones(5), "weights of shape (5,) for 4 examples"),
    (np.ones((4, 2)), "weights of shape (4, 2)"),
    (np.array([1.0, -1.0, 1.0, 1.0]), "example 1 has weight -1.0"),
    (np.array([1.0, 1.0, np.nan, 1.0]), "example 2 has weight nan"),
    (np.array(["a", "b", "c", "d"]), "weights are <U1"),
])
def test_bad_weights_are_one_line_naming_the_argument(weights, message):
    with pytest.raises(ConfigError) as e:
        fit_weights.check(weights, 4, "sample_weight")
    assert e.value.flag == "sample_weight" and message in str(e.value)
    assert fit_weights.check(np.ones((4, 1), "float64"), 4, "sample_weight").dtype == np.float32


def test_a_weight_zero_example_is_told_from_padding():
    carried = fit_weights.encode(tf.constant([2.0, 0.0, 0.5]))
    padded = tf.concat([carried, [0.0]], 0)  # the evaluation pads with weight 0
    weights, real = fit_weights.decode(padded)
    np.testing.assert_array_equal(weights, [2.0, 0.0, 0.5, 0.0])
    np.testing.assert_array_equal(real, [1.0, 1.0, 1.0, 0.0])


def test_weights_are_split_off_a_datasets_elements_batched_or_not():
    x, y, w = np.zeros((6, 2, 2, 1), "uint8"), np.arange(6), np.linspace(0, 1, 6)
    for dataset in (tf.data.Dataset.from_tensor_slices((x, y, w)),
                    tf.data.Dataset.from_tensor_slices((x, y, w)).batch(4)):
        pairs, weights = fit_weights.split_off(dataset, "x")
        assert len(pairs.element_spec) == 2
        np.testing.assert_allclose(weights, w, rtol=1e-6)
    same, none = fit_weights.split_off(tf.data.Dataset.from_tensor_slices((x, y)), "x")
    assert none is None and len(same.element_spec) == 2


def weighted_model(name, learning_rate):
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Rescaling(1 / 255), keras.layers.Flatten(),
                              keras.layers.Dense(16, activation="relu"), keras.layers.Dense(10, activation="softmax")],
                             name=name)
    model.compile(optimizer=keras.optimizers.SGD(learning_rate), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"], weighted_metrics=["accuracy"])
    return model


@pytest.fixture(scope="module")
def weighted_digits():
    """96 digits, their labels and weights in [0, 2) (every 7th 0)."""
    x, y = builtin.load_builtin("digits")["splits"]["train"]
    weights = np.random.default_rng(0).uniform(0, 2, 96).astype("float32")
    weights[::7] = 0.0
    return x[:96], y[:96].astype("int64"), weights


def assert_same_history(history, plain):
    assert history.history.keys() == plain.history.keys()
    for key, values in plain.history.items():
        assert history.history[key] == pytest.approx(values, abs=1e-5), key


def test_sample_weight_trains_as_plain_keras_on_two_replicas(weighted_digits, fit_in_tmp_path):
    """Arrays with sample_weight, cut by validation_split with them, in order: loss (sum(loss * w) / batch),
    val_loss, accuracy and weighted_accuracy equal plain model.fit's every epoch while SGD moves the weights."""
    x, y, w = weighted_digits
    arguments = dict(sample_weight=w, batch_size=16, epochs=2, validation_split=1 / 3, shuffle=False, verbose=0)
    plain = weighted_model("plain", 0.5).fit(x, y, **arguments)
    history = tfgpu.fit(weighted_model("mine", 0.5), x, y, **arguments, steps_per_loop=2, tensorboard=False,
                        cpu_logical_devices=2, distribution_strategy="mirrored")
    assert_same_history(history, plain)
    assert history.history["weighted_accuracy"] != history.history["accuracy"]


@pytest.mark.slow
def test_dataset_elements_and_validation_data_carry_weights_as_keras_takes_them(weighted_digits, fit_in_tmp_path):
    """(x, y, w) elements of a batched Dataset and validation_data=(x, y, w): with the weights frozen (SGD(0)) the
    epoch's loss and metrics are those of its examples in any order, equal to plain model.fit's."""
    x, y, w = weighted_digits
    train = tf.data.Dataset.from_tensor_slices((x[:64], y[:64], w[:64])).batch(16)
    validation = (x[64:], y[64:], w[64:])
    plain = weighted_model("plain", 0.0).fit(train, epochs=2, validation_data=validation, verbose=0)
    history = tfgpu.fit(weighted_model("mine", 0.0), train, epochs=2, validation_data=validation, verbose=0,
                        steps_per_loop=2, tensorboard=False, cpu_logical_devices=2, distribution_strategy="mirrored")
    assert_same_history(history, plain)
