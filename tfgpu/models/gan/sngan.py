"""SNGAN (Miyato et al. 2018): the DCGAN generator and a spectrally normalized discriminator.

The discriminator is the paper's "standard CNN": per resolution a 3x3 stride-1
and a 4x4 stride-2 convolution with LeakyReLU(0.1), a last 3x3 convolution,
global pooling and a spectrally normalized linear logit (plus the projection
term when conditional). Train it with --gan_loss=hinge.
"""
import keras
from keras import layers

from tfgpu.models.gan.base import (GanModels, build_generator, discriminator_head, label_input, stage_channels,
                                   stage_sizes)
from tfgpu.models.gan.layers import SNConv2D, SNDense
from tfgpu.models.registration import register_model


def sn_discriminator(image_shape, num_classes, conditional, width, name="discriminator") -> keras.Model:
    sizes = stage_sizes(image_shape)
    channels = stage_channels(len(sizes), width)[::-1]  # fine to coarse
    image = keras.Input(tuple(int(d) for d in image_shape), name="image")
    label = label_input() if conditional else None
    x = image
    for ch, next_ch in zip(channels[:-1], channels[1:]):
        x = layers.LeakyReLU(0.1)(SNConv2D(ch, 3)(x))
        x = layers.LeakyReLU(0.1)(SNConv2D(next_ch, 4, strides=2)(x))
    x = layers.LeakyReLU(0.1)(SNConv2D(channels[-1], 3)(x))
    features = layers.GlobalAveragePooling2D()(x)
    logits = discriminator_head(features, label, num_classes, dense=SNDense)
    return keras.Model([image, label] if conditional else image, logits, name=name)


@register_model("sngan", family="gan", default_image_size=32, options=("sync_batch_norm",))
def sngan(image_shape, num_classes, latent_dim=128, conditional=False, width=64, sync_batch_norm=False):
    """SNGAN: spectral normalization in every discriminator layer, no normalization layers there."""
    return GanModels(build_generator(image_shape, num_classes, latent_dim, conditional, width, sync_batch_norm),
                     sn_discriminator(image_shape, num_classes, conditional, width))
