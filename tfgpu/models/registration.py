"""The table model families register their builders in, by name.

A family module imports only this (``register_model``), and ``tfgpu.models.registry`` imports the families before
it looks a name up, so the table is full then and no module imports back the one that imports it.
"""
import dataclasses
from typing import Callable

_MODELS: dict[str, "ModelSpec"] = {}


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    name: str
    builder: Callable  # (input_shape, num_classes, **kwargs) -> keras.Model
    family: str  # "classifier" or "gan"; tasks check it.
    default_image_size: int | None


def register_model(name: str, family: str = "classifier", default_image_size: int | None = None):
    """Registers ``builder`` under ``name``; duplicate names are an error."""

    def decorator(builder):
        if name in _MODELS:
            raise ValueError(f"model {name!r} is registered twice ({_MODELS[name].builder.__module__} and {builder.__module__})")
        _MODELS[name] = ModelSpec(name, builder, family, default_image_size)
        return builder

    return decorator
