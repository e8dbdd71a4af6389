"""``tfgpu.fit(model, ...)`` is ``model.fit(...)`` on every device of the job: Keras' own step, tfgpu's loop.

    import tfgpu                      # first: on several workers or GPUs it makes the job's strategy
    ...                               # the script as it was: data, model, compile()
    history = tfgpu.fit(model, x, y, batch_size=64, epochs=5, validation_split=0.1, callbacks=[...])

The arguments are ``keras.Model.fit``'s, meant as Keras means them; the model trains with its own ``train_step``
(its losses, metrics, ``add_loss``, loss scaling, a GAN's or VAE's own step) and is the object that trains: no copy,
no rebuild. What tfgpu owns is the loop around it: arrays read by index from memory with every example once per
epoch on any number of workers (``arrays``), a Dataset run as written (``datasets``), several steps per host call
(``steps``), Keras' callbacks in Keras' order (``callbacks``, ``epochs``), stop any time and exact resume from
``model_dir`` (``state``). Keyword-only options: ``model_dir``, ``steps_per_loop``, ``checkpoint_every``, ``seed``
(``arguments.OPTIONS``). The same script runs on N workers unchanged:
``python -m tfgpu.launch --num_workers=N -- python script.py`` (docs/from-model-fit.md).
"""
import logging

from tfgpu.training.fit.arguments import FitError

log = logging.getLogger("tfgpu")

__all__ = ["fit", "FitError"]


def fit(model, x=None, y=None, batch_size=None, epochs=1, verbose="auto", callbacks=None, validation_split=0.0,
        validation_data=None, shuffle=True, class_weight=None, sample_weight=None, initial_epoch=0,
        steps_per_epoch=None, validation_steps=None, validation_batch_size=None, validation_freq=1, **options):
    """``model.fit(x, y, ...)`` as ``tfgpu.fit(model, x, y, ...)``: returns the ``keras.callbacks.History`` Keras'
    fit returns (also ``model.history``); the trained weights are in ``model``.

    A bad argument raises ``tfgpu.ConfigError`` (``FitError``: ``.flag`` names it) before any work, or the error
    Keras raises for it. A Ctrl-C or SIGTERM stops after the step in flight, saves a checkpoint in ``model_dir`` and
    raises ``tfgpu.Preempted`` (a Ctrl-C's is also a ``KeyboardInterrupt``); calling fit again with the same
    ``model_dir`` resumes there."""
    import keras

    from tfgpu.training.fit import arguments

    loop = arguments.loop_options(options)
    arguments.check_keras_arguments(dict(
        batch_size=batch_size, epochs=epochs, validation_split=validation_split, shuffle=shuffle,
        initial_epoch=initial_epoch, steps_per_epoch=steps_per_epoch, validation_steps=validation_steps,
        validation_batch_size=validation_batch_size, validation_freq=validation_freq))
    if not isinstance(model, keras.Model):
        raise FitError("model", f"must be a keras.Model, got {type(model).__name__}")
    model._assert_compile_called("fit")
    from tfgpu.training.fit import run

    return run.fit(model, loop, x=x, y=y, batch_size=batch_size, epochs=epochs, verbose=verbose,
                   callbacks=callbacks, validation_split=validation_split, validation_data=validation_data,
                   shuffle=shuffle, class_weight=class_weight, sample_weight=sample_weight,
                   initial_epoch=initial_epoch, steps_per_epoch=steps_per_epoch, validation_steps=validation_steps,
                   validation_batch_size=validation_batch_size, validation_freq=validation_freq)
