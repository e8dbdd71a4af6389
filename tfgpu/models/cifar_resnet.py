"""CIFAR ResNets (He et al. 2016, section 4.2): 6n+2 layers, 16/32/64 filters.

resnet20 has 0.27M parameters, resnet56 0.85M, resnet110 1.7M. Shortcuts that
change shape use a 1x1 projection (option B); inputs of any size work.
"""
import keras
from keras import layers

from tfgpu.models.registration import register_model

_BN = dict(momentum=0.9, epsilon=1e-5)


def _bn(sync_batch_norm, zero_init=False, name=None):
    return layers.BatchNormalization(
        synchronized=sync_batch_norm, gamma_initializer="zeros" if zero_init else "ones", name=name, **_BN
    )


def _conv(filters, kernel, strides=1, name=None):
    return layers.Conv2D(
        filters, kernel, strides=strides, padding="same", use_bias=False,
        kernel_initializer="he_normal", name=name,
    )


def _basic_block(x, filters, strides, sync_batch_norm, zero_init_residual, name):
    shortcut = x
    if strides != 1 or x.shape[-1] != filters:
        shortcut = _conv(filters, 1, strides, name=f"{name}_proj")(x)
        shortcut = _bn(sync_batch_norm, name=f"{name}_proj_bn")(shortcut)
    x = _conv(filters, 3, strides, name=f"{name}_conv1")(x)
    x = _bn(sync_batch_norm, name=f"{name}_bn1")(x)
    x = layers.ReLU()(x)
    x = _conv(filters, 3, name=f"{name}_conv2")(x)
    x = _bn(sync_batch_norm, zero_init=zero_init_residual, name=f"{name}_bn2")(x)
    return layers.ReLU()(layers.Add()([x, shortcut]))


def cifar_resnet(depth, input_shape, num_classes, sync_batch_norm=False, zero_init_residual=False):
    if (depth - 2) % 6:
        raise ValueError(f"CIFAR ResNet depth must be 6n+2, got {depth}")
    blocks_per_stage = (depth - 2) // 6
    inputs = keras.Input(input_shape)
    x = _conv(16, 3, name="stem_conv")(inputs)
    x = layers.ReLU()(_bn(sync_batch_norm, name="stem_bn")(x))
    for stage, filters in enumerate((16, 32, 64)):
        for block in range(blocks_per_stage):
            strides = 2 if stage > 0 and block == 0 else 1
            x = _basic_block(x, filters, strides, sync_batch_norm, zero_init_residual, f"stage{stage + 1}_block{block + 1}")
    x = layers.GlobalAveragePooling2D()(x)
    logits = layers.Dense(num_classes, kernel_initializer="he_normal", name="logits")(x)
    return keras.Model(inputs, logits, name=f"resnet{depth}")


def _register(depth):
    @register_model(f"resnet{depth}", default_image_size=32, options=("sync_batch_norm", "zero_init_residual"))
    def build(input_shape, num_classes, sync_batch_norm=False, zero_init_residual=False):
        return cifar_resnet(depth, input_shape, num_classes, sync_batch_norm, zero_init_residual)

    build.__doc__ = f"CIFAR ResNet-{depth}."
    return build


resnet20 = _register(20)
resnet32 = _register(32)
resnet44 = _register(44)
resnet56 = _register(56)
resnet110 = _register(110)
