"""tfgpu: multi-GPU and multi-node training of Keras 3 models on TensorFlow.

Importing ``tfgpu`` is cheap: the attributes below load TensorFlow only when first used.
"""

__version__ = "0.1.0"

_LAZY = {"keras_fit": "tfgpu.training.keras_fit"}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return importlib.import_module(_LAZY[name])
    raise AttributeError(f"module 'tfgpu' has no attribute {name!r}")
