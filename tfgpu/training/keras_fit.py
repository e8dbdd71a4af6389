"""Bring your own ``model.fit``: stock Keras 3 ``fit`` under MultiWorkerMirroredStrategy, and under
MirroredStrategy with ``steps_per_execution > 1``, plus chief-aware callbacks.

Two bugs in Keras 3's TensorFlow trainer (``keras/src/backend/tensorflow/trainer.py``) stop
users who outgrow one device:

* ``steps_per_execution > 1`` under MirroredStrategy fails with "You must feed a value for
  placeholder tensor 'while/.../Placeholder'" (keras-team/keras#19246): ``_make_function``
  calls ``strategy.run`` inside a ``tf.cond`` inside a ``tf.while_loop``, and MirroredStrategy's
  replica threads cannot capture the loop's inputs across the cond branch.
  Fix: run the first step of each execution outside the loop and the rest in a while loop
  whose condition already checks ``has_value()``, so ``strategy.run`` is never under a cond.
* Under MultiWorkerMirroredStrategy ``fit`` fails before the first step: ``_maybe_symbolic_build``
  calls ``strategy.reduce("MEAN", first_batch)`` eagerly on per-replica input (ValueError:
  Attempt to convert a value (PerReplica...)). Fix: build from the first replica's batch
  (``experimental_local_results``). Logs are averaged across workers with ``axis=None``
  (element-wise, as Keras does on one machine) instead of ``axis=0``.

``patch()`` replaces exactly those two methods of ``TensorFlowTrainer`` after checking the
installed Keras: its version must be in the tested range (``runtime.keras_internals.SUPPORTED``; outside it
``KerasUnsupported``, one line) and the source of both methods
must be one tfgpu was verified against (``VERIFIED_SOURCES``); otherwise it raises
``KerasInternalsChanged`` naming what changed. Usage::

    from tfgpu.training import keras_fit
    keras_fit.patch()
    strategy = keras_fit.make_strategy()          # MWMS from TF_CONFIG or Slurm, else Mirrored
    with strategy.scope():
        model = build_model(); model.compile(..., steps_per_execution=32)
    model.fit(ds, epochs=E, verbose=2 if keras_fit.is_chief(strategy) else 0,
              callbacks=[keras_fit.ChiefBackupAndRestore(f"{model_dir}/backup"),
                         keras_fit.ChiefModelCheckpoint(f"{model_dir}/model.keras"),
                         keras_fit.ChiefTensorBoard(f"{model_dir}/logs")])
"""
import contextlib
import hashlib
import inspect
import logging
import os
import shutil
import tempfile

import keras
import tensorflow as tf

from tfgpu.runtime import distribute, keras_internals
from tfgpu.training import loop

log = logging.getLogger("tfgpu")

# sha256 of inspect.getsource() of each replaced method, for every Keras release it was verified against.
VERIFIED_SOURCES = {
    "_make_function": {
        "bb33b7a0da3d27406c70fac54b8e9617156ef225f452b93f6addf8cc34aca0d0": "3.12.4-3.15.1",
    },
    "_maybe_symbolic_build": {
        "92a504f5eba9b29f81f1bf26180bdd5bf5186b06b7bda426534b90d2d02bc1c2": "3.12.4-3.15.1",
    },
}
# Calls inside Keras that must still go through the replaced methods (else the patch silently does nothing).
REQUIRED_CALLS = {
    "make_train_function": "self._make_function(self.train_step)",
    "make_test_function": "self._make_function(self.test_step)",
    "fit": "self._maybe_symbolic_build(iterator=epoch_iterator)",
    "evaluate": "self._maybe_symbolic_build(iterator=epoch_iterator)",
}
REQUIRED_SIGNATURES = {
    "_make_function": ["self", "step_function"],
    "_maybe_symbolic_build": ["self", "iterator", "data_batch"],
    "_symbolic_build": ["self", "iterator", "data_batch"],
    "_autoconvert_optionals": ["self", "step_func"],
}
FIT_RESUMES_FROM = "self._initial_epoch or initial_epoch"  # how ChiefBackupAndRestore makes fit skip epochs

_ORIGINALS = {}


class KerasInternalsChanged(RuntimeError):
    """The installed Keras is not one tfgpu.training.keras_fit was verified against."""


def _trainer_class():
    return keras_internals.tensorflow_trainer()


def source_fingerprint(fn) -> str:
    """sha256 of a function's source text: changes whenever Keras edits the function."""
    return hashlib.sha256(inspect.getsource(fn).encode()).hexdigest()


