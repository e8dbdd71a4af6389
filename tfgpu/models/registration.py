"""The table model families register their builders in, by name.

A family module imports only this (``register_model``), and ``tfgpu.models.registry`` imports the families before
it looks a name up, so the table is full then and no module imports back the one that imports it.

What a builder is, for a model author:

- ``builder(input_shape, num_classes, **options) -> keras.Model``, decorated with ``@register_model("name")``; it
  builds a new model each call, with no precision or strategy code (it is called inside the strategy's scope,
  under the run's dtype policy; ``registry.create_model`` casts the output to float32).
- A classifier's output is ``(batch, num_classes)`` logits (no softmax; one that ends in a softmax is trained on
  the logits under it, ``tfgpu.models.heads``). The head's layer name is free: nothing looks a layer up by name.
- ``options``: the run's options the builder takes as keyword arguments, among ``MODEL_OPTIONS`` (e.g. a ResNet
  takes ``("sync_batch_norm", "zero_init_residual")``). It is handed those and no others, so a builder without
  BatchNorm or residual blocks declares none and takes none; a run that sets one the model does not take is told
  so in a warning naming the flag.
"""
import dataclasses
from typing import Callable

_MODELS: dict[str, "ModelSpec"] = {}

# The run's options (Config fields of these names) a model builder may declare it takes.
MODEL_OPTIONS = ("sync_batch_norm", "zero_init_residual")


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    name: str
    builder: Callable  # (input_shape, num_classes, **options) -> keras.Model
    family: str  # "classifier" or "gan"; tasks check it.
    default_image_size: int | None
    options: tuple = ()  # the MODEL_OPTIONS the builder takes (all of them for a user's builder, which picks its own)


def register_model(name: str, family: str = "classifier", default_image_size: int | None = None,
                   options: tuple = ()):
    """Registers ``builder`` under ``name``, handed the ``options`` (of ``MODEL_OPTIONS``) it declares; duplicate
    names and options that are no model option are errors."""
    unknown = [option for option in options if option not in MODEL_OPTIONS]
    if unknown:
        raise ValueError(f"model {name!r} declares {', '.join(unknown)}, which are not model options "
                         f"({', '.join(MODEL_OPTIONS)})")

    def decorator(builder):
        if name in _MODELS:
            raise ValueError(f"model {name!r} is registered twice ({_MODELS[name].builder.__module__} and "
                             f"{builder.__module__})")
        _MODELS[name] = ModelSpec(name, builder, family, default_image_size, tuple(options))
        return builder

    return decorator
