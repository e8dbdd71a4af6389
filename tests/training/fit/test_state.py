"""training/fit/state: a fit run's checkpoint restores the model, its optimizer and the position; one trained on
other data, or of another model, is refused in one line naming the argument."""
import keras
import numpy as np
import pytest

from tfgpu.config import ConfigError
from tfgpu.training.fit import placement, state


def _model(units=4):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(units), keras.layers.Dense(2)])
    model.compile(optimizer="adam", loss="mse")
    model.optimizer.build(model.trainable_variables)
    return model


def test_a_checkpoint_restores_the_model_optimizer_and_position(tmp_path):
    model = _model()
    where = placement.of_model(model)
    position = state.Position(epoch=2, step=5, seed=11, kind="arrays", examples=100, batch_size=8)
    saving = state.RunState(model, where, str(tmp_path), position, every_s=0)
    model.optimizer.iterations.assign(7)
    saving.steps.assign(21)
    saving.save()
    assert saving.every_s >= state.MIN_INTERVAL_S  # the next timed save waits for 50 times this one's duration
    fresh = _model()
    again = state.Position(kind="arrays", examples=100, batch_size=8)
    restored = state.RunState(fresh, where, str(tmp_path), again, every_s=0).restore()
    assert (restored.epoch, restored.step, restored.seed) == (2, 5, 11)
    assert int(fresh.optimizer.iterations.numpy()) == 7
    for a, b in zip(model.get_weights(), fresh.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_other_data_or_another_model_is_refused(tmp_path):
    model = _model()
    where = placement.of_model(model)
    state.RunState(model, where, str(tmp_path), state.Position(kind="arrays", examples=100, batch_size=8), 0).save()
    for argument, position in (("x", state.Position(kind="arrays", examples=99, batch_size=8)),
                               ("batch_size", state.Position(kind="arrays", examples=100, batch_size=16)),
                               ("x", state.Position(kind="dataset", examples=-1, batch_size=0))):
        with pytest.raises(ConfigError) as error:
            state.RunState(_model(), where, str(tmp_path), position, 0).restore()
        assert error.value.flag == argument and "give the same, or another model_dir" in str(error.value)
    with pytest.raises(ConfigError, match="does not fit the model built here"):
        state.RunState(_model(units=5), where, str(tmp_path),
                       state.Position(kind="arrays", examples=100, batch_size=8), 0).restore()


class _NoCallGAN(keras.Model):
    """keras-io's DCGAN pattern in miniature: no ``call``, two optimizers given to ``compile`` and built by the first
    step, its own seed generator drawing the latent vectors."""

    def __init__(self):
        super().__init__()
        self.discriminator = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8, activation="relu"),
                                               keras.layers.Dense(1)])
        self.generator = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8)])
        self.seed_generator = keras.random.SeedGenerator(1)

    def compile(self):
        super().compile()
        self.d_optimizer, self.g_optimizer = keras.optimizers.Adam(1e-2), keras.optimizers.Adam(1e-2)
        self.loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)
        self.d_loss = keras.metrics.Mean(name="d_loss")

    @property
    def metrics(self):
        return [self.d_loss]

    def train_step(self, real):
        import tensorflow as tf
        from keras import ops

        n = ops.shape(real)[0]
        z = keras.random.normal((n, 4), seed=self.seed_generator)
        labels = ops.concatenate([ops.ones((n, 1)), ops.zeros((n, 1))], 0)
        with tf.GradientTape() as tape:
            d_loss = self.loss_fn(labels, self.discriminator(ops.concatenate([self.generator(z), real], 0)))
        weights = self.discriminator.trainable_weights
        self.d_optimizer.apply_gradients(zip(tape.gradient(d_loss, weights), weights))
        with tf.GradientTape() as tape:
            g_loss = self.loss_fn(ops.zeros((n, 1)), self.discriminator(self.generator(z)))
        weights = self.generator.trainable_weights
        self.g_optimizer.apply_gradients(zip(tape.gradient(g_loss, weights), weights))
        self.d_loss.update_state(d_loss)
        return {"d_loss": self.d_loss.result()}


def _dropout_classifier():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dropout(0.5),
                              keras.layers.Dense(2, activation="softmax")])
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="sparse_categorical_crossentropy")
    return model


def _gan():
    gan = _NoCallGAN()
    gan.compile()
    return gan


@pytest.mark.parametrize("make", [_gan, _dropout_classifier], ids=["gan_without_call", "dropout"])
def test_a_resumed_run_draws_what_the_uninterrupted_run_draws(tmp_path, make):
    """A model whose first step builds its optimizers restores into them, and the seed generators (the GAN's own,
    Dropout's) resume their streams: two epochs, or one and then one more in a fresh model, end bit-identical."""
    import tfgpu

    rng = np.random.RandomState(0)
    x, y = rng.rand(96, 8).astype("float32"), rng.randint(0, 2, 96)
    data = (x,) if make is _gan else (x, y)

    def trained(model_dir, epochs):
        keras.utils.set_random_seed(0)
        model = make()
        tfgpu.fit(model, *data, batch_size=16, epochs=epochs, verbose=0, model_dir=str(model_dir))
        return model

    whole = trained(tmp_path / "whole", 2)
    trained(tmp_path / "split", 1)
    resumed = trained(tmp_path / "split", 2)
    assert len(resumed.variables) > len(resumed.weights)  # seed generator states among the model's variables
    for a, b in zip(whole.variables, resumed.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)
    if make is _gan:
        assert int(resumed.d_optimizer.iterations.numpy()) == 12
        for a, b in zip(whole.d_optimizer.variables, resumed.d_optimizer.variables):
            np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)
