"""``compile(metrics=..., weighted_metrics=...)`` as ``tfgpu.fit`` computes them: Keras' own metric objects, their
state summed over every replica and worker.

A Keras 3 metric object cannot be updated inside ``strategy.run`` (its variables are not the replicas'), and a mean
of per-replica results is not the metric of the global batch (AUC, precision). So each replica step computes the
*increment* of every metric's state on its own examples, with Keras' ``stateless_update_state`` from zero state,
adds it to one flat sum-on-read vector (``train`` or ``eval``), and the host turns the summed state into the
metric's value with Keras' ``stateless_result``. This is exact for metrics whose state is a sum that starts at
zero: every mean metric (``keras.metrics.Mean`` and ``MeanMetricWrapper``: accuracies, top-k, MSE, MAE, ...),
``Sum``, the confusion-matrix metrics (``AUC``, ``Precision``, ``Recall``, ``TruePositives``, ..., ``*AtRecall``,
``*AtSensitivity``) and the IoU metrics. Any other metric is refused by name (``check``).

The cost is one vector of the metrics' state per replica (AUC: 4 x its thresholds), all-reduced when the host reads
it: once per loop (``steps_per_loop`` steps) for the running train logs, once per evaluation; no per-step gather.

Names are Keras': a string's own name, an object's ``name``, a repeated name with ``_1``, ``_2``; a weighted
metric whose name is taken is ``weighted_<name>`` (``keras.src.trainers.compile_utils.CompileMetrics.result``).
``"accuracy"``/``"acc"`` become Keras' Binary/Sparse/Categorical accuracy from the labels and the model's output.
"""
import logging

from tfgpu.config import ConfigError

log = logging.getLogger("tfgpu")

KINDS = ("train", "eval")
# History keys tfgpu's own logs use: a compiled metric may not take them
RESERVED = ("loss", "learning_rate")


def _additive_classes():
    """Keras metric classes whose state is a zero-started sum (``stateless_update_state`` from zero state is the
    increment of one batch)."""
    from keras.src.metrics import confusion_metrics, iou_metrics, reduction_metrics

    return (reduction_metrics.Mean, reduction_metrics.Sum, confusion_metrics._ConfusionMatrixConditionCount,
            confusion_metrics.Precision, confusion_metrics.Recall, confusion_metrics.SensitivitySpecificityBase,
            confusion_metrics.AUC, iou_metrics._IoUBase)


def identifiers(model) -> tuple:
    """(metrics, weighted_metrics) as compiled: strings, functions and metric objects (the user's own objects;
    ``resolve`` copies them)."""
    compile_metrics = getattr(model, "_compile_metrics", None)
    if compile_metrics is not None:
        return (list(getattr(compile_metrics, "_user_metrics", None) or []),
                list(getattr(compile_metrics, "_user_weighted_metrics", None) or []))
    from keras.src.saving import serialization_lib

    config = serialization_lib.deserialize_keras_object(model.get_compile_config() or {})
    return list(config.get("metrics") or []), list(config.get("weighted_metrics") or [])


def _copy(identifier):
    """A fresh metric object of ``identifier``'s class and config (its state at zero, its variables made in the
    current runtime); strings and functions as they are."""
    import keras

    if isinstance(identifier, keras.metrics.Metric):
        try:
            return type(identifier).from_config(identifier.get_config())
        except Exception:  # a user's class without a faithful config: the object itself (only its state is read)
            return identifier
    return identifier


def resolve(metrics, weighted_metrics, one_hot: bool, num_outputs: int, argument: str = "model"):
    """[(History name, metric object, weighted)] of the compiled metrics, as Keras' ``CompileMetrics`` names and
    builds them for labels that are class indices (or one-hot rows, ``one_hot``) and ``num_outputs`` outputs per
    example; ConfigError(argument) naming one whose state is not a zero-started sum."""
    import numpy as np
    from keras.src.trainers import compile_utils

    y_pred = np.zeros((1, num_outputs), "float32")
    y_true = np.zeros((1, num_outputs), "float32") if one_hot else np.zeros((1,), "int64")
    if num_outputs == 1:  # a single sigmoid unit: labels 0/1, one per example
        y_true = np.zeros((1, 1), "float32")
    resolved, counters = [], {}
    for weighted, group in ((False, metrics), (True, weighted_metrics)):
        for identifier in group:
            if identifier is None:
                continue
            metric = compile_utils.get_metric(_copy(identifier), y_true, y_pred)
            name = metric.name
            if name not in counters:
                counters[name] = 1
            elif not weighted:
                name, counters[name] = f"{name}_{counters[name]}", counters[name] + 1
            else:
                name = f"weighted_{metric.name}"
                if name in counters:
                    name, counters[name] = f"{name}_{counters[name]}", counters[name] + 1
                counters.setdefault(name, 1)
            check(metric, name, argument)
            resolved.append((name, metric, weighted))
    return resolved


