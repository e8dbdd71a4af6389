"""ImageNet ResNets, v1.5: resnet18/34 (basic blocks), resnet50/101/152 (bottlenecks).

v1.5 (as in torchvision and NVIDIA's reference) puts a bottleneck's stride on
its 3x3 conv instead of the first 1x1: +0.5% top-1 for ~5% more compute.
Stem: 7x7/2 conv, BN, ReLU, 3x3/2 max-pool. Shortcuts that change shape use a
1x1 projection with BN. NHWC (channels_last) inputs of any size >= 32 px.
Trainable parameters at 1000 classes: 11.69M, 21.80M, 25.56M, 44.55M, 60.19M.
"""
import keras
from keras import layers

from tfgpu.models.registration import register_model

# torchvision's BN defaults (momentum 0.1 there is 1 - 0.9 here).
_BN = dict(momentum=0.9, epsilon=1e-5)
# He init with fan_out, as torchvision; the head follows Goyal et al. 2017: N(0, 0.01).
_CONV_INIT = keras.initializers.VarianceScaling(2.0, mode="fan_out", distribution="untruncated_normal")
_HEAD_INIT = keras.initializers.RandomNormal(stddev=0.01)

# name -> (block kind, blocks per stage); stage widths are 64, 128, 256, 512.
_DEPTHS = {
    18: ("basic", (2, 2, 2, 2)),
    34: ("basic", (3, 4, 6, 3)),
    50: ("bottleneck", (3, 4, 6, 3)),
    101: ("bottleneck", (3, 4, 23, 3)),
    152: ("bottleneck", (3, 8, 36, 3)),
}


def _conv(filters, kernel, strides=1, name=None):
    return layers.Conv2D(filters, kernel, strides=strides, padding="same", use_bias=False,
                         kernel_initializer=_CONV_INIT, name=name)


def _bn(sync_batch_norm, zero_init=False, name=None):
    return layers.BatchNormalization(synchronized=sync_batch_norm, gamma_initializer="zeros" if zero_init else "ones",
                                     name=name, **_BN)


def _shortcut(x, filters, strides, sync_batch_norm, name):
    if strides == 1 and x.shape[-1] == filters:
        return x
    x = _conv(filters, 1, strides, name=f"{name}_proj")(x)
    return _bn(sync_batch_norm, name=f"{name}_proj_bn")(x)


def _basic_block(x, width, strides, sync_batch_norm, zero_init_residual, name):
    shortcut = _shortcut(x, width, strides, sync_batch_norm, name)
    x = _conv(width, 3, strides, name=f"{name}_conv1")(x)
    x = layers.ReLU(name=f"{name}_relu1")(_bn(sync_batch_norm, name=f"{name}_bn1")(x))
    x = _conv(width, 3, name=f"{name}_conv2")(x)
    x = _bn(sync_batch_norm, zero_init=zero_init_residual, name=f"{name}_bn2")(x)
    return layers.ReLU(name=f"{name}_out")(layers.Add(name=f"{name}_add")([x, shortcut]))


def _bottleneck_block(x, width, strides, sync_batch_norm, zero_init_residual, name):
    shortcut = _shortcut(x, 4 * width, strides, sync_batch_norm, name)
    x = _conv(width, 1, name=f"{name}_conv1")(x)
    x = layers.ReLU(name=f"{name}_relu1")(_bn(sync_batch_norm, name=f"{name}_bn1")(x))
    x = _conv(width, 3, strides, name=f"{name}_conv2")(x)  # v1.5: the stride lives here
    x = layers.ReLU(name=f"{name}_relu2")(_bn(sync_batch_norm, name=f"{name}_bn2")(x))
    x = _conv(4 * width, 1, name=f"{name}_conv3")(x)
    x = _bn(sync_batch_norm, zero_init=zero_init_residual, name=f"{name}_bn3")(x)
    return layers.ReLU(name=f"{name}_out")(layers.Add(name=f"{name}_add")([x, shortcut]))


def resnet(depth, input_shape, num_classes, sync_batch_norm=False, zero_init_residual=False):
    """Builds ResNet-``depth`` (18, 34, 50, 101 or 152) for NHWC ``input_shape``."""
    if depth not in _DEPTHS:
        raise ValueError(f"ImageNet ResNet depth must be one of {sorted(_DEPTHS)}, got {depth}")
    kind, blocks_per_stage = _DEPTHS[depth]
    block = _basic_block if kind == "basic" else _bottleneck_block
    inputs = keras.Input(input_shape)
    x = _conv(64, 7, 2, name="stem_conv")(inputs)
    x = layers.ReLU(name="stem_relu")(_bn(sync_batch_norm, name="stem_bn")(x))
    x = layers.MaxPooling2D(3, 2, padding="same", name="stem_pool")(x)
    for stage, (width, blocks) in enumerate(zip((64, 128, 256, 512), blocks_per_stage)):
        for i in range(blocks):
            strides = 2 if stage > 0 and i == 0 else 1
            x = block(x, width, strides, sync_batch_norm, zero_init_residual, f"stage{stage + 1}_block{i + 1}")
    x = layers.GlobalAveragePooling2D(name="pool")(x)
    logits = layers.Dense(num_classes, kernel_initializer=_HEAD_INIT, name="logits")(x)
    return keras.Model(inputs, logits, name=f"resnet{depth}")


def _register(depth):
    @register_model(f"resnet{depth}", default_image_size=224, options=("sync_batch_norm", "zero_init_residual"))
    def build(input_shape, num_classes, sync_batch_norm=False, zero_init_residual=False):
        return resnet(depth, input_shape, num_classes, sync_batch_norm, zero_init_residual)

    build.__doc__ = f"ImageNet ResNet-{depth} v1.5."
    return build


resnet18 = _register(18)
resnet34 = _register(34)
resnet50 = _register(50)
resnet101 = _register(101)
resnet152 = _register(152)
