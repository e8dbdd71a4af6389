"""What every GAN builder shares: the GanModels pair, the resolution plan and the generator.

A GAN builder is called ``builder(image_shape, num_classes, latent_dim=..., conditional=...)``
and returns ``GanModels(generator, discriminator)``. The generator maps a latent
vector (and a label when conditional) to an image in [-1, 1] (tfgpu's image
range, ``tfgpu.data.input.augment.to_model_range``); the discriminator maps an image
(and a label) to one logit per example. Both outputs are float32 whatever the
dtype policy. Builders never mention precision or strategy.
"""
import dataclasses

import keras
from keras import layers


@dataclasses.dataclass(frozen=True)
class GanModels:
    generator: keras.Model
    discriminator: keras.Model


def stage_sizes(image_shape) -> list:
    """Spatial sizes from the generator's first feature map to the image, e.g. 32 -> [4, 8, 16, 32],
    28 -> [7, 14, 28], 8 -> [4, 8]; raises ValueError for sizes the nets cannot produce."""
    h, w = int(image_shape[0]), int(image_shape[1])
    if h != w:
        raise ValueError(f"GAN models need square images, got {h}x{w}; set --image_size")
    sizes = [h]
    while sizes[0] % 2 == 0 and sizes[0] // 2 >= 4:
        sizes.insert(0, sizes[0] // 2)
    if len(sizes) < 2:
        raise ValueError(f"GAN image size {h} cannot be halved to a 4x4 (or larger) map; use a size like "
                         "8, 16, 28, 32, 64 or 128 (--image_size)")
    return sizes


def stage_channels(num_stages: int, width: int) -> list:
    """Channels per stage, coarse to fine: the finest stage has ``width``, each coarser one doubles (max 8x)."""
    return [width * min(2 ** (num_stages - 1 - i), 8) for i in range(num_stages)]


def label_input():
    return keras.Input((), dtype="int32", name="label")


def build_generator(image_shape, num_classes, latent_dim, conditional, width, sync_batch_norm=False,
                    name="generator") -> keras.Model:
    """DCGAN generator: dense to a 4x4 (or 7x7) map, stride-2 transposed convolutions with BN and ReLU,
    a 3x3 convolution to the image channels and tanh. Conditional: a label embedding joins the latent."""
    sizes = stage_sizes(image_shape)
    channels = stage_channels(len(sizes), width)
    init = keras.initializers.RandomNormal(stddev=0.02)
    latent = keras.Input((latent_dim,), name="latent")
    inputs, x = [latent], latent
    if conditional:
        label = label_input()
        inputs.append(label)
        x = layers.Concatenate()([latent, layers.Embedding(num_classes, latent_dim, name="label_embedding")(label)])
    x = layers.Dense(sizes[0] * sizes[0] * channels[0], use_bias=False, kernel_initializer=init)(x)
    x = layers.Reshape((sizes[0], sizes[0], channels[0]))(x)
    x = layers.ReLU()(layers.BatchNormalization(synchronized=sync_batch_norm)(x))
    for ch in channels[1:]:
        x = layers.Conv2DTranspose(ch, 4, strides=2, padding="same", use_bias=False, kernel_initializer=init)(x)
        x = layers.ReLU()(layers.BatchNormalization(synchronized=sync_batch_norm)(x))
    x = layers.Conv2D(int(image_shape[-1]), 3, padding="same", kernel_initializer=init)(x)
    images = layers.Activation("tanh", dtype="float32", name="images")(x)
    return keras.Model(inputs if conditional else latent, images, name=name)


def discriminator_head(features, label, num_classes, dense=layers.Dense):
    """One float32 logit per example; with a label, the projection term <embed(label), features> is added
    (Miyato & Koyama 2018)."""
    logits = dense(1, name="logit")(features)
    if label is not None:
        embedded = layers.Embedding(num_classes, features.shape[-1], name="projection")(label)
        logits = layers.Add()([logits, layers.Dot(axes=1)([embedded, features])])
    return layers.Activation("linear", dtype="float32", name="logits")(logits)
