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
