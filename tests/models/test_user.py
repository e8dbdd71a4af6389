"""A user's own builder by flag (tfgpu.models.user): --model=MODULE:FUNCTION or path/to/file.py:FUNCTION, and
--generator / --discriminator for GANs. Resolution, each refusal as one line naming the flag, float32 logits and
kwargs. Training runs with a user model are in tests/examples/test_own_model.py."""
import logging
import os
import sys
import uuid

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfgpu import config_sources
from tfgpu.config import ConfigError
from tfgpu.models import create_model, get_spec, user
from tfgpu.models import registration

NET = """
import keras
from keras import layers


class Scale(layers.Layer):
    def build(self, input_shape):
        self.gain = self.add_weight(shape=(input_shape[-1],), initializer="ones")

    def call(self, x):
        return x * self.gain


def build(input_shape, num_classes):
    inputs = keras.Input(input_shape)
    x = layers.GlobalAveragePooling2D()(Scale()(layers.Conv2D(4, 3, padding="same")(inputs)))
    return keras.Model(inputs, layers.Dense(num_classes)(x))


def build_all(input_shape, num_classes, **kwargs):
    build_all.seen = kwargs
    return build(input_shape, num_classes)


class Net(keras.Model):
    def __init__(self, num_classes, **kwargs):
        super().__init__(**kwargs)
        self.num_classes = num_classes
        self.conv, self.pool = layers.Conv2D(4, 3), layers.GlobalAveragePooling2D()
        self.head = layers.Dense(num_classes)

    def call(self, x):
        return self.head(self.pool(self.conv(x)))

    def get_config(self):
        return {**super().get_config(), "num_classes": self.num_classes}


def subclassed(input_shape, num_classes):
    return Net(num_classes)


def returns_list(input_shape, num_classes):
    return [build(input_shape, num_classes)]


def wrong_classes(input_shape, num_classes):
    return build(input_shape, num_classes + 1)


def raises(input_shape, num_classes):
    raise RuntimeError("a bug in the user's builder")


def no_arguments():
    return None


not_a_function = 3
"""


@pytest.fixture
def net_file(tmp_path):
    """A user's model file in its own directory; its module name is unique to the test."""
    path = tmp_path / "models" / f"net_{uuid.uuid4().hex[:8]}.py"
    path.parent.mkdir()
    path.write_text(NET)
    return path


def _one_line_naming(error: Exception, flag: str) -> str:
    message = str(error)
    assert message.startswith(f"--{flag}: ") and "\n" not in message, message
    return message


def test_a_module_path_resolves_and_builds_a_classifier_with_float32_logits(net_file, monkeypatch):
    monkeypatch.syspath_prepend(str(net_file.parent))
    spec = get_spec(f"{net_file.stem}:build")
    assert spec.family == "classifier" and spec.builder.function.__module__ == net_file.stem
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    model = create_model(f"{net_file.stem}:build", (8, 8, 1), 10)
    logits = model(np.zeros((2, 8, 8, 1), "float32"))
    assert logits.shape == (2, 10) and logits.dtype == "float32"


