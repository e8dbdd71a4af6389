"""ImageNet ResNet v1.5: sizes, options and the stride placement."""
import keras
import numpy as np
import pytest

from tfgpu.models import create_model
from tfgpu.models.summary import count_params

# Exact trainable parameter counts of torchvision's resnet18..152 at 1000 classes.
_TORCHVISION = [("resnet18", 11_689_512), ("resnet34", 21_797_672), ("resnet50", 25_557_032),
                pytest.param("resnet101", 44_549_160, marks=pytest.mark.slow),
                pytest.param("resnet152", 60_192_808, marks=pytest.mark.slow)]


@pytest.mark.parametrize("name,expected", _TORCHVISION)
def test_param_counts_match_torchvision(name, expected):
    assert count_params(create_model(name, (32, 32, 3), 1000)) == expected


def test_bottleneck_stride_is_on_the_3x3_conv():
    model = create_model("resnet50", (64, 64, 3), 10)
    assert model.get_layer("stage2_block1_conv1").strides == (1, 1)
    assert model.get_layer("stage2_block1_conv2").strides == (2, 2)
    assert model.get_layer("stem_pool").output.shape[1:3] == (16, 16)
    assert model.get_layer("pool").input.shape[1:3] == (2, 2)  # 64 px / 32


def test_zero_init_residual_makes_identity_blocks_pass_their_input_through():
    model = create_model("resnet18", (32, 32, 3), 10, zero_init_residual=True)
    probe = keras.Model(model.inputs, [model.get_layer("stage1_block1_out").output,
                                       model.get_layer("stage1_block2_out").output])
    before, after = probe(np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype("float32"))
    np.testing.assert_allclose(after, before, atol=1e-6)
    assert not np.any(model.get_layer("stage1_block1_bn1").gamma.numpy() == 0)


def test_sync_batch_norm_synchronizes_every_batch_norm():
    model = create_model("resnet50", (32, 32, 3), 10, sync_batch_norm=True)
    bns = [layer for layer in model.layers if isinstance(layer, keras.layers.BatchNormalization)]
    assert len(bns) == 53 and all(bn.synchronized for bn in bns)
    assert np.isfinite(model(np.zeros((2, 32, 32, 3), "float32"), training=True)).all()
