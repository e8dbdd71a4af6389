"""tfgpu: multi-GPU and multi-node training of Keras 3 models on TensorFlow.

Importing ``tfgpu`` is cheap: the attributes below load TensorFlow only when first used.

- ``tfgpu.fit(model, x=None, y=None, batch_size=None, epochs=1, ..., *, model_dir=None, **tfgpu_options)``:
  ``keras.Model.fit``'s arguments and meaning on every device of the job (``model.fit(`` -> ``tfgpu.fit(model, ``);
  returns a ``keras.callbacks.History`` (``tfgpu.training.fit``, docs/from-model-fit.md).
- ``tfgpu.ConfigError``: what a bad option or argument raises; ``.flag`` names it.
- ``tfgpu.Preempted``: what ``fit`` raises after a SIGTERM or a Ctrl-C, once the checkpoint is saved
  (``.step``); a Ctrl-C's is also a ``KeyboardInterrupt``.
- ``tfgpu.keras_fit``: stock ``model.fit`` under multi-worker strategies (``tfgpu.training.keras_fit``).
"""

__version__ = "0.1.0"

# attribute -> (module, name in it), or the module itself when the name is None
_LAZY = {
    "fit": ("tfgpu.training.fit", "fit"),
    "ConfigError": ("tfgpu.config", "ConfigError"),
    "Preempted": ("tfgpu.training.failures", "Preempted"),
    "keras_fit": ("tfgpu.training.keras_fit", None),
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        module_name, attribute = _LAZY[name]
        module = importlib.import_module(module_name)
        return module if attribute is None else getattr(module, attribute)
    raise AttributeError(f"module 'tfgpu' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_LAZY))
