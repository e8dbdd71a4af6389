"""A short run's final evaluation says when BatchNorm's moving statistics are still mostly their initial values."""
import keras

from tfgpu.models import batch_norm, create_model


def _nested():
    inner = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4), keras.layers.BatchNormalization(momentum=0.9)])
    frozen = keras.layers.BatchNormalization(momentum=0.999)
    frozen.trainable = False
    return keras.Sequential([keras.Input((4,)), inner, frozen, keras.layers.Dense(2)])


def test_small_cnn_after_113_steps_is_named_and_after_enough_steps_is_not():
    """Keras' default momentum 0.99: 0.99**113 = 32% of the initial statistics left (measured on digits: val_accuracy
    0.36 against train 0.91); 0.99**299 < 5%."""
    model = create_model("small_cnn", (8, 8, 1), num_classes=10)
    note = batch_norm.stale_statistics_note(model, 113)
    assert "after 113 updates at momentum 0.99, 32% of the moving statistics" in note
    assert "train at least 299 steps" in note
    assert batch_norm.stale_statistics_note(model, 299) == ""


def test_nested_models_count_and_frozen_layers_do_not():
    """A BatchNorm inside a nested model is found; a frozen one keeps its statistics and is left out."""
    momentum, share = batch_norm.initial_share(_nested(), 10)
    assert momentum == 0.9 and abs(share - 0.9 ** 10) < 1e-12
    assert batch_norm.stale_statistics_note(keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)]), 1) == ""