def check_keras(allow_unverified: bool = False) -> None:
    """Raises KerasInternalsChanged unless the installed Keras has the internals ``patch`` replaces and relies on.

    ``allow_unverified`` accepts replaced methods whose source differs from every verified release (the
    version range, signatures and call sites are still checked)."""
    if keras.config.backend() != "tensorflow":
        raise KerasInternalsChanged(f"tfgpu.training.keras_fit needs the TensorFlow backend, KERAS_BACKEND is "
                                    f"{keras.config.backend()!r}")
    keras_internals.check()  # the tested releases (runtime/keras_internals.py): else one line, no traceback
    try:
        trainer = _trainer_class()
    except ImportError as e:
        raise KerasInternalsChanged(f"Keras {keras.__version__} has no keras.src.backend.tensorflow.trainer: {e}")
    problems = []
    for name, params in REQUIRED_SIGNATURES.items():
        fn = _ORIGINALS.get(name) or getattr(trainer, name, None)
        if fn is None:
            problems.append(f"TensorFlowTrainer.{name} is gone")
        elif list(inspect.signature(fn).parameters) != params:
            problems.append(f"TensorFlowTrainer.{name}{inspect.signature(fn)} no longer takes ({', '.join(params)})")
    for name, call in REQUIRED_CALLS.items():
        if call not in inspect.getsource(getattr(trainer, name)):
            problems.append(f"TensorFlowTrainer.{name} no longer calls {call}")
    if FIT_RESUMES_FROM not in inspect.getsource(trainer.fit):
        problems.append(f"TensorFlowTrainer.fit no longer reads `{FIT_RESUMES_FROM}`")
    if not allow_unverified:
        for name, verified in VERIFIED_SOURCES.items():
            fn = _ORIGINALS.get(name) or getattr(trainer, name, None)
            if fn is not None and source_fingerprint(fn) not in verified:
                problems.append(f"TensorFlowTrainer.{name} differs from the verified Keras releases "
                                f"({', '.join(sorted(set(verified.values())))})")
    if problems:
        raise KerasInternalsChanged(f"Keras {keras.__version__} changed the internals tfgpu.training.keras_fit patches: "
                                    + "; ".join(problems) + ". Re-verify tfgpu.training.keras_fit against this release.")


def patch(allow_unverified: bool = False) -> None:
    """Makes ``model.fit/evaluate`` work under MWMS and with ``steps_per_execution > 1`` under Mirrored.

    Idempotent; affects every Keras model in the process; ``unpatch()`` undoes it. Call before ``fit``."""
    check_keras(allow_unverified)
    trainer = _trainer_class()
    if _ORIGINALS:
        return
    _ORIGINALS["_make_function"] = trainer._make_function
    _ORIGINALS["_maybe_symbolic_build"] = trainer._maybe_symbolic_build
    trainer._make_function = _make_function
    trainer._maybe_symbolic_build = _maybe_symbolic_build


def unpatch() -> None:
    """Restores Keras' own methods."""
    trainer = _trainer_class()
    for name, fn in _ORIGINALS.items():
        setattr(trainer, name, fn)
    _ORIGINALS.clear()


# -- the replacements ---------------------------------------------------------------------------------------------

def logs_as_tensors(logs):
    """A step's logs as tensors made on its replica: a log may be a variable (a custom metric's ``result()`` returning
    its own state), which cannot be reduced across workers as it is."""
    return tf.nest.map_structure(lambda value: value if value is None else tf.identity(value), logs)


def _reduce_logs(outputs, strategy):
    """Per-replica step outputs → one value each, the same on every worker."""
    if distribute.is_multi_worker(strategy):
        # Keras uses axis=0 here, which fails on scalar logs and would average vector logs over their entries.
        return tf.nest.map_structure(lambda v: strategy.reduce("MEAN", v, axis=None), outputs)
    return keras_internals.internal("tensorflow_trainer").reduce_per_replica(outputs, strategy, reduction="auto")


