"""DCGAN (Radford et al. 2016) and the WGAN-GP critic (Gulrajani et al. 2017) built on the same layout.

The discriminator is a 3x3 stem convolution, then stride-2 4x4 convolutions with
LeakyReLU(0.2) down to the 4x4 (or 7x7) map, then one logit (the stem gives
small images, e.g. 8x8 digits, more than one layer). DCGAN normalizes
with BatchNorm; the WGAN-GP critic must not (the gradient penalty is per
example, BatchNorm mixes examples), so it uses LayerNorm.
"""
import keras
from keras import layers

from tfgpu.models.gan.base import (GanModels, build_generator, discriminator_head, label_input, stage_channels,
                                   stage_sizes)
from tfgpu.models.registration import register_model


def conv_discriminator(image_shape, num_classes, conditional, width, norm, sync_batch_norm=False,
                       name="discriminator") -> keras.Model:
    """Stride-2 conv stack; ``norm`` is "batch", "layer" or "none" (not on the stem)."""
    sizes = stage_sizes(image_shape)
    channels = stage_channels(len(sizes), width)[::-1]  # fine to coarse
    init = keras.initializers.RandomNormal(stddev=0.02)
    image = keras.Input(tuple(int(d) for d in image_shape), name="image")
    label = label_input() if conditional else None
    x = layers.LeakyReLU(0.2)(layers.Conv2D(channels[0], 3, padding="same", kernel_initializer=init)(image))
    for ch in channels[1:]:
        x = layers.Conv2D(ch, 4, strides=2, padding="same", use_bias=norm == "none", kernel_initializer=init)(x)
        if norm == "batch":
            x = layers.BatchNormalization(synchronized=sync_batch_norm)(x)
        elif norm == "layer":
            x = layers.LayerNormalization(axis=[1, 2, 3])(x)
        x = layers.LeakyReLU(0.2)(x)
    features = layers.Flatten()(x)
    logits = discriminator_head(features, label, num_classes)
    return keras.Model([image, label] if conditional else image, logits, name=name)


@register_model("dcgan", family="gan", default_image_size=32, options=("sync_batch_norm",))
def dcgan(image_shape, num_classes, latent_dim=128, conditional=False, width=64, sync_batch_norm=False):
    """DCGAN: BatchNorm generator and discriminator (non-saturating loss in the paper)."""
    return GanModels(
        build_generator(image_shape, num_classes, latent_dim, conditional, width, sync_batch_norm),
        conv_discriminator(image_shape, num_classes, conditional, width, "batch", sync_batch_norm))


@register_model("wgan_gp", family="gan", default_image_size=32, options=("sync_batch_norm",))
def wgan_gp(image_shape, num_classes, latent_dim=128, conditional=False, width=64, sync_batch_norm=False):
    """WGAN-GP: the DCGAN generator and a LayerNorm critic. Train it with the paper's --gan_loss=wasserstein
    --gradient_penalty=10 --n_critic=5 and Adam(1e-4, beta_1=0, beta_2=0.9): configs/cifar10_wgan_gp.flags."""
    return GanModels(
        build_generator(image_shape, num_classes, latent_dim, conditional, width, sync_batch_norm),
        conv_discriminator(image_shape, num_classes, conditional, width, "layer"))
