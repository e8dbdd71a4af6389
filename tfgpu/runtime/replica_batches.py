"""No replica is handed an empty batch in ``predict``/``evaluate`` on N replicas: one device's answer, any batch size.

A global batch of fewer examples than replicas leaves some replica an empty batch (``model.predict(one_image)`` on
two workers: worker 1 gets 0 examples). On CPU workers oneDNN's Conv2D mishandles one (it returns its input
unchanged, docs/multi-node.md "Faults") and the next layer fails: the script that trained on two workers dies at its
own after-fit check. ``guard`` wraps a replica's ``predict_step``/``test_step``: an empty batch gets one example of
zeros (each tensor of the batch padded with one zero row), whose effects are undone inside the replica, so it adds
exactly what an empty batch adds: no rows to the predictions (sliced off) and nothing to the metrics (every metric
variable of the model set back to its value before the step, the loss tracker included). Batches that hold an
example run as they are.

``patch()`` puts the guard under Keras' own ``make_predict_function``/``make_test_function`` for models on more than
one replica (``import tfgpu`` under the job's strategy, ``tfgpu.fit`` on several replicas); tfgpu.fit's validation
step takes ``guard`` itself. A training step is not guarded: its effects (the all-reduced gradient, the optimizer's
step, BatchNormalization's moving statistics) cannot be undone inside one replica.
"""
from tfgpu.runtime import keras_internals

_ORIGINALS = {}


def _metric_variables(model) -> list:
    """Every metric variable a step of ``model`` may update (the compiled ones, the loss tracker, the model's own)."""
    metrics = list(model.metrics)
    compiled = [getattr(model, "_loss_tracker", None), getattr(model, "_compile_metrics", None)]
    compile_loss = getattr(model, "_compile_loss", None)
    metrics += compiled + (list(compile_loss.metrics) if compile_loss is not None else [])
    seen, variables = set(), []
    for metric in metrics:
        if metric is None or id(metric) in seen:
            continue
        seen.add(id(metric))
        variables.extend(metric.variables)
    return variables


def guard(model, step_fn, kind: str):
    """``step_fn`` (a replica's ``predict_step`` when ``kind == "predict"``, else a ``test_step``) that runs an empty
    batch as one example of zeros and undoes it."""
    import tensorflow as tf

    def guarded_step(data):
        tensors = tf.nest.flatten(data)
        if not tensors or not all(isinstance(t, tf.Tensor) and t.shape.rank for t in tensors):
            return step_fn(data)  # sparse or ragged inputs, or scalars: run as they are
        examples = tf.shape(tensors[0])[0]
        missing = tf.maximum(1 - examples, 0)
        padded = tf.nest.map_structure(
            lambda t: tf.concat([t, tf.zeros(tf.concat([[missing], tf.shape(t)[1:]], 0), t.dtype)], 0), data)
        if kind == "predict":
            return tf.nest.map_structure(lambda out: out[:examples], step_fn(padded))
        variables = _metric_variables(model)
        before = [tf.identity(v.value) for v in variables]
        logs = step_fn(padded)
        with tf.control_dependencies(tf.nest.flatten(logs)):
            def undo():
                for v, value in zip(variables, before):
                    v.assign(value)
                return tf.constant(True)

            undone = tf.cond(examples > 0, lambda: tf.constant(False), undo)
        with tf.control_dependencies([undone]):
            return tf.nest.map_structure(tf.identity, logs)

    return guarded_step


def _needs_guard(model) -> bool:
    strategy = getattr(model, "_distribute_strategy", None)
    return strategy is not None and strategy.num_replicas_in_sync > 1


class _StepView:
    """``model`` as Keras' ``make_*_function`` sees it, with the one step replaced by its guarded form."""

    def __init__(self, model, step_name: str, step):
        object.__setattr__(self, "_model", model)
        object.__setattr__(self, step_name, step)

    def __getattr__(self, name):
        return getattr(self._model, name)

    def __setattr__(self, name, value):
        setattr(self._model, name, value)


def _guarded_maker(name: str, step_name: str, kind: str):
    import functools

    original = _ORIGINALS[name]

    @functools.wraps(original)  # its source stays Keras' to inspect (keras_adapter's checks of the calls it relies on)
    def make(self, force=False):
        if not _needs_guard(self) or (getattr(self, name.replace("make_", ""), None) is not None and not force):
            return original(self, force)
        original(_StepView(self, step_name, guard(self, getattr(self, step_name), kind)), force)
        return getattr(self, name.replace("make_", ""))

    make.__doc__ = f"Keras' {name}, with no replica's {step_name} handed an empty batch (tfgpu.runtime.replica_batches)"
    return make


MAKERS = {"make_predict_function": ("predict_step", "predict"), "make_test_function": ("test_step", "test")}


def patch() -> None:
    """Guards Keras' predict and evaluate of every model on several replicas; idempotent."""
    trainer = keras_internals.tensorflow_trainer()
    if _ORIGINALS:
        return
    for name, (step_name, kind) in MAKERS.items():
        _ORIGINALS[name] = getattr(trainer, name)
        setattr(trainer, name, _guarded_maker(name, step_name, kind))


def unpatch() -> None:
    trainer = keras_internals.tensorflow_trainer()
    for name, fn in _ORIGINALS.items():
        setattr(trainer, name, fn)
    _ORIGINALS.clear()
