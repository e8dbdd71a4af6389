"""A user's own builder, named ``MODULE:FUNCTION`` or ``path/to/file.py:FUNCTION`` (--model, --generator,
--discriminator).

``load`` imports the function once per process and checks that it can be called the way tfgpu calls it;
every problem found there is one ``ConfigError`` naming the flag, raised while the Config is validated, before
TensorFlow builds anything. An exception raised by the user's own code (at import or inside the function) is
theirs to read and propagates with its traceback; only a SyntaxError is shortened to its file and line.

The function is called with ``(input_shape, num_classes)`` and those of tfgpu's keyword arguments it declares
(all of them when it takes ``**kwargs``), so ``def build(input_shape, num_classes)`` works; a true-valued option
it cannot receive (e.g. --sync_batch_norm) is named in a warning. What it returns must be a ``keras.Model``
(``UserBuilder`` checks, since only the call can tell).

A file is imported under a name of its own (``tfgpu_user_<stem>_<hash of its absolute path>``), registered in
``sys.modules`` so Keras and pickling find its classes, with its directory on ``sys.path`` while it executes so
it can import the files beside it. ``tfgpu.models.provenance`` records what was imported (module, file, sha256) in
``<model_dir>/model_source.json``.
"""
import dataclasses
import hashlib
import importlib
import importlib.util
import inspect
import logging
import os
import sys
import types

from tfgpu.config import ConfigError
from tfgpu.runtime import run_dir

log = logging.getLogger("tfgpu")

FLAGS = ("model", "generator", "discriminator")
SOURCE_FILE = run_dir.MODEL_SOURCE_FILE
_FORM = "expected MODULE:FUNCTION or path/to/file.py:FUNCTION"
_LOADED: dict[tuple[str, str], "UserBuilder"] = {}


def is_reference(name: str) -> bool:
    """Whether ``name`` has the form of a user builder (a registered name is looked up before this is asked)."""
    return ":" in name


def file_inside(reference: str, directory: str) -> str:
    """The file ``reference`` (``path/to/file.py:FUNCTION`` or ``MODULE:FUNCTION``, the module found without
    running it) would import when it lies inside the local ``directory`` (a run directory, whose names are not to
    be run as code: whoever can write it could have put that file there); "" otherwise."""
    target = reference.rpartition(":")[0]
    if not target or "://" in directory:
        return ""
    if target.endswith(".py"):
        path = os.path.abspath(target)
    else:
        try:
            spec = importlib.util.find_spec(target.split(".")[0])  # a top-level spec: found, not executed
        except (ImportError, ValueError):
            return ""
        locations = list(spec.submodule_search_locations or []) if spec else []
        path = (spec.origin if spec and spec.origin not in (None, "built-in", "frozen") else "") or \
            (locations[0] if locations else "")
    if not path:
        return ""
    real, root = os.path.realpath(path), os.path.realpath(directory)
    return path if os.path.commonpath([real, root]) == root else ""


def absolute(reference: str) -> str:
    """``reference`` with a relative ``file.py`` made absolute against the current directory, so a saved config
    names the same file from anywhere; module references and anything else come back unchanged."""
    target, sep, function = reference.rpartition(":")
    if sep and target.endswith(".py") and not os.path.isabs(target):
        return f"{os.path.abspath(target)}:{function}"
    return reference


