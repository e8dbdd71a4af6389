"""Model registry: every network is chosen by name from here.

A builder takes ``(input_shape, num_classes)`` and the run's options its family declares
(``tfgpu.models.registration``: what a builder is) and returns a ``keras.Model`` built under the current
dtype policy. ``create_model`` is the
one place that guarantees float32 outputs, so builders never mention precision
(logits; a user's model that ends in a softmax is read by ``tfgpu.models.heads``).

A name that is not registered but has the form ``MODULE:FUNCTION`` or
``path/to/file.py:FUNCTION`` is the user's own builder (``tfgpu.models.user``):
``get_spec`` imports it as a classifier. Registered names always win, even one
that contains a colon.
"""
import functools
import importlib
import logging
import os
import pkgutil

import keras

# register_model: re-exported as tfgpu.models' API (tfgpu.models.__all__)
from tfgpu.models.registration import _MODELS, MODEL_OPTIONS, ModelSpec, register_model  # noqa: F401

log = logging.getLogger("tfgpu")
_WARNED: set = set()


@functools.cache
def _import_families():
    """Imports every module of ``tfgpu.models`` and its subpackages once, which runs their ``@register_model``
    decorators (``tfgpu.models.registration``): a family registers by being a module here, listed nowhere else."""
    for module in pkgutil.walk_packages([os.path.dirname(__file__)], "tfgpu.models."):
        importlib.import_module(module.name)


def list_models(family: str | None = None) -> list[str]:
    _import_families()
    return sorted(n for n, s in _MODELS.items() if family is None or s.family == family)


def is_registered(name: str) -> bool:
    _import_families()
    return name in _MODELS


def get_spec(name: str) -> ModelSpec:
    """The registered model ``name``, else the user's builder it names (``MODULE:FUNCTION`` or
    ``file.py:FUNCTION``, a ``ConfigError(model)`` when it cannot be imported), else a ValueError listing the
    known names."""
    _import_families()
    if name in _MODELS:
        return _MODELS[name]
    from tfgpu.models import user

    if user.is_reference(name):
        return ModelSpec(name, user.load(name, "model"), "classifier", None, MODEL_OPTIONS)  # it picks its own
    raise ValueError(f"unknown model {name!r}; known models: {', '.join(sorted(_MODELS))}; or your own builder as "
                     "MODULE:FUNCTION or path/to/file.py:FUNCTION")


def model_options(config) -> dict:
    """The run's model options (``MODEL_OPTIONS``) from a Config: what ``create_model`` hands on to the builders
    that declare them."""
    return {option: getattr(config, option) for option in MODEL_OPTIONS}


def options_for(spec: ModelSpec, options: dict) -> dict:
    """The ``options`` ``spec``'s builder declares; each true-valued one it does not take is a warning naming its
    flag (once per model and option in a process)."""
    for option, value in options.items():
        if option not in spec.options and value and (spec.name, option) not in _WARNED:
            _WARNED.add((spec.name, option))
            log.warning("--%s: model %s does not take it, so --%s=%s has no effect on it", option, spec.name,
                        option, value)
    return {option: value for option, value in options.items() if option in spec.options}


def create_model(name: str, input_shape, num_classes: int, output: tuple | None = None, **options) -> keras.Model:
    """Builds model ``name`` with the ``options`` (``MODEL_OPTIONS``: ``model_options(config)``) its family takes;
    its output is cast to float32 whatever the policy. ``output``: what the task needs the model to give
    (``Task.model_output``: shape after the batch dimension, the requirement as a phrase; default one logit per
    class), or a function giving it, called once the model is built (a ``tfgpu.fit`` builder's ``compile()`` is
    read as it builds); a model that gives another shape is ``ConfigError(model)``."""
    spec = get_spec(name)
    model = float32_outputs(spec.builder(tuple(input_shape), num_classes, **options_for(spec, options)),
                            input_shape)
    output = output() if callable(output) else output
    shape_needed, requirement = output or ((num_classes,), f"a classifier of {num_classes} classes must give "
                                                           f"logits of shape (batch, {num_classes})")
    shape = tuple(model.outputs[0].shape)
    if shape[1:] != tuple(shape_needed):
        from tfgpu.config import ConfigError

        raise ConfigError("model", f"{name} gives outputs of shape {shape}; {requirement}")
    return model


def float32_outputs(model: keras.Model, input_shape=None) -> keras.Model:
    """``model`` as a functional model whose first output is float32: unchanged when it already is one, else a
    functional model around it that casts the output.

    A subclassed model (one without symbolic ``outputs``) is called on a ``keras.Input`` of ``input_shape`` and
    wrapped, which builds its weights (so its parameters can be counted) and gives the output its dtype."""
    if getattr(model, "outputs", None):  # functional or Sequential (whose ``input`` is undefined, ``inputs`` not)
        inputs, output = model.inputs[0] if len(model.inputs) == 1 else model.inputs, model.outputs[0]
    else:
        inputs = keras.Input(tuple(input_shape))
        output = model(inputs)
        if isinstance(output, (list, tuple)):
            output = output[0]
        if output.dtype == "float32":
            return keras.Model(inputs, output, name=model.name)
    if output.dtype == "float32":
        return model
    logits = keras.layers.Activation("linear", dtype="float32", name="float32_logits")(output)
    return keras.Model(inputs, logits, name=model.name)
