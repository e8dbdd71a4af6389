"""The model tfgpu.fit is given: builders in both signatures, a model object built again (same outputs) and given
its trained weights back, under the run's dtype policy, and a subclassed model that cannot be rebuilt refused."""
import keras
import numpy as np
import pytest

from tfgpu.config import ConfigError
from tfgpu.training import fit_model


def test_a_builder_is_called_as_its_signature_asks():
    assert fit_model.call_builder(lambda: "no arguments", (8, 8, 1), 10) == "no arguments"
    assert fit_model.call_builder(lambda shape, n, width=4: (shape, n, width), [8, 8, 1], 10) == ((8, 8, 1), 10, 4)
    assert not fit_model.takes_shape(lambda scale=1: None) and fit_model.takes_shape(lambda a, b, **kw: None)


def test_a_model_object_is_rebuilt_with_its_weights_and_takes_the_trained_ones_back():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    kept = fit_model.Rebuild(model)
    twin = kept.build()
    x = np.random.default_rng(0).normal(size=(5, 4)).astype("float32")
    np.testing.assert_allclose(twin.predict(x, verbose=0), model.predict(x, verbose=0), rtol=1e-6)
    twin.set_weights([w + 1 for w in twin.get_weights()])
    optimizer = keras.optimizers.Adam()
    optimizer.build(twin.trainable_variables)
    optimizer.iterations.assign(7)
    kept.copy_back(optimizer)
    for a, b in zip(model.get_weights(), twin.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert int(model.optimizer.iterations.numpy()) == 7


def test_the_rebuilt_model_follows_the_run_policy():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    kept = fit_model.Rebuild(model)
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        assert kept.build().layers[-1].compute_dtype == "bfloat16"
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_a_subclassed_model_that_cannot_be_rebuilt_is_refused_with_the_way_out():
    class NoConfig(keras.Model):
        def __init__(self, width):
            super().__init__()
            self.dense = keras.layers.Dense(width)

        def call(self, x):
            return self.dense(x)

    model = NoConfig(3)
    model(np.zeros((1, 4), "float32"))
    with pytest.raises(ConfigError, match="NoConfig is a subclassed model that cannot be rebuilt .*pass a function"):
        fit_model.Rebuild(model)
    with pytest.raises(ConfigError, match="is not built"):
        fit_model.Rebuild(keras.Sequential([keras.layers.Dense(3)]))
