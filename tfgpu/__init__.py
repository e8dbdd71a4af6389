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
- ``tfgpu.GAN(generator, discriminator, ...)``: a ``keras.Model`` whose ``train_step`` trains both networks (the
  flag command's ``--task=gan`` step: n_critic, penalties, DiffAugment, EMA, the non-finite guard), for
  ``tfgpu.fit(gan, images, batch_size=64)`` or ``gan.fit`` (``tfgpu.tasks.gan.model``, docs/own-model.md).
- ``tfgpu.ConfigError``: what a bad option or argument raises; ``.flag`` names it.
- ``tfgpu.Preempted``: what ``fit`` raises after a SIGTERM or a Ctrl-C, once the checkpoint is saved
  (``.step``); a Ctrl-C's is also a ``KeyboardInterrupt``.

Under the job's strategy the script's own ``model.evaluate``/``predict`` work as on one device
(``tfgpu.training.keras_adapter``); a ``model.fit`` that stock Keras 3 cannot run there (several workers, or several
GPUs with ``steps_per_execution > 1``) stops in one line naming ``tfgpu.fit``. ``tfgpu.keras_fit`` (stock
``model.fit`` under multi-worker strategies) has ended: ``tfgpu.fit`` is the door.
"""

__version__ = "0.1.0"

# attribute -> (module, name in it), or the module itself when the name is None
_LAZY = {
    "fit": ("tfgpu.training.fit", "fit"),
    "GAN": ("tfgpu.tasks.gan.model", "GAN"),
    "ConfigError": ("tfgpu.config", "ConfigError"),
    "Preempted": ("tfgpu.runtime.failures", "Preempted"),
    "data": ("tfgpu.data", None),
}


def _make_job_strategy():
    from tfgpu.runtime import job_strategy

    strategy = job_strategy.at_import()
    if strategy is not None:  # the script's own model.evaluate/predict on the job's replicas, as on one device
        from tfgpu.training import keras_adapter

        keras_adapter.adapt_script()


_make_job_strategy()


# Ended doors: attribute -> the one line that says what to call instead.
_ENDED = {
    "keras_fit": "tfgpu.keras_fit has ended: train with tfgpu.fit, same arguments (`model.fit(` -> "
                 "`tfgpu.fit(model, `); after `import tfgpu` the script's own model.evaluate/predict work under the "
                 "job's strategy as they are (docs/from-model-fit.md)",
}


class DoorEnded(RuntimeError, SystemExit):
    """A tfgpu attribute that has ended: one line saying what to call instead (``from tfgpu import keras_fit`` too), an
    error to a caller that catches it and, uncaught, the process's exit (its message, exit 1, no traceback)."""

    def __init__(self, name: str):
        RuntimeError.__init__(self, _ENDED[name])
        self.code = f"tfgpu: {self}"


def __getattr__(name):
    if name in _ENDED:
        raise DoorEnded(name)
    if name in _LAZY:
        import importlib

        module_name, attribute = _LAZY[name]
        module = importlib.import_module(module_name)
        return module if attribute is None else getattr(module, attribute)
    raise AttributeError(f"module 'tfgpu' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_LAZY))
