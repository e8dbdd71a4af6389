"""ShareLogs: the logs of a step's shares are the global values, on one replica and on two (logical CPUs)."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from tfgpu.tasks.share_logs import ShareLogs


class _ShareModel(keras.Model):
    """A model whose step's shares are known: ``loss`` = sum of the replica's x / global batch, ``skipped`` = one
    skipped step split over the replicas."""

    def __init__(self):
        super().__init__()
        self.logs = ShareLogs(means=("loss",), counts=("skipped",))
        self.dense = keras.layers.Dense(1)

    @property
    def metrics(self):
        return list(self.logs.trackers.values())

    def call(self, x):
        return self.dense(x)

    def train_step(self, data):
        x = tf.cast(data, tf.float32)
        context = tf.distribute.get_replica_context()
        global_batch = tf.cast(tf.shape(x)[0] * context.num_replicas_in_sync, tf.float32)
        return self.logs.update({"loss": tf.reduce_sum(x) / global_batch,
                                 "skipped": 1.0 / context.num_replicas_in_sync})


def test_a_mean_is_the_mean_of_each_steps_global_value_and_a_count_the_total():
    model = _ShareModel()
    model.compile(optimizer="sgd")
    x = np.arange(8, dtype="float32").reshape(8, 1)  # batches of 4: means 1.5 and 5.5
    history = model.fit(x, batch_size=4, epochs=2, shuffle=False, verbose=0)
    assert history.history["loss"] == pytest.approx([3.5, 3.5])
    assert history.history["skipped"] == pytest.approx([2.0, 2.0])  # reset each epoch


def test_a_share_with_no_tracker_is_refused_by_name():
    logs = ShareLogs(means=("loss",))
    with pytest.raises(KeyError, match="accuracy"):
        logs.update({"loss": 1.0, "accuracy": 0.5})
    with pytest.raises(ValueError, match="loss"):
        ShareLogs(means=("loss",), counts=("loss",))