def _make_function(self, step_function):
    """Replaces TensorFlowTrainer._make_function: same contract, no ``strategy.run`` under ``tf.cond``."""
    if getattr(self, "unrolled_steps_per_execution", 1) > 1:
        log.warning("tfgpu.training.keras_fit ignores unrolled_steps_per_execution=%d", self.unrolled_steps_per_execution)

    @tf.autograph.experimental.do_not_convert  # as Keras does: explicit tf.while_loop/tf.cond below, no autograph
    def one_step_on_data(data):
        outputs = self.distribute_strategy.run(lambda batch: logs_as_tensors(step_function(batch)), args=(data,))
        return _reduce_logs(outputs, self.distribute_strategy)

    if not self.run_eagerly:
        one_step_on_data = tf.function(one_step_on_data, reduce_retracing=True, jit_compile=self.jit_compile)
    one_step_on_data = self._autoconvert_optionals(one_step_on_data)

    def step(data, outputs):
        outputs = one_step_on_data(data)
        return outputs, tf.nest.flatten(outputs)

    @tf.autograph.experimental.do_not_convert
    def multi_step_on_iterator(iterator):
        # The first step is outside the loop; an exhausted iterator raises OutOfRangeError here, which Keras'
        # epoch iterator turns into the end of the epoch (as it does for Keras' own empty Optional).
        first = iterator.get_next()
        if self.steps_per_execution == 1:
            return one_step_on_data(first)
        _, _, outputs = loop.run_steps(step, self.steps_per_execution, None, iterator=iterator, first=first)
        return outputs

    if not self.run_eagerly:
        multi_step_on_iterator = tf.function(multi_step_on_iterator, reduce_retracing=True)

    def function(iterator):
        if isinstance(iterator, (tf.data.Iterator, tf.distribute.DistributedIterator)):
            return multi_step_on_iterator(iterator)
        outputs = None
        for _, data in zip(range(self.steps_per_execution), iterator):  # train_on_batch passes a generator
            outputs = one_step_on_data(data)
        return outputs

    return function


def _maybe_symbolic_build(self, iterator=None, data_batch=None):
    """Replaces TensorFlowTrainer._maybe_symbolic_build: builds from the first replica's batch, no eager reduce."""
    if self._distribute_strategy is None:
        return  # Keras builds lazily when the train function is traced
    if iterator is not None:
        for _, _, it in iterator:
            batch = next(it)
            data_batch = tf.nest.map_structure(
                lambda v: (self.distribute_strategy.experimental_local_results(v)[0]
                           if isinstance(v, tf.distribute.DistributedValues) else v), batch)
            break
    with self.distribute_strategy.scope():
        self._symbolic_build(data_batch=data_batch)


# -- strategy and chief -------------------------------------------------------------------------------------------

def make_strategy(cluster: str = "auto", collective_timeout_s: float = 0.0):
    """MultiWorkerMirroredStrategy when TF_CONFIG or Slurm name several workers, else MirroredStrategy on the
    visible devices. Call before TensorFlow initialises its runtime."""
    from tfgpu.config import RuntimeConfig
    from tfgpu.runtime import cluster as cluster_lib

    desc = cluster_lib.resolve_cluster(cluster)
    several_workers = desc is not None and desc["num_workers"] > 1
    settings = RuntimeConfig.defaults(distribution_strategy="multi_worker_mirrored" if several_workers else "mirrored",
                                   cluster=cluster, collective_timeout_s=collective_timeout_s)
    return distribute.build_strategy(settings, desc).strategy


def is_chief(strategy=None) -> bool:
    """Whether this task writes the real checkpoints and logs: the chief, else worker 0; always true on one host."""
    from tfgpu.runtime import cluster as cluster_lib

    strategy = strategy or tf.distribute.get_strategy()
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not distribute.is_multi_worker(strategy):
        return True
    return cluster_lib.is_chief_task(resolver.cluster_spec().as_dict(), resolver.task_type, resolver.task_id)


class _NonChiefDir:
    """Where a non-chief worker writes what every worker must write: a temporary dir it deletes afterwards."""

    def __init__(self, purpose):
        self.purpose = purpose
        self.path = None

    def make(self):
        self.path = tempfile.mkdtemp(prefix=f"tfgpu-{self.purpose}-")
        return self.path

    def delete(self):
        if self.path:
            shutil.rmtree(self.path, ignore_errors=True)
            self.path = None


class ChiefModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """``keras.callbacks.ModelCheckpoint`` that only the chief writes to ``filepath``; other workers save (every
    worker must take part) into a temporary dir that they delete when training ends."""

    def __init__(self, filepath, *args, **kwargs):
        super().__init__(filepath, *args, **kwargs)
        self._real_filepath = self.filepath
        self._scratch = _NonChiefDir("checkpoint")

    def on_train_begin(self, logs=None):
        self.filepath = self._real_filepath
        if not is_chief(self.model.distribute_strategy):
            self.filepath = os.path.join(self._scratch.make(), os.path.basename(self._real_filepath))
        super().on_train_begin(logs)

    def on_train_end(self, logs=None):
        super().on_train_end(logs)
        self._scratch.delete()
        self.filepath = self._real_filepath


