"""Keras logs from a task's replica step: the bridge that lets a task's step be a ``keras.Model``'s ``train_step``.

A task's replica step returns this replica's *share* of each global value (``tasks/base.py``: a loss summed over the
replica's examples and divided by the global batch; a count divided by the replicas), so that the sum over replicas
is the step's global value. Keras reduces a ``train_step``'s logs with the mean over replicas (its "auto" reduction,
``keras.src.backend.tensorflow.trainer.reduce_per_replica``), each replica's log being its own trackers' result. So
a replica feeds its trackers ``share x replicas``: the mean of those over replicas is the global value of the step,
under ``model.fit`` on one device, ``tfgpu.fit`` on any number of replicas and workers alike; over the steps since
the trackers were last reset (an epoch, in Keras' loop) a mean's log is the mean of the steps' global values and a
count's the total.
"""
import keras
import tensorflow as tf


class ShareLogs:
    """Keras metric trackers fed with a replica step's shares: ``means`` averaged over steps (losses, accuracies),
    ``counts`` summed (skipped steps). The model that owns it lists ``trackers`` in its ``metrics`` property, so
    that Keras resets them at each epoch and checkpoints nothing of them."""

    def __init__(self, means=(), counts=()):
        overlap = set(means) & set(counts)
        if overlap:
            raise ValueError(f"a log is a mean or a count, not both: {sorted(overlap)}")
        self.trackers = {**{name: keras.metrics.Mean(name=name) for name in means},
                         **{name: keras.metrics.Sum(name=name) for name in counts}}

    def update(self, shares: dict) -> dict:
        """Feeds ``shares`` (a replica step's, in replica context) to the trackers; returns every tracker's result,
        the logs of a ``train_step``. A share with no tracker is an error: a log nobody would see."""
        unknown = set(shares) - set(self.trackers)
        if unknown:
            raise KeyError(f"no tracker for the step's values {sorted(unknown)}; known: {sorted(self.trackers)}")
        replicas = tf.distribute.get_replica_context().num_replicas_in_sync
        for name, share in shares.items():
            self.trackers[name].update_state(tf.cast(share, tf.float32) * replicas)
        return {name: tracker.result() for name, tracker in self.trackers.items()}

    def reset(self) -> None:
        for tracker in self.trackers.values():
            tracker.reset_state()
