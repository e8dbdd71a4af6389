"""keras.applications backbones: reference sizes, input scaling, options."""
import keras
import numpy as np
import pytest

from tfgpu.models import create_model
from tfgpu.models.summary import count_params

# keras.applications' own include_top=True nets (weights=None) at 1000 classes.
_KERAS_TOP_PARAMS = [("efficientnet_b0", 5_288_548), ("mobilenet_v2", 3_504_872),
                     pytest.param("convnext_tiny", 28_589_128, marks=pytest.mark.slow)]
# The layer right after any preprocessing: it must see our [-1, 1] images as they are.
_STEM = {"efficientnet_b0": "stem_conv_pad", "mobilenet_v2": "Conv1", "convnext_tiny": "convnext_tiny_stem"}


@pytest.mark.parametrize("name,expected", _KERAS_TOP_PARAMS)
def test_param_counts_match_keras_applications_with_their_top(name, expected):
    assert count_params(create_model(name, (32, 32, 3), 1000)) == expected


@pytest.mark.parametrize("name", sorted(_STEM))
def test_first_layer_sees_images_in_minus_one_to_one_unchanged(name):
    model = create_model(name, (32, 32, 3), 10)
    probe = keras.Model(model.inputs, model.get_layer(_STEM[name]).input)
    images = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    np.testing.assert_allclose(probe(images), images, atol=1e-5)


@pytest.mark.parametrize("name,residual_blocks", [("efficientnet_b0", 9), ("mobilenet_v2", 10)])
def test_options_reach_the_backbone_batch_norms(name, residual_blocks):
    model = create_model(name, (32, 32, 3), 10, sync_batch_norm=True, zero_init_residual=True)
    bns = [layer for layer in model.layers if isinstance(layer, keras.layers.BatchNormalization)]
    assert bns and all(bn.synchronized for bn in bns)
    zeroed = [bn.name for bn in bns if not np.any(bn.gamma.numpy())]
    assert len(zeroed) == residual_blocks and all(n.lower().endswith("project_bn") for n in zeroed)
    assert np.isfinite(model(np.zeros((2, 32, 32, 3), "float32"), training=True)).all()


def test_too_small_images_name_the_flag_to_fix():
    with pytest.raises(ValueError, match="at least 32x32, got 28x28; raise --image_size"):
        create_model("mobilenet_v2", (28, 28, 1), 10)
