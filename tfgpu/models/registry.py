"""Model registry: every network is chosen by name from here.

A builder takes ``(input_shape, num_classes, **kwargs)`` and returns a
``keras.Model`` built under the current dtype policy. ``create_model`` is the
one place that guarantees float32 logits, so builders never mention precision.
"""
import dataclasses
from typing import Callable

import keras

_MODELS: dict[str, "ModelSpec"] = {}


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    name: str
    builder: Callable[..., keras.Model]
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


def _import_families():
    # Importing the family modules runs their @register_model decorators.
    from tfgpu.models import cifar_resnet, small_cnn  # noqa: F401

    for optional in ("resnet", "applications", "gan"):
        try:
            __import__(f"tfgpu.models.{optional}")
        except ModuleNotFoundError as e:
            if e.name != f"tfgpu.models.{optional}":
                raise


def list_models(family: str | None = None) -> list[str]:
    _import_families()
    return sorted(n for n, s in _MODELS.items() if family is None or s.family == family)


def get_spec(name: str) -> ModelSpec:
    _import_families()
    if name not in _MODELS:
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(sorted(_MODELS))}")
    return _MODELS[name]


def create_model(name: str, input_shape, num_classes: int, **kwargs) -> keras.Model:
    """Builds model ``name``; its output is cast to float32 whatever the policy."""
    model = get_spec(name).builder(tuple(input_shape), num_classes, **kwargs)
    if model.outputs[0].dtype != "float32":
        logits = keras.layers.Activation("linear", dtype="float32", name="float32_logits")(model.outputs[0])
        model = keras.Model(model.input, logits, name=model.name)
    return model