def test_a_relative_file_resolves_against_the_cwd_and_the_config_keeps_it_absolute(net_file, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    relative = f"models/{net_file.name}:build"
    config = config_sources.resolve({"model": relative, "dataset": "digits", "model_dir": str(tmp_path / "run")})
    assert config.model == f"{net_file}:build"
    assert get_spec(relative).builder.function is get_spec(config.model).builder.function  # imported once
    monkeypatch.chdir(net_file.parent.parent.parent)  # the absolute name works from anywhere
    assert create_model(config.model, (8, 8, 1), 3)(np.zeros((1, 8, 8, 1), "float32")).shape == (1, 3)


def test_a_registered_name_wins_even_with_a_colon(monkeypatch):
    spec = registration.ModelSpec("zoo:net", lambda *a: None, "classifier", 32)
    monkeypatch.setitem(registration._MODELS, "zoo:net", spec)
    assert get_spec("zoo:net").default_image_size == 32
    assert user.absolute("zoo:net") == "zoo:net"


def test_a_subclassed_model_is_built_wrapped_and_counted(net_file):
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    model = create_model(f"{net_file}:subclassed", (8, 8, 3), 5)
    assert model.count_params() == 3 * 3 * 3 * 4 + 4 + 4 * 5 + 5
    assert model(np.zeros((2, 8, 8, 3), "float32")).dtype == "float32"


def test_a_function_gets_only_the_keywords_it_declares_and_a_warning_for_a_true_one(net_file, caplog):
    with caplog.at_level(logging.WARNING, logger="tfgpu"):
        create_model(f"{net_file}:build", (8, 8, 1), 10, sync_batch_norm=True, zero_init_residual=False)
    assert "--sync_batch_norm=True has no effect" in caplog.text and "zero_init_residual" not in caplog.text
    create_model(f"{net_file}:build_all", (8, 8, 1), 10, sync_batch_norm=True, zero_init_residual=False)
    assert get_spec(f"{net_file}:build_all").builder.function.seen == {"sync_batch_norm": True,
                                                                        "zero_init_residual": False}


@pytest.mark.parametrize("reference,expected", [
    ("no_such_module_tfgpu_test:build", "cannot import module no_such_module_tfgpu_test: No module named "
                                        "'no_such_module_tfgpu_test' (run from the directory"),
    ("{dir}/missing.py:build", "file '{dir}/missing.py' does not exist"),
    ("{file}:nothing", "{file} has no function 'nothing'; it defines build, build_all, no_arguments, raises, "
                       "returns_list, subclassed, wrong_classes"),
    ("{file}:not_a_function", "{file}:not_a_function is an int, not a function"),
    ("{file}:no_arguments", "{file}:no_arguments must take (input_shape, num_classes, **kwargs); its signature "
                            "is ()"),
    ("{file}:", "expected MODULE:FUNCTION or path/to/file.py:FUNCTION, got '{file}:'"),
    (":build", "expected MODULE:FUNCTION or path/to/file.py:FUNCTION, got ':build'"),
    ("resnet5", "unknown model 'resnet5'; known models: "),
], ids=["no-module", "no-file", "no-function", "not-callable", "signature", "no-function-name", "no-module-name",
        "unknown-name"])
def test_a_reference_that_does_not_resolve_is_one_line_naming_model(reference, expected, net_file, tmp_path):
    values = {"file": str(net_file), "dir": str(tmp_path)}
    with pytest.raises(ConfigError) as error:
        config_sources.resolve({"model": reference.format(**values), "dataset": "digits", "model_dir": str(tmp_path)})
    assert expected.format(**values) in _one_line_naming(error.value, "model")


@pytest.mark.parametrize("source,expected", [
    ("import no_such_dependency_tfgpu_test\n", "No module named 'no_such_dependency_tfgpu_test'"),
    ("def build(input_shape, num_classes:\n", "line 1"),
])
def test_a_file_that_does_not_import_is_one_line_with_the_reason(source, expected, tmp_path):
    path = tmp_path / f"broken_{uuid.uuid4().hex[:8]}.py"
    path.write_text(source)
    with pytest.raises(ConfigError) as error:
        user.load(f"{path}:build")
    message = _one_line_naming(error.value, "model")
    assert f"cannot import {path}: " in message and expected in message
    assert not [m for m in sys.modules if m.startswith(f"tfgpu_user_{path.stem}")]


def test_a_module_with_a_missing_dependency_names_the_dependency(tmp_path, monkeypatch):
    name = f"needs_dep_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text("import no_such_dependency_tfgpu_test\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as error:
        user.load(f"{name}:build")
    assert _one_line_naming(error.value, "model") == (
        f"--model: cannot import module {name}: No module named 'no_such_dependency_tfgpu_test' (an import inside "
        "it failed)")


@pytest.mark.parametrize("function,expected", [
    ("returns_list", "returned a list, not a keras.Model"),
    ("wrong_classes", "gives outputs of shape (None, 11); a classifier of 10 classes must give logits of shape "
                      "(batch, 10)"),
])
def test_what_only_the_call_can_tell_is_one_line_naming_model(function, expected, net_file):
    with pytest.raises(ConfigError) as error:
        create_model(f"{net_file}:{function}", (8, 8, 1), 10)
    assert expected in _one_line_naming(error.value, "model")


def test_an_exception_inside_the_users_function_is_not_hidden(net_file):
    with pytest.raises(RuntimeError, match="a bug in the user's builder"):
        create_model(f"{net_file}:raises", (8, 8, 1), 10)


# -- GANs: --generator and --discriminator ---------------------------------------------------------------------
GAN = """
import keras
from keras import layers


def generator(image_shape, num_classes, latent_dim=128, conditional=False):
    z = keras.Input((latent_dim,))
    x = layers.Dense(image_shape[0] * image_shape[1] * image_shape[2], activation="tanh")(z)
    return keras.Model(z, layers.Reshape(image_shape)(x))


def discriminator(image_shape, num_classes, **kwargs):
    image = keras.Input(image_shape)
    return keras.Model(image, layers.Dense(1)(layers.Flatten()(image)))


def conditional_discriminator(image_shape, num_classes, conditional=False, **kwargs):
    image, label = keras.Input(image_shape), keras.Input((), dtype="int32")
    features = layers.Flatten()(image)
    projection = layers.Dot(axes=1)([layers.Embedding(num_classes, features.shape[-1])(label), features])
    return keras.Model([image, label], layers.Add()([layers.Dense(1)(features), projection]))


def image_out(image_shape, num_classes, **kwargs):
    return discriminator(image_shape, num_classes)
"""


@pytest.fixture
def gan_file(tmp_path):
    path = tmp_path / f"gan_{uuid.uuid4().hex[:8]}.py"
    path.write_text(GAN)
    return path


def test_user_gan_networks_build_with_float32_outputs(gan_file):
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    generator = user.build_gan_network("generator", f"{gan_file}:generator", (8, 8, 1), 10, 16, False,
                                       sync_batch_norm=False)
    discriminator = user.build_gan_network("discriminator", f"{gan_file}:conditional_discriminator", (8, 8, 1), 10,
                                           16, True)
    images = generator(tf.zeros((2, 16)))
    assert images.shape == (2, 8, 8, 1) and images.dtype == "float32"
    logits = discriminator([images, tf.constant([1, 2])])
    assert logits.shape == (2, 1) and logits.dtype == "float32"


@pytest.mark.parametrize("flag,function,conditional,expected", [
    ("generator", "discriminator", False, "'s model does not take a (batch, 16) latent: "),
    ("discriminator", "discriminator", True, "'s model does not take (batch, 8, 8, 1) images and (batch,) int32 "
                                             "labels as a list [x, labels]: "),
    ("discriminator", "generator", False, "'s model does not take (batch, 8, 8, 1) images: "),
])
def test_user_gan_networks_that_do_not_fit_the_task_are_one_line_naming_the_flag(flag, function, conditional,
                                                                                  expected, gan_file):
    with pytest.raises(ConfigError) as error:
        user.build_gan_network(flag, f"{gan_file}:{function}", (8, 8, 1), 10, 16, conditional)
    assert expected in _one_line_naming(error.value, flag)


def test_gan_flags_are_checked_when_the_config_is_and_only_for_gans(gan_file, tmp_path):
    base = {"dataset": "digits", "model_dir": str(tmp_path), "task": "gan", "model": "dcgan"}
    config = config_sources.resolve({**base, "generator": f"{gan_file}:generator"})
    assert config.options()["generator"] == f"{gan_file}:generator"
    with pytest.raises(ConfigError) as error:
        config_sources.resolve({**base, "discriminator": f"{gan_file}:critic"})
    assert "has no function 'critic'" in _one_line_naming(error.value, "discriminator")
    with pytest.raises(ConfigError) as error:
        config_sources.resolve({**base, "task": "classification", "generator": f"{gan_file}:generator"})
    assert _one_line_naming(error.value, "generator") == "--generator: is for --task=gan; this run is " \
                                                         "--task=classification"


@pytest.mark.parametrize("reference,expected", [
    ("pkg.mod:build", "pkg.mod:build"),
    ("a/b.py:f", os.path.join(os.getcwd(), "a/b.py") + ":f"),
    ("/abs/b.py:f", "/abs/b.py:f"),
    ("resnet20", "resnet20"),
])
def test_absolute_changes_only_relative_files(reference, expected):
    assert user.absolute(reference) == expected



def test_a_sequential_model_gets_float32_logits_under_mixed_precision(tmp_path):
    path = tmp_path / f"seq_{uuid.uuid4().hex[:8]}.py"
    path.write_text("import keras\n\ndef build(input_shape, num_classes):\n    return keras.Sequential([keras.Input("
                    "input_shape), keras.layers.Flatten(), keras.layers.Dense(num_classes)])\n")
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    model = create_model(f"{path}:build", (4, 4, 1), 3)
    assert model(np.zeros((2, 4, 4, 1), "float32")).dtype == "float32"


CUSTOM = """
import keras


class NeedsConfig(keras.layers.Layer):
    def __init__(self, units, activation, **kwargs):
        super().__init__(**kwargs)
        self.dense = keras.layers.Dense(units, activation=activation)

    def call(self, x):
        return self.dense(x)


def unsaveable(input_shape, num_classes):
    inputs = keras.Input(input_shape)
    return keras.Model(inputs, NeedsConfig(num_classes, lambda x: x)(keras.layers.Flatten()(inputs)))


def unregistered(input_shape, num_classes):
    inputs = keras.Input(input_shape)
    return keras.Model(inputs, NeedsConfig(num_classes, "linear")(keras.layers.Flatten()(inputs)))
"""


def test_a_model_that_cannot_be_saved_is_refused_before_training_and_an_unregistered_layer_warned(tmp_path,
                                                                                                     caplog):
    path = tmp_path / f"custom_{uuid.uuid4().hex[:8]}.py"
    path.write_text(CUSTOM)
    with pytest.raises(ConfigError) as error:
        create_model(f"{path}:unsaveable", (4, 4, 1), 3)
    assert (f"{path}:unsaveable's model cannot be saved, so export/model.keras would fail after training: Object "
            "NeedsConfig was created by passing non-serializable argument values in `__init__()`, and therefore the "
            "object must override `get_config()`") in _one_line_naming(error.value, "model")
    with caplog.at_level(logging.WARNING, logger="tfgpu"):
        create_model(f"{path}:unregistered", (4, 4, 1), 3)
    assert (f"--model: NeedsConfig (from {path}) is not registered with @keras.saving.register_keras_serializable(); "
            "export/model.keras will load only with custom_objects={'NeedsConfig': NeedsConfig}") in caplog.text


def test_a_builder_inside_a_directory_is_found_without_running_it(tmp_path, monkeypatch):
    """``file_inside``: which references would import a file from inside a run directory (a file path, or a module
    sys.path finds there), found without importing anything; a path with a scheme holds no local file."""
    run = tmp_path / "run"
    (run / "pkg").mkdir(parents=True)
    (run / "evil.py").write_text("raise SystemExit('imported')\n")
    (run / "pkg" / "__init__.py").write_text("raise SystemExit('imported')\n")
    outside = tmp_path / "net.py"
    outside.write_text("def build(input_shape, num_classes): pass\n")
    (run / "link.py").symlink_to(outside)  # resolves outside the run directory
    assert user.file_inside(f"{run}/evil.py:build", str(run)) == f"{run}/evil.py"
    assert user.file_inside(f"{run}/../net.py:build", str(run)) == ""
    assert user.file_inside(f"{run}/link.py:build", str(run)) == ""
    assert user.file_inside("os:getcwd", str(run)) == ""
    monkeypatch.syspath_prepend(str(run))  # e.g. `python -m` started inside the run directory
    assert user.file_inside("evil:build", str(run)) == f"{run}/evil.py"
    assert user.file_inside("pkg.sub:build", str(run)) == f"{run}/pkg/__init__.py"
    assert user.file_inside(f"{run}/evil.py:build", "gs://bucket/run") == ""
