"""Sparse labels outside a 10-class model's outputs: arrays refused in one line before the first step, a Dataset's
error from Keras with a line naming the label and the classes."""
import os

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tests.training.fit import helpers
from tfgpu.training.fit import labels


@pytest.fixture(autouse=True)
def _in_tmp(fit_in_tmp_path):
    yield


@pytest.mark.parametrize("bad", [10, -1, 12.0])
def test_arrays_with_a_label_outside_the_classes_are_refused_before_the_first_step(tmp_path, bad):
    import tfgpu

    x, y = helpers.digits(100)
    y = y.astype("float32") if isinstance(bad, float) else y
    y[37] = bad
    model = helpers.classifier()
    with pytest.raises(tfgpu.ConfigError) as raised:
        tfgpu.fit(model, x, y, batch_size=16, verbose=0, model_dir=str(tmp_path / "run"))
    message = str(raised.value)
    assert raised.value.flag == "y" and "\n" not in message
    assert f"label {int(bad)} (example 37)" in message and "10 classes" in message and "0 to 9" in message
    assert int(model.optimizer.iterations.numpy()) == 0
    assert not os.path.exists(tmp_path / "run")


def test_a_loss_object_and_the_validation_arrays_are_checked_too(tmp_path):
    import keras

    import tfgpu

    x, y = helpers.digits(100)
    bad_val = y[:20].copy()
    bad_val[3] = 10
    model = helpers.classifier(loss=keras.losses.SparseCategoricalCrossentropy())
    with pytest.raises(tfgpu.ConfigError, match=r"validation_data \(y\): label 10 \(example 3\)"):
        tfgpu.fit(model, x, y, batch_size=16, verbose=0, validation_data=(x[:20], bad_val),
                  model_dir=str(tmp_path / "run"))


def test_the_ignored_class_and_other_losses_train(tmp_path):
    import keras

    import tfgpu

    x, y = helpers.digits(64)
    y[5] = -1
    model = helpers.classifier(loss=keras.losses.SparseCategoricalCrossentropy(ignore_class=-1))
    tfgpu.fit(model, x, y, batch_size=16, verbose=0, model_dir=str(tmp_path / "ignored"))
    assert int(model.optimizer.iterations.numpy()) == 4
    model = helpers.classifier(loss="mse")
    tfgpu.fit(model, x, np.full((64, 10), 10.0, "float32"), batch_size=16, verbose=0,
              model_dir=str(tmp_path / "mse"))
    assert int(model.optimizer.iterations.numpy()) == 4


def test_one_of_several_outputs_is_named():
    import keras

    import tfgpu

    inputs = keras.Input((64,))
    model = keras.Model(inputs, {"digit": keras.layers.Dense(10, name="digit")(inputs),
                                 "parity": keras.layers.Dense(2, name="parity")(inputs)})
    model.compile("sgd", loss={"digit": keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                               "parity": "sparse_categorical_crossentropy"})
    x, y = helpers.digits(40)
    parity = y % 2
    parity[9] = 2
    with pytest.raises(tfgpu.ConfigError, match=r"y\['parity'\]: label 2 \(example 9\) is outside the 2 classes of "
                                                r"output 'parity'"):
        tfgpu.fit(model, x, {"digit": y, "parity": parity}, batch_size=8, verbose=0)


def test_a_datasets_bad_label_keeps_keras_error_with_a_line_naming_label_and_classes(tmp_path):
    import tensorflow as tf

    import tfgpu

    x, y = helpers.digits(64)
    y[20] = 10
    model = helpers.classifier()
    # Keras' kernel says "outside the valid range"; the deterministic one, when another test of this process turned
    # op determinism on, "indices[4] = 10 is not in [0, 10)"
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"outside the valid range|= 10 is not in \[0, 10\)") \
            as raised:
        tfgpu.fit(model, tf.data.Dataset.from_tensor_slices((x, y)).batch(16), verbose=0,
                  model_dir=str(tmp_path / "run"))
    assert raised.value.__notes__ == [
        f"tfgpu.fit: y: a label of the data is 10, outside the 10 classes of output '{model.layers[-1].name}': "
        "sparse_categorical_crossentropy takes labels 0 to 9"]


def test_both_kernels_errors_are_read_and_no_other():
    keras_kernel = "Received a label value of 10 which is outside the valid range of [0, 10).  Label values: 3 10"
    deterministic = ("Detected at node while/compile_loss/sparse_categorical_crossentropy/SparseSoftmaxCrossEntropy"
                     "WithLogits/GatherV2 ...\nindices[4] = 10 is not in [0, 10)")
    for message in (keras_kernel, deterministic):
        assert labels.out_of_range(message).groups() == ("10", "10")
    assert labels.out_of_range("Detected at node embedding/GatherV2\nindices[4] = 10 is not in [0, 10)") is None


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-3, 12), min_size=1, max_size=40), st.integers(1, 11), st.sampled_from([None, -1, 3]))
def test_the_first_label_outside_the_classes_is_found(values, classes, ignore):
    found = labels.first_out_of_range(np.array(values), classes, ignore)
    outside = [(i, v) for i, v in enumerate(values) if not 0 <= v < classes and v != ignore]
    assert found == (outside[0] if outside else None)
    column = labels.first_out_of_range(np.array(values, "float32")[:, None], classes, ignore)
    assert column == found
