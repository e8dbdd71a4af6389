"""The engine's Keras adapter: the script's own ``model.evaluate``/``predict`` on tfgpu's job strategy, and the one line
that sends ``model.fit`` to ``tfgpu.fit`` where Keras 3 cannot train.

``import tfgpu`` (a job of several workers or GPUs) and ``tfgpu.fit`` (several replicas) apply ``patch()``, so that a
script ported to tfgpu evaluates and predicts as on one device. Two bugs in Keras 3's TensorFlow trainer
(``keras/src/backend/tensorflow/trainer.py``) stand in the way:

* Under MultiWorkerMirroredStrategy ``evaluate`` (and ``fit``) fail before the first step: ``_maybe_symbolic_build``
  calls ``strategy.reduce("MEAN", first_batch)`` eagerly on per-replica input (ValueError: Attempt to convert a value
  (PerReplica...)). Fix: build from the first replica's batch (``experimental_local_results``). Logs are averaged
  across workers with ``axis=None`` (element-wise, as Keras does on one machine) instead of ``axis=0``.
* ``steps_per_execution > 1`` under MirroredStrategy fails with "You must feed a value for placeholder tensor
  'while/.../Placeholder'" (keras-team/keras#19246): ``_make_function`` calls ``strategy.run`` inside a ``tf.cond``
  inside a ``tf.while_loop``. Fix: evaluate's test steps run on tfgpu's one compiled loop
  (``training.loop.run_steps``: the first step outside the loop, ``strategy.run`` never under a cond).

Training is the engine's, through ``tfgpu.fit`` (the model's own ``train_step``, exact resume, the stop at the step in
flight, chief-only outputs). Where stock Keras cannot train (MultiWorkerMirroredStrategy, or MirroredStrategy with
``steps_per_execution > 1``) a patched ``model.fit`` stops before its first step with one line naming the call to
make (``FitNeedsTfgpu``); where it can (one device, MirroredStrategy with ``steps_per_execution=1``), ``model.fit``
is Keras' own.

``patch()`` replaces exactly those two methods of ``TensorFlowTrainer`` after checking the installed Keras: its
version must be in the tested range (``runtime.keras_internals.SUPPORTED``; outside it ``KerasUnsupported``, one line)
and the source of both methods must be one tfgpu was verified against (``VERIFIED_SOURCES``); otherwise it raises
``KerasInternalsChanged`` naming what changed.
"""
import hashlib
import inspect
import logging

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
    "fit": "self.make_train_function()",  # where a training model.fit is refused (FitNeedsTfgpu)
    "evaluate": "self._maybe_symbolic_build(iterator=epoch_iterator)",
}
REQUIRED_SIGNATURES = {
    "_make_function": ["self", "step_function"],
    "_maybe_symbolic_build": ["self", "iterator", "data_batch"],
    "_symbolic_build": ["self", "iterator", "data_batch"],
    "_autoconvert_optionals": ["self", "step_func"],
}

_ORIGINALS = {}


class KerasInternalsChanged(RuntimeError):
    """The installed Keras is not one tfgpu.training.keras_adapter was verified against."""