@dataclasses.dataclass
class UserBuilder:
    """The user's function, called as a registry builder: only the keyword arguments it declares, and the result
    checked to be a ``keras.Model`` (``ConfigError(flag)`` otherwise)."""
    reference: str
    flag: str
    function: types.FunctionType
    module: types.ModuleType
    file: str  # absolute path of the module's source, "" when it has none

    def __call__(self, input_shape, num_classes, **kwargs):
        import keras

        accepted, dropped = self.split_kwargs(kwargs)
        for name in dropped:
            if kwargs[name]:
                log.warning("--%s: %s does not take %s, so --%s=%s has no effect on its model (add **kwargs or a "
                            "%s parameter to receive it)", self.flag, self.reference, name, name, kwargs[name], name)
        model = self.function(tuple(input_shape), num_classes, **accepted)
        if not isinstance(model, keras.Model):
            raise ConfigError(self.flag, f"{self.reference} returned {_describe(model)}, not a keras.Model")
        if self.flag != "discriminator":  # the exported network: refuse now what would fail after training
            self.check_saveable(model)
        return model

    def check_saveable(self, model) -> None:
        """``ConfigError`` when Keras cannot serialize ``model`` (a custom layer or model whose constructor
        arguments need a ``get_config``), so export would fail only after training; a warning for each class of the
        user's module that is not registered, since the .keras file then loads only with ``custom_objects``."""
        import keras

        try:
            keras.saving.serialize_keras_object(model)
        except Exception as e:  # Keras raises NotImplementedError or TypeError, in several lines
            lines = str(e).strip().split("\n\n")[0].split()
            raise ConfigError(self.flag, f"{self.reference}'s model cannot be saved, so export/model.keras would "
                              f"fail after training: {' '.join(lines) or type(e).__name__}") from None
        classes = {type(layer) for layer in model._flatten_layers(include_self=True)}
        for cls in sorted((c for c in classes if c.__module__ == self.module.__name__), key=lambda c: c.__name__):
            if keras.saving.get_registered_object(keras.saving.get_registered_name(cls)) is None:
                log.warning("--%s: %s (from %s) is not registered with @keras.saving.register_keras_serializable(); "
                            "export/model.keras will load only with custom_objects={'%s': %s}", self.flag,
                            cls.__name__, self.file or self.module.__name__, cls.__name__, cls.__name__)

    def split_kwargs(self, kwargs: dict) -> tuple[dict, list]:
        """(the keyword arguments the function declares, the names of those it does not)."""
        parameters = inspect.signature(self.function).parameters.values()
        if any(p.kind is p.VAR_KEYWORD for p in parameters):
            return dict(kwargs), []
        names = {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        return {k: v for k, v in kwargs.items() if k in names}, [k for k in kwargs if k not in names]


def _describe(value) -> str:
    kind = type(value)
    name = kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    return "None" if value is None else f"{'an' if name[0].lower() in 'aeiou' else 'a'} {name}"


def load(reference: str, flag: str = "model") -> UserBuilder:
    """The builder ``reference`` names, imported once per process; ``ConfigError(flag)`` for a malformed
    reference, a module that does not import, a missing file, a missing or non-callable function, or a
    function that cannot take ``(input_shape, num_classes)``."""
    key = (absolute(reference), flag)
    if key not in _LOADED:
        _LOADED[key] = _load(reference, flag)
    return _LOADED[key]


def _load(reference: str, flag: str) -> UserBuilder:
    target, _, function_name = reference.rpartition(":")
    if not target or not function_name:
        raise ConfigError(flag, f"{_FORM}, got {reference!r}")
    if target.endswith(".py"):
        module, file = _import_file(target, flag)
        where = target
    else:
        module = _import_module(target, flag)
        file = os.path.abspath(module.__file__) if getattr(module, "__file__", None) else ""
        where = f"module {target}"
    if not hasattr(module, function_name):
        found = _functions_of(module)
        listing = f"; it defines {', '.join(found)}" if found else "; it defines no functions"
        raise ConfigError(flag, f"{where} has no function {function_name!r}{listing}")
    function = getattr(module, function_name)
    if not callable(function):
        raise ConfigError(flag, f"{target}:{function_name} is {_describe(function)}, not a function")
    _check_signature(reference, flag, function)
    return UserBuilder(reference, flag, function, module, file)


def _import_module(name: str, flag: str) -> types.ModuleType:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name and (name == e.name or name.startswith(e.name + ".")):
            raise ConfigError(flag, f"cannot import module {name}: {e} (run from the directory that holds it, add "
                              "that directory to PYTHONPATH, or give path/to/file.py:FUNCTION)") from None
        raise ConfigError(flag, f"cannot import module {name}: {e} (an import inside it failed)") from None
    except ImportError as e:
        raise ConfigError(flag, f"cannot import module {name}: {e}") from None
    except SyntaxError as e:
        raise ConfigError(flag, f"cannot import module {name}: {_syntax(e)}") from None


def _import_file(path: str, flag: str) -> tuple[types.ModuleType, str]:
    path = os.path.abspath(path)
    if not os.path.isfile(path):
        raise ConfigError(flag, f"file {path!r} does not exist")
    stem = "".join(c if c.isalnum() else "_" for c in os.path.splitext(os.path.basename(path))[0])
    name = f"tfgpu_user_{stem}_{hashlib.sha1(path.encode()).hexdigest()[:8]}"
    if name in sys.modules:
        return sys.modules[name], path
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before it runs: dataclasses, pickling and Keras look classes up by module
    directory = os.path.dirname(path)
    sys.path.insert(0, directory)
    try:
        spec.loader.exec_module(module)
    except ImportError as e:
        del sys.modules[name]
        raise ConfigError(flag, f"cannot import {path}: {e}") from None
    except SyntaxError as e:
        del sys.modules[name]
        raise ConfigError(flag, f"cannot import {path}: {_syntax(e)}") from None
    except BaseException:
        del sys.modules[name]
        raise
    finally:
        sys.path.remove(directory)
    return module, path


def _syntax(e: SyntaxError) -> str:
    return f"{e.msg} ({os.path.basename(e.filename or '?')}, line {e.lineno})"


def _functions_of(module) -> list:
    """The public callables defined in ``module`` itself (not those it imported)."""
    return sorted(name for name, value in vars(module).items()
                  if not name.startswith("_") and inspect.isfunction(value)
                  and value.__module__ == module.__name__)


def _check_signature(reference: str, flag: str, function) -> None:
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return  # a builtin or C callable: the call will tell
    try:
        signature.bind((32, 32, 3), 10)
    except TypeError:
        raise ConfigError(flag, f"{reference} must take (input_shape, num_classes, **kwargs); its signature is "
                          f"{signature}") from None


def build_gan_network(flag: str, reference: str, image_shape, num_classes: int, latent_dim: int, conditional: bool,
                      **kwargs):
    """The user's --generator or --discriminator, called like the GAN builders (``(image_shape, num_classes,
    latent_dim=, conditional=, sync_batch_norm=)``, only the keywords it declares) and checked against what the
    GAN task feeds it: a generator maps a (batch, latent_dim) latent, and a (batch,) int32 label when
    conditional, to images of ``image_shape``; a discriminator maps images (and labels) to one logit per example,
    (batch,) or (batch, 1). The result is a functional model with float32 outputs (a subclassed model is called
    on ``keras.Input``s and wrapped); a mismatch is ``ConfigError(flag)``."""
    import keras

    image_shape = tuple(int(d) for d in image_shape)
    model = load(reference, flag)(image_shape, num_classes, latent_dim=latent_dim, conditional=conditional, **kwargs)
    if flag == "generator":
        first, what = keras.Input((latent_dim,), name="latent"), f"a (batch, {latent_dim}) latent"
    else:
        first, what = keras.Input(image_shape, name="image"), f"(batch, {', '.join(map(str, image_shape))}) images"
    inputs = [first, keras.Input((), dtype="int32", name="label")] if conditional else first
    if conditional:
        what += " and (batch,) int32 labels as a list [x, labels]"
    try:
        output = model(inputs)
    except Exception as e:  # a model built for other inputs: say which inputs tfgpu feeds
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ConfigError(flag, f"{reference}'s model does not take {what}: {reason}") from None
    if isinstance(output, (list, tuple)):
        raise ConfigError(flag, f"{reference}'s model gives {len(output)} outputs; it must give one")
    shape = tuple(output.shape)
    wanted = ((None,) + image_shape,) if flag == "generator" else ((None,), (None, 1))
    if shape not in wanted:
        expected = (f"images of shape (batch, {', '.join(map(str, image_shape))})" if flag == "generator"
                    else "one logit per example, shape (batch,) or (batch, 1)")
        raise ConfigError(flag, f"{reference}'s model gives outputs of shape {shape}; it must give {expected}")
    if output.dtype != "float32":
        output = keras.layers.Activation("linear", dtype="float32", name=f"{flag}_float32")(output)
    elif getattr(model, "outputs", None):
        return model
    return keras.Model(inputs, output, name=model.name)
