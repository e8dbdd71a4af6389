"""The user's Keras callbacks on tfgpu's loop: Keras' own ``CallbackList``, in Keras' order with Keras' ``logs``.

Every worker runs every callback on the same (all-reduced) logs, so they decide alike (``EarlyStopping``,
``ReduceLROnPlateau``, a callback that calls ``model.evaluate`` and so takes part in collectives). What a callback
writes to a file (``ModelCheckpoint``, ``TensorBoard``, ``CSVLogger``, a ``ProgbarLogger``'s lines) comes from the
chief alone: on the other workers the path is a temporary directory deleted when fit ends, as Keras 2 did
(``ChiefOutputs``). ``BackupAndRestore`` is tfgpu's own resume: its ``backup_dir`` becomes ``model_dir``.
"""
import logging
import os
import shutil

from tfgpu.training.fit.arguments import FitError

log = logging.getLogger("tfgpu")

FILE_ATTRIBUTES = {"ModelCheckpoint": "filepath", "TensorBoard": "log_dir", "CSVLogger": "filename"}
BATCH_HOOKS = ("on_batch_begin", "on_batch_end", "on_train_batch_begin", "on_train_batch_end")


def _kind(callback) -> str:
    """The Keras callback class ``callback`` is (its nearest keras.callbacks base), or its own class name."""
    import keras

    for cls in type(callback).__mro__:
        if cls.__module__.startswith("keras") and hasattr(keras.callbacks, cls.__name__):
            return cls.__name__
    return type(callback).__name__


def prepare(callbacks):
    """(the callbacks to run, BackupAndRestore's backup_dir or ""); FitError for something that is no callback."""
    import keras

    if callbacks is None:
        return [], ""
    if isinstance(callbacks, keras.callbacks.CallbackList):
        callbacks = callbacks.callbacks
    if isinstance(callbacks, keras.callbacks.Callback):
        callbacks = [callbacks]
    runs, backup_dir = [], ""
    for callback in callbacks:
        if not isinstance(callback, keras.callbacks.Callback):
            raise FitError("callbacks", f"{type(callback).__name__} is not a keras.callbacks.Callback")
        if _kind(callback) == "BackupAndRestore":
            log.info("BackupAndRestore(%s): served by tfgpu's checkpoints there; a rerun resumes at the step it "
                     "stopped at", callback.backup_dir)
            backup_dir = os.fspath(callback.backup_dir)
            continue
        runs.append(callback)
    return runs, backup_dir


def acts_on_batches(callbacks) -> bool:
    """Whether a callback does something after single batches (Keras' ``ProgbarLogger`` aside, which draws what it
    is given): then a host call runs ``steps_per_execution`` steps, as under ``model.fit``."""
    from tfgpu.runtime.keras_internals import internal

    utils = internal("utils")

    return any(_kind(c) != "ProgbarLogger" and not all(utils.is_default(getattr(c, hook)) for hook in BATCH_HOOKS)
               for c in callbacks)


class ChiefOutputs:
    """On a worker that is not the chief, points each file-writing callback at this worker's temporary directory
    (``distribute.scratch_dir``, as its checkpoints; restored and deleted by ``close``); drops a ``ProgbarLogger``
    there."""

    def __init__(self, callbacks, placement):
        from tfgpu.runtime import distribute

        self.callbacks, self.moved, self.scratch = [], [], None
        chief = placement.is_chief
        for callback in callbacks:
            kind = _kind(callback)
            if not chief and kind == "ProgbarLogger":
                continue
            if not chief and kind in FILE_ATTRIBUTES:
                if self.scratch is None:
                    self.scratch = distribute.scratch_dir(placement)
                attribute = FILE_ATTRIBUTES[kind]
                real = getattr(callback, attribute)
                self.moved.append((callback, attribute, real))
                setattr(callback, attribute, os.path.join(self.scratch, os.path.basename(os.fspath(real)) or kind))
            self.callbacks.append(callback)

    def close(self) -> None:
        for callback, attribute, real in self.moved:
            setattr(callback, attribute, real)
        if self.scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)


def callback_list(callbacks, model, verbose, epochs: int, steps, chief: bool):
    """Keras' ``CallbackList`` as ``model.fit`` makes it: a ``History`` always, a progress bar for a non-zero
    ``verbose`` (on the chief)."""
    import keras

    return keras.callbacks.CallbackList(callbacks, add_history=True, add_progbar=chief and verbose != 0,
                                        verbose=verbose, epochs=epochs, steps=steps, model=model)
