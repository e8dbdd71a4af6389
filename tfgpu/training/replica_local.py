"""The weights Keras 3 leaves replica-local, averaged over replicas so that every replica and worker holds one model.

Keras 3 makes BatchNormalization's moving mean and variance (and any non-trainable weight a layer assigns in its
``call``) with aggregation "none": under a tf.distribute strategy each replica updates its own copy from its own
share of the batch, reads see the first local replica's copy, and two workers end with two models (tf.keras made
them sync-on-read means). A moving average is linear in what it averages, so the mean of the replicas' copies after
any number of steps is what averaging after every step gives: the moving average of the replicas' batch
statistics, as tf.keras read it.
"""
import tensorflow as tf


def replica_local_weights(model, strategy) -> list:
    """The float non-trainable weights of ``model`` that each replica updates on its own (aggregation "none",
    mirrored); empty with one replica in sync."""
    if strategy.num_replicas_in_sync == 1:
        return []
    return [v for v in model.non_trainable_weights
            if v.aggregation == "none" and v.trainable is False and tf.as_dtype(v.dtype).is_floating
            and isinstance(getattr(v, "value", v), tf.distribute.DistributedValues)]


def replica_local_weights_of(items, strategy) -> list:
    """``replica_local_weights`` of every Keras model among ``items`` (a task's checkpoint items, for instance)."""
    import keras

    return [w for item in items if isinstance(item, keras.Model) for w in replica_local_weights(item, strategy)]


def average_over_replicas(strategy, variables) -> None:
    """Sets each of ``variables`` on every replica to the mean of its replicas' copies (two batched all-reduces);
    called where ``strategy.run`` may be called: in a ``tf.function`` or eagerly."""
    if not variables:
        return

    def average():
        context = tf.distribute.get_replica_context()
        first = tf.equal(context.replica_id_in_sync_group, 0)
        copies = [tf.identity(v.value) for v in variables]
        # The first replica's copy plus the mean difference from it: the copies' mean, and exactly the copy where all
        # are already equal (synchronized statistics, a run of skipped steps), so averaging never drifts by a bit.
        references = context.all_reduce(tf.distribute.ReduceOp.SUM,
                                        [tf.where(first, copy, tf.zeros_like(copy)) for copy in copies])
        differences = context.all_reduce(tf.distribute.ReduceOp.MEAN,
                                         [copy - reference for copy, reference in zip(copies, references)])
        for variable, reference, difference in zip(variables, references, differences):
            variable.assign(reference + difference)

    strategy.run(average)
