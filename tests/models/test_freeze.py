"""--freeze=REGEX: which layers stop training, BatchNorm in inference mode, and the unfreeze."""
import keras
import numpy as np
import pytest

from tfgpu.config import ConfigError
from tfgpu.models.freeze import Freezer


def _model():
    inputs = keras.Input((4, 4, 2))
    x = keras.layers.Conv2D(3, 1, name="stem_conv")(inputs)
    x = keras.layers.BatchNormalization(name="stem_bn")(x)
    backbone = keras.Model(inputs, x, name="backbone")
    outer = keras.Input((4, 4, 2))
    pooled = keras.layers.GlobalAveragePooling2D(name="pool")(backbone(outer))
    return keras.Model(outer, keras.layers.Dense(2, name="head")(pooled))


def test_nested_layers_match_by_their_own_names_and_batch_norm_runs_in_inference_mode():
    model = _model()
    freezer = Freezer(model, "_bn$")
    freezer.freeze()
    bn = model.get_layer("backbone").get_layer("stem_bn")
    assert [layer.name for layer in freezer.layers] == ["stem_bn"]
    assert not any(v is w for v in model.trainable_variables for w in bn.weights)
    x = np.random.default_rng(0).normal(3.0, 2.0, size=(8, 4, 4, 2)).astype("float32")
    stats = [w.numpy().copy() for w in bn.weights]
    trained, inferred = model(x, training=True), model(x, training=False)
    np.testing.assert_array_equal(trained.numpy(), inferred.numpy())  # moving statistics, not the batch's
    for before, after in zip(stats, bn.weights):
        np.testing.assert_array_equal(before, after.numpy())


def test_a_matching_submodel_freezes_everything_in_it_and_unfreeze_restores_the_builders_choice():
    model = _model()
    model.get_layer("backbone").get_layer("stem_conv").trainable = False  # the builder froze this one itself
    all_trainable = {id(v) for v in model.trainable_variables}
    freezer = Freezer(model, "^backbone$")
    freezer.freeze()
    assert [v.name for v in model.trainable_variables] == ["kernel", "bias"]  # only the head
    freezer.unfreeze()
    assert {id(v) for v in model.trainable_variables} == all_trainable
    assert not model.get_layer("backbone").get_layer("stem_conv").trainable


@pytest.mark.parametrize("pattern, expected", [
    ("^conv", "'\\^conv' matches no layer name of the model \\(its layers: "),
    ("^pool$", "matches only layers without trainable weights \\(pool\\)"),
])
def test_a_regex_that_freezes_nothing_is_one_line_naming_the_flag(pattern, expected):
    with pytest.raises(ConfigError, match=expected) as e:
        Freezer(_model(), pattern)
    assert str(e.value).startswith("--freeze") and "\n" not in str(e.value)
    assert "stem_conv" in str(e.value)  # the model's layer names as a hint
