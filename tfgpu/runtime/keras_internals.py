"""The one door to Keras' internals (``keras.src``): which ones tfgpu reads, and the Keras releases it was tested on.

``tfgpu.fit`` packs arrays with Keras' own adapters and reduces logs as Keras' trainer does, ``import tfgpu`` makes
Keras' variables read as numbers under a strategy, ``training.keras_adapter`` and ``runtime.replica_batches`` patch
Keras' TensorFlow trainer: all of it through ``internal(name)`` (``INTERNALS``: every ``keras.src`` module tfgpu
imports). The first call checks the installed Keras once against ``SUPPORTED`` (the range the fit tests passed on:
``tests/runtime/test_keras_internals.py``'s slow test installs its two ends; setup.cfg's ``keras`` pin is the same
range). Outside it tfgpu stops in one line naming the installed and the supported releases: ``KerasUnsupported`` is a
``ConfigError`` to a caller that catches it and a ``SystemExit`` (its message, exit 1, no traceback) to a script
that does not. Measured: Keras 3.10.0 and 3.11.3 lack ``TensorFlowTrainer._autoconvert_optionals``, which the
multi-worker patch relies on.
"""
import importlib
import re

from tfgpu.config import ConfigError

# [lowest tested, first untested). Measured 2026-12-07 with each release beside TensorFlow 2.21 (pip install --no-deps
# --target DIR keras==X; PYTHONPATH=DIR:. python -m pytest -m "not slow" tests/training/fit/
# tests/training/test_keras_adapter.py): 3.12.4, 3.13.2, 3.14.1, 3.15.1 all passed (97 each); 3.10.0 and 3.11.3 fail the
# multi-worker patch's check (no TensorFlowTrainer._autoconvert_optionals; other _make_function source).
SUPPORTED = ((3, 12, 4), (3, 16))
# name -> the keras.src module, and what tfgpu reads from it
INTERNALS = {
    "tree": ("keras.src.tree", "map_structure/flatten over Keras' data structures (training/fit/arrays.py)"),
    "array_slicing": ("keras.src.trainers.data_adapters.array_slicing",
                      "convert_to_sliceable, train_validation_split (training/fit/arrays.py, run.py)"),
    "data_adapter_utils": ("keras.src.trainers.data_adapters.data_adapter_utils",
                           "unpack_x_y_sample_weight (training/fit/run.py)"),
    "data_adapters": ("keras.src.trainers.data_adapters", "get_data_adapter (training/fit/inputs.py)"),
    "array_data_adapter": ("keras.src.trainers.data_adapters.array_data_adapter",
                           "can_convert_arrays, ArrayDataAdapter (training/fit/inputs.py)"),
    "tensorflow_trainer": ("keras.src.backend.tensorflow.trainer",
                           "TensorFlowTrainer, reduce_per_replica (training/fit/steps.py, training/keras_adapter.py, "
                           "runtime/replica_batches.py)"),
    "tensorflow_core": ("keras.src.backend.tensorflow.core", "Variable (runtime/keras_variables.py)"),
    "python_utils": ("keras.src.utils.python_utils", "pythonify_logs (training/fit/epochs.py)"),
    "utils": ("keras.src.utils", "is_default (training/fit/callbacks.py)"),
}
_CHECKED = []  # the installed version once it passed


class KerasUnsupported(ConfigError, SystemExit):
    """The installed Keras is outside ``SUPPORTED``: one line, as a ConfigError or, uncaught, as the process's exit."""

    def __init__(self, installed: str):
        ConfigError.__init__(self, "keras", f"Keras {installed} is installed; tfgpu supports Keras {supported()} "
                             f"(pip install '{requirement()}')")
        self.code = f"tfgpu: {self}"


def version_tuple(version: str) -> tuple:
    """(3, 15, 1) of '3.15.1' (of '3.16.0.dev2026' too: its numeric parts up to the first that is not)."""
    parts = []
    for part in version.split(".")[:3]:
        digits = re.match(r"\d*", part).group()
        if not digits:
            break
        parts.append(int(digits))
        if digits != part:  # 0rc1: a pre-release of 3.13.0
            break
    return tuple(parts)


def _dotted(version) -> str:
    return ".".join(map(str, version))


def supported() -> str:
    low, high = SUPPORTED
    return f"{_dotted(low)} up to (not including) {_dotted(high)}"


def requirement() -> str:
    """The pip requirement of the supported range (setup.cfg's pin)."""
    low, high = SUPPORTED
    return f"keras>={_dotted(low)},<{_dotted(high)}"


def is_supported(version: str) -> bool:
    low, high = SUPPORTED
    return low <= version_tuple(version) < high


def check() -> str:
    """The installed Keras' version once it is in ``SUPPORTED`` (checked once a process); else KerasUnsupported."""
    import keras

    if keras.__version__ not in _CHECKED:
        if not is_supported(keras.__version__):
            raise KerasUnsupported(keras.__version__)
        _CHECKED.append(keras.__version__)
    return keras.__version__


def internal(name: str):
    """The ``keras.src`` module ``INTERNALS[name]`` names, after the version check."""
    check()
    return importlib.import_module(INTERNALS[name][0])


def tensorflow_trainer():
    """Keras' ``TensorFlowTrainer`` (the class every Keras model trains with on TensorFlow)."""
    return internal("tensorflow_trainer").TensorFlowTrainer
