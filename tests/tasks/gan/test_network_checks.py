"""tfgpu.tasks.gan.network_checks: a generator that cannot reach [-1, 1], a discriminator that gives probabilities
or expects 0..255 pixels, each one line naming the flag that built it (issue 28 item 8)."""
import keras
import pytest
from keras import layers

from tfgpu.config import ConfigError
from tfgpu.tasks.gan import network_checks

IMAGE = (8, 8, 1)


def _generator(*last):
    latent = keras.Input((16,))
    x = layers.Reshape(IMAGE)(layers.Dense(64, name="to_pixels")(latent))
    for layer in last:
        x = layer(x)
    return keras.Model(latent, x)


def _discriminator(*first, activation=None):
    image = keras.Input(IMAGE)
    x = image
    for layer in first:
        x = layer(x)
    return keras.Model(image, layers.Dense(1, activation=activation, name="score")(layers.Flatten()(x)))


@pytest.mark.parametrize("last, activation, accepted", [
    ((layers.Activation("tanh", dtype="float32", name="images"),), "tanh", True),
    ((), None, True),  # no activation: unbounded, trained toward [-1, 1] (input.json says so)
    ((layers.Activation("sigmoid", name="images"),), "sigmoid", False),
    ((layers.ReLU(name="images"),), "relu", False),
    ((layers.LeakyReLU(name="images"),), None, True),
])
def test_a_generator_must_reach_minus_one_to_one(last, activation, accepted):
    generator = _generator(*last)
    if accepted:
        assert network_checks.check_generator(generator, "generator", "g.py:gen").activation == activation
        return
    with pytest.raises(ConfigError) as error:
        network_checks.check_generator(generator, "generator", "g.py:gen")
    low, high = {"sigmoid": ("0", "1"), "relu": ("0", "inf")}[activation]
    assert str(error.value) == (f"--generator: g.py:gen's generator ends in {activation} (layer 'images'), which "
                                f"gives images in [{low}, {high}]; the GAN's real images are in [-1, 1]: end the "
                                "generator in tanh")


@pytest.mark.parametrize("gan_loss, why", [
    ("non_saturating", "applies the sigmoid itself (softplus of the score), so D would be sigmoid(sigmoid(x))"),
    ("hinge", "needs an unbounded score (its margins are at -1 and 1)"),
])
def test_a_sigmoid_discriminator_is_one_line_naming_the_flag(gan_loss, why):
    network_checks.check_discriminator(_discriminator(), "discriminator", "d.py:disc", gan_loss)  # logits: fine
    with pytest.raises(ConfigError) as error:
        network_checks.check_discriminator(_discriminator(activation="sigmoid"), "discriminator", "d.py:disc",
                                           gan_loss)
    assert str(error.value) == (f"--discriminator: d.py:disc's discriminator ends in a sigmoid (layer 'score'), but "
                                f"--gan_loss={gan_loss} {why}: remove the activation so it gives one raw score "
                                "(logit) per example")


def test_a_discriminator_expecting_0_to_255_pixels_is_one_line():
    discriminator = _discriminator(layers.Rescaling(1.0 / 255, name="to_unit"))
    with pytest.raises(ConfigError) as error:
        network_checks.check_discriminator(discriminator, "discriminator", "d.py:disc", "non_saturating")
    assert str(error.value) == ("--discriminator: d.py:disc's discriminator begins with Rescaling(scale=0.00392157, "
                                "offset=0) (layer 'to_unit'), so it expects pixels in 0..255, but the GAN feeds it "
                                "images in [-1, 1] (real and generated alike): remove the Rescaling")
