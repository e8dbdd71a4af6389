"""Parameter and multiply-add counts against the numbers the papers print."""
import keras
import pytest

from tfgpu.models import create_model
from tfgpu.models.summary import count_params, flops_per_example

# (model, input size, classes, reference MACs, relative tolerance, source)
_MACS = [
    # torchvision's model table lists ResNet-50 (v1.5) at 4.09 GFLOPS (multiply-adds, conv + fc).
    pytest.param("resnet50", 224, 1000, 4.09e9, 0.01, marks=pytest.mark.slow),  # 12 s loaded: bottlenecks as resnet20
    # He et al. 2016 / common CIFAR tables: ResNet-20 ~41M multiply-adds.
    ("resnet20", 32, 10, 41e6, 0.02),
    # Sandler et al. 2018, Table 3: MobileNetV2 (1.0, 224) 300M multiply-adds (checks depthwise convs).
    ("mobilenet_v2", 224, 1000, 300e6, 0.01),
]


@pytest.mark.parametrize("name,size,classes,reference,tolerance", _MACS)
def test_flops_per_example_matches_published_multiply_adds(name, size, classes, reference, tolerance):
    macs = flops_per_example(create_model(name, (size, size, 3), classes), (size, size, 3))
    assert macs == pytest.approx(reference, rel=tolerance)


def test_flops_per_example_counts_each_layer_kind_by_hand():
    inputs = keras.Input((8, 8, 4))
    x = keras.layers.Conv2D(6, 3, padding="same")(inputs)  # 8*8*6 outputs x 3*3*4 = 13824
    x = keras.layers.DepthwiseConv2D(3, padding="same")(x)  # 8*8*6 outputs x 3*3 = 3456
    x = keras.layers.Conv2DTranspose(5, 4, strides=2, padding="same")(x)  # 8*8*6 inputs x 4*4*5 = 30720
    x = keras.layers.Dense(3)(keras.layers.GlobalAveragePooling2D()(x))  # 5*3 = 15
    assert flops_per_example(keras.Model(inputs, x), (8, 8, 4)) == 13824 + 3456 + 30720 + 15


def test_count_params_counts_trainable_weights_only():
    model = create_model("resnet20", (32, 32, 3), 10)
    assert count_params(model) == 272_474  # He et al. 2016: 0.27M
    assert model.count_params() > count_params(model)  # BN moving statistics are excluded
