"""The table model families register into (tfgpu.models.registration); looking names up is tests/models/
test_registry.py."""
import pytest

from tfgpu.models import registration


def test_registering_a_taken_name_raises_naming_both_builders_and_keeps_the_first(monkeypatch):
    monkeypatch.setattr(registration, "_MODELS", {})

    def first(input_shape, num_classes):
        return None

    def second(input_shape, num_classes):
        return None

    registration.register_model("twice", default_image_size=8)(first)
    with pytest.raises(ValueError, match=f"model 'twice' is registered twice \\({__name__} and {__name__}\\)"):
        registration.register_model("twice")(second)
    assert registration._MODELS["twice"] == registration.ModelSpec("twice", first, "classifier", 8)


def _registered_families():
    from tfgpu.models import registry

    registry._import_families()
    return [spec for spec in registration._MODELS.values() if spec.builder.__module__.startswith("tfgpu.models")]


def test_every_family_declares_exactly_the_model_options_its_builder_takes():
    """A declared option the builder lacks would be a TypeError at build; one it takes undeclared would never reach
    it. Every model option is a flag of the run."""
    import dataclasses
    import inspect

    from tfgpu.config import Config

    assert set(registration.MODEL_OPTIONS) <= {f.name for f in dataclasses.fields(Config)}
    for spec in _registered_families():
        taken = set(inspect.signature(spec.builder).parameters) & set(registration.MODEL_OPTIONS)
        assert taken == set(spec.options), spec.name


def test_a_builder_that_declares_no_options_gets_none_and_a_true_one_is_a_warning(monkeypatch, caplog):
    """A family without BatchNorm or residual blocks (a ViT, an MLP) takes no CNN arguments."""
    import logging

    import keras

    from tfgpu.models import registry

    def mlp(input_shape, num_classes):
        inputs = keras.Input(input_shape)
        return keras.Model(inputs, keras.layers.Dense(num_classes)(keras.layers.Flatten()(inputs)))

    monkeypatch.setattr(registry, "_WARNED", set())
    registration.register_model("test_plain_mlp")(mlp)
    try:
        with caplog.at_level(logging.WARNING, logger="tfgpu"):
            model = registry.create_model("test_plain_mlp", (4, 4, 1), 3, sync_batch_norm=True,
                                          zero_init_residual=False)
        assert model.output.shape == (None, 3)
        assert caplog.messages == ["--sync_batch_norm: model test_plain_mlp does not take it, so "
                                   "--sync_batch_norm=True has no effect on it"]
    finally:
        del registration._MODELS["test_plain_mlp"]


def test_declaring_an_option_that_is_no_model_option_is_refused():
    with pytest.raises(ValueError, match="model 'vit' declares dropout, which are not model options"):
        registration.register_model("vit", options=("dropout",))
