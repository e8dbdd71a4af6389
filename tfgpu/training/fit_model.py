"""The model ``tfgpu.fit`` is given: a compiled (or not) ``keras.Model`` object, or a builder function.

A model object was built outside any strategy scope, so its variables cannot train under one. ``Rebuild`` keeps
what it needs while the caller's TensorFlow runtime is still the one the model lives in (its config, its weights
as numpy, its compile() as ``fit_compile.Compiled``), builds the same model again inside the run's strategy scope
(``keras.models.clone_model``: functional and Sequential models from their config, subclassed ones through
``from_config``), and once trained copies the weights, and the optimizer's state where Keras keeps it, back into
the user's object, so ``model.evaluate``/``predict``/``save`` afterwards behave as after ``model.fit``. A builder
function is called inside the scope as before, with no arguments or as the command line's
``build(input_shape, num_classes, **kwargs)``.
"""
import inspect
import logging

import numpy as np

from tfgpu.config import ConfigError

log = logging.getLogger("tfgpu")

_PASS_BUILDER = ("pass a function that builds and compiles it instead: tfgpu.fit(build_model, ...), where "
                 "build_model() returns the model")


def takes_shape(builder) -> bool:
    """Whether ``builder`` is the command line's ``build(input_shape, num_classes, **kwargs)`` (two or more
    parameters without defaults), not ``build()``."""
    try:
        parameters = inspect.signature(builder).parameters.values()
    except (TypeError, ValueError):
        return False
    required = [p for p in parameters if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY,
                                                                              p.POSITIONAL_OR_KEYWORD)]
    return len(required) >= 2


def call_builder(builder, input_shape, num_classes: int):
    """``builder()`` or ``builder(input_shape, num_classes)``, as its signature asks."""
    if takes_shape(builder):
        return builder(tuple(input_shape), num_classes)
    return builder()


class Rebuild:
    """A user's model object, kept so that it can be built again inside a strategy scope and trained weights copied
    back. Construct it before TensorFlow's runtime may restart (``tfgpu.fit`` does so first): after a restart the
    user's variables cannot be read, so its config (serialized) and weights (numpy) are taken now."""

    def __init__(self, model, argument: str = "model"):
        import keras

        self.user_model, self.argument = model, argument
        if not model.built or not model.weights:
            raise ConfigError(argument, f"{model.name} is not built (it has no weights yet); give its input shape, "
                              "e.g. keras.Input((28, 28, 1)) first, or call it on a batch once")
        self.weights = [np.asarray(w) for w in model.get_weights()]
        try:
            self.serialized = keras.saving.serialize_keras_object(model)
            self.serialized.pop("compile_config", None)  # compile() is read by fit_compile; the optimizer rebuilt
            _follow_the_run_policy(self.serialized, keras.mixed_precision.global_policy().name)
            functional = isinstance(model, keras.Sequential) or type(model).__name__ == "Functional"
            if not functional:  # a subclassed model: found out now whether its config rebuilds it
                keras.saving.deserialize_keras_object(self.serialized)
        except Exception as e:
            raise ConfigError(argument, f"{type(model).__name__} is a subclassed model that cannot be rebuilt "
                              f"from its config ({type(e).__name__}: {str(e).splitlines()[0][:120]}); "
                              f"{_PASS_BUILDER}") from None
        self.built_model = None

    def build(self):
        """The same model, built in the current (strategy) scope with the user's weights."""
        import keras

        try:
            model = keras.saving.deserialize_keras_object(self.serialized)
            model.set_weights(self.weights)
        except Exception as e:
            raise ConfigError(self.argument, f"could not be built again inside the strategy scope "
                              f"({type(e).__name__}: {str(e).splitlines()[0][:160]}); {_PASS_BUILDER}") from None
        if self.built_model is None:  # the model trained (the export may build a float32 twin afterwards)
            self.built_model = model
        return model

    def copy_back(self, optimizer=None, restarted: bool = False) -> None:
        """The trained weights (and ``optimizer``'s state, into the user's compiled optimizer) into the user's
        model. ``restarted``: TensorFlow's runtime restarted since the model was made, so its variables are
        re-created in the running one with the trained values (its metrics' state starts again at zero)."""
        model = self.user_model
        trained = [np.asarray(w) for w in self.built_model.get_weights()]
        if not restarted:
            model.set_weights(trained)
            copy_optimizer_state(optimizer, getattr(model, "optimizer", None), model)
            return
        values = {id(v): value for v, value in zip(model.weights, trained)}
        seen = set()
        for variable in [*model.variables, *getattr(model, "metrics_variables", [])]:
            if id(variable) not in seen:
                seen.add(id(variable))
                _recreate(variable, values.get(id(variable)))
        target = getattr(model, "optimizer", None)
        if target is not None:
            import keras

            inner = target.inner_optimizer if isinstance(target, keras.optimizers.LossScaleOptimizer) else target
            for variable in inner.variables:
                _recreate(variable, None)
            for variable in getattr(target, "variables", []):
                if id(variable) not in {id(v) for v in inner.variables}:
                    _recreate(variable, None)
            copy_optimizer_state(optimizer, target, model)
        for name in ("train_function", "test_function", "predict_function"):
            if hasattr(model, name):
                setattr(model, name, None)


def _follow_the_run_policy(config, default_policy: str) -> None:
    """Drops from a serialized model the dtype policies that are merely the one that was global when it was built,
    so its layers take the run's policy (``precision=``) when rebuilt; a policy a layer was given stays."""
    if isinstance(config, dict):
        dtype = config.get("dtype")
        if isinstance(dtype, dict) and dtype.get("class_name") == "DTypePolicy" and \
                (dtype.get("config") or {}).get("name") == default_policy:
            config["dtype"] = None
        for value in config.values():
            _follow_the_run_policy(value, default_policy)
    elif isinstance(config, list):
        for value in config:
            _follow_the_run_policy(value, default_policy)


def _recreate(variable, value) -> None:
    """Gives a Keras variable made in a runtime that has since restarted a new TensorFlow variable in the running
    one, holding ``value`` (None: zeros; an optimizer's iteration count and rate are copied after)."""
    import tensorflow as tf

    if value is None:
        value = np.zeros(tuple(variable.shape), dtype=variable.dtype)
    with tf.init_scope():
        variable._initialize(np.asarray(value))


def copy_optimizer_state(trained, target, model) -> bool:
    """Copies ``trained``'s variables (iterations, learning rate, moments, EMA) into ``target`` (the user's
    compiled optimizer), built over ``model``'s trainable variables first; False (and one log line) when they do
    not line up."""
    import keras

    if trained is None or target is None:
        return False
    if isinstance(target, keras.optimizers.LossScaleOptimizer):
        target = target.inner_optimizer
    if not target.built:
        target.build(model.trainable_variables)
    source, destination = list(trained.variables), list(target.variables)
    if len(source) != len(destination) or any(tuple(s.shape) != tuple(d.shape) for s, d in zip(source, destination)):
        log.info("the optimizer's state was not copied back into model.optimizer (its variables differ: %d vs %d)",
                 len(source), len(destination))
        return False
    for s, d in zip(source, destination):
        d.assign(s.numpy())
    return True
