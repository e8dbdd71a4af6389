"""--init_weights: a Keras 3 weights file loads into a built model by layer name, with one-line errors."""
import zipfile

import keras
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tfgpu.config import ConfigError
from tfgpu.models.registry import float32_outputs
from tfgpu.models.weights import check_file, load_initial_weights


def _net(num_classes, head="head", widths=(4,)):
    inputs = keras.Input((8, 8, 3))
    x = inputs
    for i, width in enumerate(widths):
        x = keras.layers.Conv2D(width, 3, name=f"conv{i}")(x)
        x = keras.layers.BatchNormalization(name=f"bn{i}")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(num_classes, name=head)(x))


def _randomize(model, seed=0):
    """Distinct values everywhere, BatchNorm statistics included, so a weight loaded from the wrong place shows."""
    rng = np.random.default_rng(seed)
    model.set_weights([rng.normal(size=w.shape).astype("float32") for w in model.get_weights()])
    return model


def _same(a, b) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(a.get_weights(), b.get_weights()))


@pytest.fixture
def saved(tmp_path):
    model = _randomize(_net(10))
    model.save_weights(str(tmp_path / "net.weights.h5"))
    model.save(str(tmp_path / "net.keras"))
    return model, tmp_path


@pytest.mark.parametrize("name", ["net.weights.h5", "net.keras"])
def test_a_saved_model_loads_back_exactly(saved, name):
    source, tmp_path = saved
    target = _net(10)
    result = load_initial_weights(target, str(tmp_path / name))
    assert _same(target, source)
    assert sorted(result.loaded) == ["bn0", "conv0", "head"] and not result.skipped and not result.unused


def test_layers_match_by_name_not_by_keras_file_order(saved):
    """Keras' own load_weights goes by class and order; a model with the same names in another order loads."""
    source, tmp_path = saved
    inputs = keras.Input((8, 8, 3))
    extra = keras.layers.Conv2D(3, 1, name="new_stem")(inputs)  # a new first Conv2D shifts Keras' "conv2d" paths
    x = keras.layers.BatchNormalization(name="bn0")(keras.layers.Conv2D(4, 3, name="conv0")(extra))
    target = keras.Model(inputs, keras.layers.Dense(10, name="head")(keras.layers.GlobalAveragePooling2D()(x)))
    result = load_initial_weights(target, str(tmp_path / "net.weights.h5"), skip_mismatch=True)
    assert result.skipped == ["new_stem (not in the file)"]
    for name in ("conv0", "bn0", "head"):
        for ours, theirs in zip(target.get_layer(name).get_weights(), source.get_layer(name).get_weights()):
            np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("name", ["net.weights.h5", "net.keras"])
def test_a_new_head_is_one_line_naming_layer_and_shapes_unless_skipped(saved, name):
    source, tmp_path = saved
    path = str(tmp_path / name)
    with pytest.raises(ConfigError) as e:
        load_initial_weights(_net(3), path)
    message = str(e.value)
    assert "\n" not in message and message.startswith("--init_weights")
    assert "layer head" in message and "kernel" in message and "(4, 10)" in message and "(4, 3)" in message
    target = _net(3)
    head = [w.copy() for w in target.get_layer("head").get_weights()]
    result = load_initial_weights(target, path, skip_mismatch=True)
    assert result.loaded == ["bn0", "conv0"] and len(result.skipped) == 1 and result.skipped[0].startswith("head")
    for ours, theirs in zip(target.get_layer("conv0").get_weights() + target.get_layer("bn0").get_weights(),
                            source.get_layer("conv0").get_weights() + source.get_layer("bn0").get_weights()):
        np.testing.assert_array_equal(ours, theirs)
    for ours, initial in zip(target.get_layer("head").get_weights(), head):
        np.testing.assert_array_equal(ours, initial)  # kept as initialized


def test_a_renamed_layer_is_one_line_naming_it(saved):
    _, tmp_path = saved
    with pytest.raises(ConfigError, match=r"model's layer\(s\) classifier are not in the file") as e:
        load_initial_weights(_net(10, head="classifier"), str(tmp_path / "net.weights.h5"))
    assert "\n" not in str(e.value)


def test_a_backbone_saved_alone_loads_into_a_model_that_nests_it(tmp_path):
    def backbone():
        inputs = keras.Input((8, 8, 3))
        return keras.Model(inputs, keras.layers.Conv2D(4, 3, name="conv")(inputs), name="backbone")

    source = _randomize(backbone())
    source.save_weights(str(tmp_path / "backbone.weights.h5"))
    inner = backbone()
    inputs = keras.Input((8, 8, 3))
    head = keras.layers.Dense(5, name="head")(keras.layers.GlobalAveragePooling2D()(inner(inputs)))
    result = load_initial_weights(keras.Model(inputs, head), str(tmp_path / "backbone.weights.h5"),
                                  skip_mismatch=True)
    assert result.loaded == ["backbone/conv"] and result.skipped == ["head (not in the file)"]
    assert _same(inner, source)


