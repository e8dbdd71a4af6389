"""compile() read as tfgpu.fit trains it: the optimizer's class and config (clipping taken out, done on the summed
gradient), the loss, the metric names History uses, and the refusals naming what cannot be distributed."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from tfgpu.config import ConfigError
from tfgpu.training import fit_compile


def compiled(**kwargs):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    model.compile(**kwargs)
    return fit_compile.of_model(model)


def test_the_optimizer_is_rebuilt_from_its_class_and_config_without_per_replica_clipping():
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5)
    spec = compiled(optimizer=keras.optimizers.SGD(schedule, momentum=0.8, clipnorm=2.0, weight_decay=1e-4),
                    loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    optimizer = spec.make_optimizer()
    assert isinstance(optimizer, keras.optimizers.SGD) and optimizer.momentum == 0.8
    assert optimizer._learning_rate is schedule and optimizer.clipnorm is None and optimizer.weight_decay == 1e-4
    assert spec.clipping == {"clipnorm": 2.0} and spec.metric_names == ("accuracy",)
    assert "SGD(learning_rate=ExponentialDecay, clipnorm=2, momentum=0.8, weight_decay=0.0001)" in spec.describe()
    assert not fit_compile.of_model(keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])).compiled


def test_losses_and_metrics_as_compiled():
    spec = compiled(optimizer="adam", loss=keras.losses.CategoricalCrossentropy(label_smoothing=0.2, from_logits=True),
                    metrics=[keras.metrics.CategoricalAccuracy(name="acc")])
    assert (spec.loss_name, spec.label_smoothing, spec.loss, spec.one_hot, spec.from_logits) == \
        ("categorical_crossentropy", 0.2, None, True, True)
    assert spec.metric_names == ("acc",)
    binary = compiled(optimizer="adam", loss=keras.losses.BinaryCrossentropy(from_logits=True, label_smoothing=0.1))
    assert (binary.binary, binary.from_logits, binary.label_smoothing, binary.loss) == (True, True, 0.1, None)
    generic = compiled(optimizer="adam", loss="mean_squared_error")
    assert generic.loss is not None and generic.metric_names == ()
    values = generic.loss(np.eye(3, dtype="float32"), np.zeros((3, 3), "float32"))
    assert values.shape == (3,)  # one value per example: the loop reduces them


@pytest.mark.parametrize("kwargs, message", [
    (dict(optimizer="adam", loss="binary_focal_crossentropy"), "loss binary_focal_crossentropy"),
    (dict(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=[keras.metrics.R2Score()]),
     "metric 'r2_score'"),
    (dict(optimizer=keras.optimizers.Adam(loss_scale_factor=8.0), loss="sparse_categorical_crossentropy"),
     "loss_scale_factor"),
    (dict(optimizer="adam", loss="sparse_categorical_crossentropy", loss_weights=[2.0]), "loss_weights"),
])
def test_what_the_loop_cannot_distribute_is_refused_by_name(kwargs, message):
    with pytest.raises(ConfigError) as e:
        compiled(**kwargs)
    assert e.value.flag == "model" and message in str(e.value)


def test_clipping_acts_on_the_whole_gradient_as_one_device_does():
    grads = [tf.constant([3.0, 4.0]), tf.constant([0.5])]
    by_norm = fit_compile.clip(grads, {"clipnorm": 1.0}, tf.constant(1.0), 1)
    np.testing.assert_allclose(by_norm[0], [0.6, 0.8], rtol=1e-6)
    np.testing.assert_allclose(by_norm[1], [0.5])
    by_value = fit_compile.clip(grads, {"clipvalue": 1.0}, tf.constant(1.0), 1)
    np.testing.assert_allclose(by_value[0], [1.0, 1.0])
    scaled = fit_compile.clip([g * 4 for g in grads], {"global_clipnorm": 1.0}, tf.constant(4.0), 1)
    assert float(tf.linalg.global_norm(scaled)) == pytest.approx(4.0, rel=1e-5)  # measured unscaled, rescaled
