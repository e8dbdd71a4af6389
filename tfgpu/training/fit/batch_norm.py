"""A line in the log when BatchNormalization normalizes too few examples a replica: what tf.distribute does, said.

On N replicas each replica normalizes its own share of the global batch (tf.distribute's meaning of
``BatchNormalization``): keras.io's EfficientNet fine-tuning at ``batch_size=16`` on two workers (8 examples a
replica) trained to 0.575 where one device reached 0.753. ``tfgpu.fit`` cannot decide for the user which one is
meant, so it says it once (``note_small_batches``): which layers, the batch a replica normalizes, and
``BatchNormalization(synchronized=True)``, which normalizes over the global batch. Only layers that train in
training mode count (a frozen BatchNormalization runs on its moving statistics in Keras 3).
"""
import logging

log = logging.getLogger("tfgpu")

FEWEST_EXAMPLES = 16  # a replica's batch below this is said
_SAID = set()  # (model, examples a replica) already said in this process


def unsynchronized(model) -> list:
    """The names of ``model``'s BatchNormalization layers that normalize each replica's batch on its own."""
    import keras

    return [layer.name for layer in model._flatten_layers(include_self=False, recursive=True)
            if isinstance(layer, keras.layers.BatchNormalization) and layer.trainable
            and not getattr(layer, "synchronized", False)]


def global_batch(data):
    """The global batch of ``data`` (an ``arrays.ArrayInput`` or ``datasets.DatasetInput``), or None when the
    pipeline does not say it (its batch dimension is neither static nor a constant of its ``batch`` op)."""
    if data.kind == "arrays":
        return min(data.batch_size, data.num_examples)
    import tensorflow as tf

    specs = [s for s in tf.nest.flatten(data.element_spec()) if getattr(s, "shape", None) is not None]
    if specs and specs[0].shape.rank and specs[0].shape[0] is not None:
        return int(specs[0].shape[0])
    dataset = data.dataset
    while dataset is not None:  # tf.data's batch ops keep their batch size (a constant when the script wrote one)
        size = getattr(dataset, "_batch_size", None)
        if size is not None:
            value = tf.get_static_value(size)
            return int(value) if value is not None and value > 0 else None
        dataset = getattr(dataset, "_input_dataset", None)
    return None


def note_small_batches(model, placement, data) -> None:
    """Logs once (per model and replica batch) when a BatchNormalization of ``model`` normalizes fewer than
    ``FEWEST_EXAMPLES`` examples a replica on more than one replica."""
    if placement.num_replicas < 2:
        return
    layers = unsynchronized(model)
    batch = global_batch(data) if layers else None
    if batch is None:
        return
    per_replica = batch // placement.num_replicas
    if per_replica >= FEWEST_EXAMPLES or (id(model), per_replica) in _SAID:
        return
    _SAID.add((id(model), per_replica))
    named = ", ".join(layers[:4]) + (f" and {len(layers) - 4} more" if len(layers) > 4 else "")
    log.warning("tfgpu.fit: BatchNormalization normalizes each replica's %d examples (global batch %d over %d "
                "replicas), not the global batch: %d layer%s (%s) see%s fewer than %d examples, so the model may "
                "train worse than on one device; BatchNormalization(synchronized=True) normalizes over the global "
                "batch", per_replica, batch, placement.num_replicas, len(layers), "s" if len(layers) > 1 else "",
                named, "" if len(layers) > 1 else "s", FEWEST_EXAMPLES)