def test_a_float32_wrapped_model_loads_a_plain_one(saved):
    """Under mixed precision create_model ends a functional model in a float32 cast, and wraps a subclassed
    one; the plain model's file loads either way."""
    source, tmp_path = saved
    try:
        keras.mixed_precision.set_global_policy("mixed_bfloat16")
        target = float32_outputs(_net(10))
        assert target.layers[-1].name == "float32_logits"
        load_initial_weights(target, str(tmp_path / "net.weights.h5"))
    finally:
        keras.mixed_precision.set_global_policy("float32")
    for name in ("conv0", "bn0", "head"):
        for ours, theirs in zip(target.get_layer(name).get_weights(), source.get_layer(name).get_weights()):
            np.testing.assert_array_equal(ours, theirs)


class _Sub(keras.Model):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.conv = keras.layers.Conv2D(4, 3, name="conv")
        self.pool = keras.layers.GlobalAveragePooling2D()
        self.head = keras.layers.Dense(3, name="head")

    def call(self, x):
        return self.head(self.pool(self.conv(x)))


def test_a_subclassed_model_loads_through_the_wrapper(tmp_path):
    source = _Sub(name="sub")
    source(np.zeros((1, 8, 8, 3), "float32"))
    _randomize(source).save_weights(str(tmp_path / "sub.weights.h5"))
    target = float32_outputs(_Sub(name="sub"), (8, 8, 3))
    result = load_initial_weights(target, str(tmp_path / "sub.weights.h5"))
    assert sorted(result.loaded) == ["sub/conv", "sub/head"]
    assert _same(target.get_layer("sub"), source)


@pytest.mark.parametrize("name, content, expected", [
    ("missing.weights.h5", None, "no such file"),
    ("weights.h5", b"", "expected a local .weights.h5 or .keras file"),
    ("model.ckpt", b"", "expected a local .weights.h5 or .keras file"),
    ("text.weights.h5", b"not hdf5", "not an HDF5 file"),
    ("text.keras", b"not a zip", "not a .keras archive"),
])
def test_bad_files_are_one_line_naming_the_flag(tmp_path, name, content, expected):
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ConfigError, match=expected) as e:
        check_file(str(path))
    assert str(e.value).startswith("--init_weights") and "\n" not in str(e.value)


def test_a_keras_archive_without_h5_weights_is_refused(tmp_path):
    path = tmp_path / "other.keras"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("config.json", "{}")
    with pytest.raises(ConfigError, match="holds no model.weights.h5"):
        check_file(str(path))


@settings(max_examples=3, deadline=None)
@given(widths=st.lists(st.integers(1, 4), min_size=1, max_size=3), classes=st.integers(2, 6),
       new_classes=st.integers(2, 6))
def test_every_layer_but_a_resized_head_loads(tmp_path_factory, widths, classes, new_classes):
    """Whatever the convolution stack: loading a model's own file restores it exactly, and a head of another
    size skips only the head (strict loading refuses it naming the head)."""
    path = str(tmp_path_factory.mktemp("w") / "m.weights.h5")
    source = _randomize(_net(classes, widths=tuple(widths)))
    source.save_weights(path)
    target = _net(new_classes, widths=tuple(widths))
    result = load_initial_weights(target, path, skip_mismatch=True)
    assert len(result.loaded) == 2 * len(widths) + (classes == new_classes)
    assert [s.split(" ")[0] for s in result.skipped] == ([] if classes == new_classes else ["head"])
    body = [w for layer in target.layers if layer.name != "head" for w in layer.get_weights()]
    expected = [w for layer in source.layers if layer.name != "head" for w in layer.get_weights()]
    assert all(np.array_equal(a, b) for a, b in zip(body, expected))
    if classes != new_classes:
        with pytest.raises(ConfigError, match="layer head"):
            load_initial_weights(_net(new_classes, widths=tuple(widths)), path)


def test_the_optimizer_state_of_a_compiled_models_file_is_ignored(tmp_path):
    source = _net(10)
    source.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    source.fit(np.zeros((4, 8, 8, 3), "float32"), np.zeros(4, "int64"), epochs=1, verbose=0)
    source.save_weights(str(tmp_path / "fitted.weights.h5"))
    target = _net(10)
    result = load_initial_weights(target, str(tmp_path / "fitted.weights.h5"))  # strict: nothing left over
    assert not result.unused and _same(target, source)