class FitNeedsTfgpu(RuntimeError, SystemExit):
    """A training ``model.fit`` where stock Keras 3 cannot train: one line naming ``tfgpu.fit``, as an error to a caller
    that catches it and, uncaught, as the process's exit (its message, exit 1, no traceback)."""

    def __init__(self, where: str):
        RuntimeError.__init__(self, f"model.fit cannot train under {where} in Keras 3; train with tfgpu.fit, same "
                              "arguments: `model.fit(` -> `tfgpu.fit(model, ` "
                              "(model.evaluate/predict work as they are)")
        self.code = f"tfgpu: {self}"


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
        raise KerasInternalsChanged(f"tfgpu.training.keras_adapter needs the TensorFlow backend, KERAS_BACKEND is "
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
    if not allow_unverified:
        for name, verified in VERIFIED_SOURCES.items():
            fn = _ORIGINALS.get(name) or getattr(trainer, name, None)
            if fn is not None and source_fingerprint(fn) not in verified:
                problems.append(f"TensorFlowTrainer.{name} differs from the verified Keras releases "
                                f"({', '.join(sorted(set(verified.values())))})")
    if problems:
        raise KerasInternalsChanged(f"Keras {keras.__version__} changed the internals tfgpu.training.keras_adapter "
                                    "patches: " + "; ".join(problems) + ". Re-verify tfgpu.training.keras_adapter "
                                    "against this release.")


def patch(allow_unverified: bool = False) -> None:
    """Makes ``model.evaluate/predict`` work under MWMS and with ``steps_per_execution > 1`` under Mirrored, and a
    training ``model.fit`` there stop in one line (``FitNeedsTfgpu``).

    Idempotent; affects every Keras model in the process; ``unpatch()`` undoes it."""
    check_keras(allow_unverified)
    trainer = _trainer_class()
    if _ORIGINALS:
        return
    _ORIGINALS["_make_function"] = trainer._make_function
    _ORIGINALS["_maybe_symbolic_build"] = trainer._maybe_symbolic_build
    trainer._make_function = _make_function
    trainer._maybe_symbolic_build = _maybe_symbolic_build


def adapt_script() -> None:
    """What the script's own Keras calls need once a strategy spans several replicas or workers, the one place both
    doors ask for it (``import tfgpu``'s job strategy, ``tfgpu.fit``): ``model.evaluate``/``predict`` through this
    adapter (``patch``), and no replica handed an empty batch (``runtime.replica_batches``)."""
    from tfgpu.runtime import replica_batches

    patch()
    replica_batches.patch()


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


def run_step(strategy, step_function, batch, reduction: str):
    """``step_function`` on every replica of ``strategy``, its logs reduced to one value each, the same on every
    worker, as Keras reduces them (``reduction``: ``reduce_per_replica``'s). The one replica step of tfgpu.fit's loop
    (``fit/steps.py``) and of the adapter's test function."""
    outputs = strategy.run(lambda data: logs_as_tensors(step_function(data)), args=(batch,))
    if distribute.is_multi_worker(strategy):
        # Keras uses axis=0 here, which fails on scalar logs and would average vector logs over their entries.
        return tf.nest.map_structure(lambda v: strategy.reduce("MEAN", v, axis=None), outputs)
    return keras_internals.internal("tensorflow_trainer").reduce_per_replica(outputs, strategy, reduction=reduction)


def where_keras_cannot_train(model):
    """The strategy under which stock Keras 3 cannot train ``model`` (a phrase for ``FitNeedsTfgpu``), or None."""
    strategy = model.distribute_strategy
    if distribute.is_multi_worker(strategy):
        return "MultiWorkerMirroredStrategy"
    if isinstance(strategy, tf.distribute.MirroredStrategy) and strategy.num_replicas_in_sync > 1 \
            and model.steps_per_execution > 1:
        return f"MirroredStrategy with steps_per_execution={model.steps_per_execution} (keras-team/keras#19246)"
    return None


def _make_function(self, step_function):
    """Replaces TensorFlowTrainer._make_function: test steps on tfgpu's one loop (predict has a function of its own),
    no ``strategy.run`` under ``tf.cond``; a train function is Keras' own where Keras can train, else
    ``FitNeedsTfgpu``."""
    if step_function == self.train_step:
        where = where_keras_cannot_train(self)
        if where is not None:
            raise FitNeedsTfgpu(where)
        return _ORIGINALS["_make_function"](self, step_function)
    if getattr(self, "unrolled_steps_per_execution", 1) > 1:
        log.warning("tfgpu.training.keras_adapter ignores unrolled_steps_per_execution=%d",
                    self.unrolled_steps_per_execution)

    @tf.autograph.experimental.do_not_convert  # as Keras does: an explicit loop (loop.run_steps), no autograph
    def one_step_on_data(data):
        return run_step(self.distribute_strategy, step_function, data, "auto")  # as Keras' own

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
        for _, data in zip(range(self.steps_per_execution), iterator):  # test_on_batch passes a generator
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
