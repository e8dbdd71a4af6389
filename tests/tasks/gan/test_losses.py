"""tfgpu.tasks.gan.losses: each GAN loss on known logits, and the float32 forward pass of the penalties."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from tfgpu.models import get_spec
from tfgpu.tasks.gan import losses
from tfgpu.tasks.gan.losses import Float32Forward
from tests.tasks.gan.test_task import _batch, make_task  # noqa: F401 (fixture)


def test_float32_forward_gives_the_float32_network_and_restores_float16(make_task):
    task, _ = make_task(precision="mixed_float16")
    critic, images = task.discriminator, _batch()[0]
    keras.mixed_precision.set_global_policy("float32")
    reference = get_spec("dcgan").builder((8, 8, 1), 10, latent_dim=8).discriminator
    reference.set_weights(critic.get_weights())
    keras.mixed_precision.set_global_policy("mixed_float16")
    with Float32Forward(critic):
        inside = critic(images, training=False)
        assert {layer.compute_dtype for layer in critic._flatten_layers()} == {"float32"}
    np.testing.assert_allclose(inside.numpy(), reference(images, training=False).numpy(), rtol=1e-6, atol=1e-7)
    assert "float16" in {layer.compute_dtype for layer in critic._flatten_layers()}
    assert abs(float(critic(images, training=False)[0, 0]) - float(inside[0, 0])) > 0  # float16 again


@pytest.mark.parametrize("kind, real, fake, d_expected, g_expected", [
    ("non_saturating", 0.0, 0.0, 2 * np.log(2), np.log(2)),
    ("minimax", 0.0, 0.0, 2 * np.log(2), -np.log(2)),
    ("wasserstein", 2.0, -1.0, -3.0, 1.0),
    ("hinge", 2.0, -1.0, 0.0, 1.0),
    ("hinge", 0.5, 0.5, 0.5 + 1.5, -0.5),
])
def test_each_loss_on_known_logits(kind, real, fake, d_expected, g_expected):
    """The critic's and the generator's per-example losses as the papers define them (softplus forms of the
    log-likelihood losses; hinge and Wasserstein as in SNGAN and WGAN)."""
    d = losses.discriminator_loss(kind, tf.constant([real]), tf.constant([fake]))
    g = losses.generator_loss(kind, tf.constant([fake]))
    np.testing.assert_allclose(d.numpy(), [d_expected], rtol=1e-6)
    np.testing.assert_allclose(g.numpy(), [g_expected], rtol=1e-6)


def test_an_unknown_loss_is_refused():
    with pytest.raises(ValueError, match="unknown GAN loss 'lsgan'"):
        losses.discriminator_loss("lsgan", tf.constant([0.0]), tf.constant([0.0]))