class ChiefTensorBoard(keras.callbacks.TensorBoard):
    """``keras.callbacks.TensorBoard`` whose events only the chief writes to ``log_dir``; other workers write to a
    temporary dir that they delete when training ends."""

    def __init__(self, log_dir="logs", *args, **kwargs):
        super().__init__(log_dir, *args, **kwargs)
        self._real_log_dir = self.log_dir
        self._scratch = _NonChiefDir("tensorboard")

    def set_model(self, model):
        self.log_dir = self._real_log_dir
        if not is_chief(model.distribute_strategy):
            self._scratch.delete()
            self.log_dir = self._scratch.make()
        super().set_model(model)

    def on_train_end(self, logs=None):
        super().on_train_end(logs)
        self._scratch.delete()


class ChiefBackupAndRestore(keras.callbacks.Callback):
    """Saves model and optimizer after every epoch and resumes an interrupted ``fit`` at the next epoch.

    Like ``keras.callbacks.BackupAndRestore`` but safe under MWMS: a ``tf.train.CheckpointManager`` checkpoint (atomic:
    a crash mid-save leaves the previous one), written to ``backup_dir`` by the chief only (the others save to a
    temporary dir they delete), restored by every worker from ``backup_dir``, which must be on storage every worker
    sees. Restores at epoch boundaries: a crash mid-epoch repeats that epoch. Deletes the backup when ``fit`` ends
    normally (``delete_on_success``)."""

    def __init__(self, backup_dir, delete_on_success=True, max_to_keep=2):
        super().__init__()
        if not backup_dir:
            raise ValueError("ChiefBackupAndRestore needs a backup_dir")
        self.backup_dir = str(backup_dir)
        self.delete_on_success = delete_on_success
        self.max_to_keep = max_to_keep
        self._scratch = _NonChiefDir("backup")
        self._manager = None
        self._epoch = None
        self.restored_epoch = None  # the last completed epoch found in backup_dir, or None

    def on_train_begin(self, logs=None):
        strategy = self.model.distribute_strategy
        with strategy.scope():
            self._epoch = tf.Variable(-1, dtype=tf.int64, trainable=False, name="completed_epoch")
        checkpoint = tf.train.Checkpoint(model=self.model, optimizer=self.model.optimizer, epoch=self._epoch)
        latest = tf.train.latest_checkpoint(self.backup_dir)
        if latest:
            checkpoint.restore(latest).expect_partial()
        self._check_all_workers_agree(strategy, int(self._epoch.numpy()))
        if latest:
            self.restored_epoch = int(self._epoch.numpy())
            self.model._initial_epoch = self.restored_epoch + 1  # what fit reads to skip finished epochs
            log.info("resuming fit after epoch %d from %s", self.restored_epoch + 1, latest)
        directory = self.backup_dir if is_chief(strategy) else self._scratch.make()
        self._manager = tf.train.CheckpointManager(checkpoint, directory, max_to_keep=self.max_to_keep)

    def _check_all_workers_agree(self, strategy, epoch):
        """Every worker must resume from the same epoch, or their collectives would never line up."""
        if not distribute.is_multi_worker(strategy):
            return
        value = tf.constant([float(epoch), float(epoch) ** 2, 1.0])

        def replica_value():
            return tf.identity(value)

        @tf.function(autograph=False)
        def all_reduce():
            return strategy.reduce("SUM", strategy.run(replica_value), axis=None)

        total = all_reduce().numpy()
        if abs(total[2] * total[1] - total[0] ** 2) > 1e-6 * max(1.0, total[0] ** 2):
            raise RuntimeError(f"workers found different backups in {self.backup_dir} (this worker: last completed "
                               f"epoch {epoch + 1}); backup_dir must be on storage every worker sees")

    def on_epoch_end(self, epoch, logs=None):
        self._epoch.assign(epoch)
        self._manager.save(checkpoint_number=epoch + 1)  # every worker saves: the save may need collectives

    def on_train_end(self, logs=None):
        self._scratch.delete()
        self.model._initial_epoch = None
        if self.delete_on_success and is_chief(self.model.distribute_strategy):
            with contextlib.suppress(FileNotFoundError):
                shutil.rmtree(self.backup_dir)
