"""tfgpu: multi-GPU and multi-node training of Keras 3 models on TensorFlow.

``import tfgpu`` first in a script: when the process is one of several workers (``tfgpu.launch``, TF_CONFIG, Slurm)
or sees several GPUs, it makes the job's strategy the process default, so the script's models, optimizers and
Datasets live in it (``tfgpu.runtime.job_strategy``). Elsewhere (one device, a laptop) importing is cheap: the
attributes below load TensorFlow only when first used.

- ``tfgpu.fit(model, x=None, y=None, batch_size=None, epochs=1, ..., model_dir=None, ...)``: ``model.fit`` on every
  device of the job, the model's own ``train_step`` in tfgpu's loop (``model.fit(`` -> ``tfgpu.fit(model, ``);
  returns the ``keras.callbacks.History`` (``tfgpu.training.fit``, docs/from-model-fit.md).
- ``tfgpu.data.load(data_dir, split="train", batch_size=32)``: a directory ``python -m tfgpu.convert`` wrote, as a
  ``tf.data.Dataset`` of ``(images, labels)`` batches (uint8 images as stored) for ``model.fit`` or ``tfgpu.fit``,
  which reads it by index: every example once per epoch on any topology, exact resume (``tfgpu.data.input.loader``).
- ``tfgpu.ConfigError``: what a bad option or argument raises; ``.flag`` names it.
- ``tfgpu.Preempted``: what ``fit`` raises after a SIGTERM or a Ctrl-C, once the checkpoint is saved
  (``.step``); a Ctrl-C's is also a ``KeyboardInterrupt``.
- ``tfgpu.keras_fit``: stock ``model.fit`` under multi-worker strategies (``tfgpu.training.keras_fit``), for code
  that keeps ``model.fit``: no exact resume, no stop at the step in flight.
"""

__version__ = "0.1.0"

# attribute -> (module, name in it), or the module itself when the name is None
_LAZY = {
    "fit": ("tfgpu.training.fit", "fit"),
    "ConfigError": ("tfgpu.config", "ConfigError"),
    "Preempted": ("tfgpu.runtime.failures", "Preempted"),
    "keras_fit": ("tfgpu.training.keras_fit", None),
    "data": ("tfgpu.data", None),
}


def _make_job_strategy():
    from tfgpu.runtime import job_strategy

    strategy = job_strategy.at_import()
    if strategy is not None:  # the script's own model.evaluate/predict on the job's replicas, as on one device
        from tfgpu.runtime import replica_batches
        from tfgpu.training import keras_fit

        keras_fit.patch()
        replica_batches.patch()


_make_job_strategy()


def __getattr__(name):
    if name in _LAZY:
        import importlib

        module_name, attribute = _LAZY[name]
        module = importlib.import_module(module_name)
        return module if attribute is None else getattr(module, attribute)
    raise AttributeError(f"module 'tfgpu' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_LAZY))
