"""``sample_weight`` under ``tfgpu.fit``: per-example weights as Keras applies them, kept beside tfgpu's records.

The weights come with the call (``sample_weight=`` with arrays, ``(x, y, w)`` elements of a Dataset or a PyDataset,
``validation_data=(x, y, w)``), on every worker, so they are not written into the records: each record of a split
written by ``data.from_dataset`` is named ``<split>/<index>`` (its ``image/filename``), and ``WeightedExamples``
looks its weight up by that index, wherever the shuffled, sharded pipeline reads it.

Keras' reduction ("sum_over_batch_size") is what the classification task does: the batch's ``sum(loss * weight)``
divided by the number of examples (the global batch: summed over replicas, that is one device's value), and
``val_loss`` is ``sum(loss * weight)`` over the validation examples divided by their number. ``metrics`` ignore
the weights, ``weighted_metrics`` take them (``fit_metrics``).

A weight reaches the task encoded so that it tells real examples from the evaluation's padding (weight 0): a real
example's weight as it is, a real example of weight 0 as -1 (``encode``; ``decode`` gives back the weight and the
mask of real examples).
"""
import numpy as np

from tfgpu.config import ConfigError
from tfgpu.data.records import Examples

ZERO_WEIGHT = -1.0  # a real example of weight 0 (0 is the evaluation's padding)


def check(weights, count: int, argument: str) -> np.ndarray:
    """``weights`` as float32 (count,); ConfigError(argument) for a wrong shape, a negative or non-finite weight."""
    values = np.asarray(weights)
    if values.ndim == 2 and values.shape[-1] == 1:
        values = values[:, 0]
    if values.ndim != 1 or len(values) != count:
        raise ConfigError(argument, f"weights of shape {values.shape} for {count} examples: one weight per example")
    if not np.issubdtype(values.dtype, np.number) or np.issubdtype(values.dtype, np.complexfloating):
        raise ConfigError(argument, f"weights are {values.dtype}; numbers")
    values = values.astype(np.float32)
    bad = np.flatnonzero(~np.isfinite(values) | (values < 0))
    if len(bad):
        raise ConfigError(argument, f"example {bad[0]} has weight {values[bad[0]]}: weights must be finite and >= 0")
    return values


def split_off(dataset, argument: str):
    """(a Dataset of (x, y), the weights of its (x, y, w) elements as float32, or None when its elements are
    pairs). Reads the Dataset once for the weights."""
    import tensorflow as tf

    spec = dataset.element_spec
    if not (isinstance(spec, tuple) and len(spec) == 3):
        return dataset, None
    weights = [np.reshape(w, [-1]) for w in dataset.map(lambda x, y, w: tf.cast(w, tf.float32)).as_numpy_iterator()]
    weights = np.concatenate(weights) if weights else np.zeros([0], np.float32)
    return dataset.map(lambda x, y, w: (x, y)), weights


def encode(weights):
    """The weight a pipeline carries: 0 (padding) only for padding."""
    import tensorflow as tf

    return tf.where(weights > 0, weights, ZERO_WEIGHT)


def decode(weights):
    """(the examples' weights, 1 for a real example and 0 for padding) of carried ``weights`` (None: ones)."""
    import tensorflow as tf

    return tf.maximum(weights, 0.0), tf.cast(tf.not_equal(weights, 0.0), tf.float32)


class WeightedExamples(Examples):
    """Classification's examples with the weight of each record: ``weights`` {split: float32 array by record
    index}; a split without weights weighs 1 an example."""

    def __init__(self, config, info, weights: dict):
        super().__init__(config, info)
        self.weights = {split: np.asarray(w, np.float32) for split, w in weights.items() if w is not None}

    def example(self, serialized, split: str, key, seed=None):
        import tensorflow as tf

        from tfgpu.data import tfrecord

        features = self.parse(serialized)
        image, label = self.image(features, seed), self.label(features, split, key)
        if split not in self.weights:
            return image, label, tf.constant(1.0)
        index = tf.strings.to_number(tf.strings.split(features[tfrecord.FILENAME], "/")[-1], tf.int64)
        return image, label, encode(tf.gather(tf.constant(self.weights[split]), index))