def check(metric, name: str, argument: str = "model") -> None:
    """ConfigError(argument) naming ``metric`` unless its state is a zero-started sum of per-batch increments."""
    if name in RESERVED:
        raise ConfigError(argument, f"compiled with a metric named {name!r}: History's {name!r} is tfgpu's; "
                          "name the metric otherwise (name=...)")
    if not isinstance(metric, _additive_classes()):
        raise ConfigError(argument, f"compiled with metric {name!r} ({type(metric).__name__}): tfgpu.fit sums each "
                          "metric's state over replicas and workers, which is exact for mean metrics (accuracies, "
                          "top-k, MSE, MAE, keras.metrics.Mean), Sum, AUC, Precision, Recall and the other "
                          "confusion-matrix and IoU metrics; compile with those")
    if not metric.variables:
        raise ConfigError(argument, f"compiled with metric {name!r} ({type(metric).__name__}) that makes its "
                          "state at its first batch (e.g. AUC(multi_label=True) without num_labels): give its "
                          "size (num_labels=...)")


class CompiledMetrics:
    """The compiled metrics of one run: ``entries`` from ``resolve``; ``build`` (inside the strategy scope) makes the
    summed state, ``add`` adds a replica's increments (``increments``) in a step, the host ``reset``s and reads
    ``results`` by kind ("train": the running epoch; "eval": one evaluation)."""

    def __init__(self, entries):
        self.entries = list(entries)
        self.names = tuple(name for name, _, _ in self.entries)
        self.sizes = [[int(np_prod(v.shape)) for v in metric.variables] for _, metric, _ in self.entries]
        self.state = {}

    def __bool__(self):
        return bool(self.entries)

    def build(self, strategy) -> None:
        import tensorflow as tf

        size = sum(sum(s) for s in self.sizes)
        with strategy.scope():
            self.state = {kind: tf.Variable(tf.zeros([size]), trainable=False, name=f"compiled_metrics_{kind}",
                                            synchronization=tf.VariableSynchronization.ON_READ,
                                            aggregation=tf.VariableAggregation.SUM) for kind in KINDS}

    def increments(self, y_true, y_pred, mask=None, sample_weight=None):
        """The flat increment of every metric's state from one replica's batch (inside ``strategy.run``):
        ``mask`` (0 for padding, else 1) weights the unweighted metrics, ``sample_weight`` (with the padding at 0)
        the weighted ones (None: every example counts once)."""
        import tensorflow as tf

        parts = []
        for _, metric, weighted in self.entries:
            weights = sample_weight if weighted and sample_weight is not None else mask
            zeros = [tf.zeros(v.shape, v.dtype) for v in metric.variables]
            new = metric.stateless_update_state(zeros, y_true, y_pred, sample_weight=weights)
            parts.extend(tf.reshape(tf.cast(value, tf.float32), [-1]) for value in new)
        return tf.concat(parts, 0)

    def add(self, kind: str, increments):
        return self.state[kind].assign_add(increments)

    def reset(self, kind: str) -> None:
        import tensorflow as tf

        self.state[kind].assign(tf.zeros_like(self.state[kind]))

    def results(self, kind: str, prefix: str = "") -> dict:
        """{prefix + name: value} from the state summed over every replica and worker (a collective on several
        workers: every worker calls it at the same point)."""
        flat = self.state[kind].read_value().numpy()
        values, at = {}, 0
        for (name, metric, _), sizes in zip(self.entries, self.sizes):
            state = []
            for variable, size in zip(metric.variables, sizes):
                state.append(flat[at:at + size].reshape(tuple(variable.shape)).astype(variable.dtype))
                at += size
            values[prefix + name] = float(metric.stateless_result(state))
        return values


def np_prod(shape) -> int:
    size = 1
    for d in shape:
        size *= int(d)
    return size
