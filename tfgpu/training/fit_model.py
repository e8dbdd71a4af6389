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
    back. Construct it before TensorFlow's runtime may restart (``tfgpu.fit`` does so first)."""

    def __init__(self, model, argument: str = "model"):
        import keras

        self.user_model, self.argument = model, argument
        if not model.built or not model.weights:
            raise ConfigError(argument, f"{model.name} is not built (it has no weights yet); give its input shape, "
                              "e.g. keras.Input((28, 28, 1)) first, or call it on a batch once")
        self.weights = [w.numpy() if hasattr(w, "numpy") else w for w in model.get_weights()]
        self.is_functional = isinstance(model, keras.Sequential) or type(model).__name__ == "Functional"
        if not self.is_functional:
            try:
                config = model.get_config()
                type(model).from_config(config)
            except Exception as e:
                raise ConfigError(argument, f"{type(model).__name__} is a subclassed model that cannot be rebuilt "
                                  f"from its config ({type(e).__name__}: {str(e).splitlines()[0][:120]}); "
                                  f"{_PASS_BUILDER}") from None
        self.built_model = None

    def build(self):
        """The same model, built in the current (strategy) scope with the user's weights."""
        import keras

        try:
            model = keras.models.clone_model(self.user_model)
            if not model.built:
                model.build(self.user_model.input_shape)
            model.set_weights(self.weights)
        except Exception as e:
            raise ConfigError(self.argument, f"could not be built again inside the strategy scope "
                              f"({type(e).__name__}: {str(e).splitlines()[0][:160]}); {_PASS_BUILDER}") from None
        self.built_model = model
        return model

    def copy_back(self, optimizer=None) -> None:
        """The trained weights (and ``optimizer``'s state, into the user's compiled optimizer) into the user's
        model."""
        model = self.user_model
        model.set_weights([w.numpy() if hasattr(w, "numpy") else w for w in self.built_model.get_weights()])
        copy_optimizer_state(optimizer, getattr(model, "optimizer", None), model)


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
