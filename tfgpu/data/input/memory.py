"""A pipeline's train images held decoded in memory: its records read and decoded once, in the first pass, then
every batch gathered from memory by the epoch's order, a batch at a time.

The batches are the ones the record pipeline gives (``pipeline.train_dataset_fn``), bit for bit: the same keys in
the same order (``Order.stream_keys`` is ``Order.stream`` without reading), each image decoded as its record
would be, the augmentation's random part (``Augmentation.on_decoded``) seeded by the same (seed, example index),
the same scaling and label check. So shares, epochs, exact resume and the exactly-once audit do not change; only
the per-record work of every epoch (read, parse, decode: about 0.15 ms of CPU a digit on 2 cores) is gone.

Held when the task's examples are classification's own (``Examples.holds_decoded``), the augmentation starts
from the decoded image (none, flip, cifar; ``imagenet`` decodes only a crop window of each record), and either
--cache is set or the pipeline's decoded images take at most ``AUTO_BYTES``.
"""
import logging

import tensorflow as tf

from tfgpu.data.input import augment
from tfgpu.data.input.records import Examples, _no_autograph
from tfgpu.data.schema import tfrecord

log = logging.getLogger("tfgpu")

AUTO_BYTES = 256 << 20  # decoded train images a pipeline holds without --cache (CIFAR-10 is 147 MiB)


def decoded_bytes(examples: Examples, orders) -> int:
    """The bytes ``orders``' records take decoded (uint8 images of the dataset's shape)."""
    h, w, c = examples.info.image_shape
    return sum(int(o.count.sum()) for o in orders) * h * w * c


def holds(config, examples: Examples, orders, pipeline_id: int) -> bool:
    """Whether pipeline ``pipeline_id`` holds the records of ``orders`` decoded in memory (this module's rule),
    logged in one line when it does."""
    if not examples.holds_decoded() or augment.augmentation(config.augment).on_decoded is None:
        return False
    size = decoded_bytes(examples, orders)
    if not (config.cache or size <= AUTO_BYTES):
        return False
    records = sum(int(o.count.sum()) for o in orders)
    why = "--cache" if config.cache else f"at most {AUTO_BYTES >> 20} MiB"
    log.info("input pipeline %d holds its %d train images decoded in memory (%.1f MiB, %s): read and decoded "
             "once, then gathered by the epoch's order", pipeline_id, records, size / (1 << 20), why)
    return True


def decoded(config, examples: Examples, serialized):
    """One record's ``(image, label)`` as held in memory: the image decoded (uint8, resized to --image_size when it
    has another size), the label unchecked (``Examples.check_batch`` checks a batch of them)."""
    h, w, c = examples.info.image_shape
    features = examples.parse(serialized)
    return tf.ensure_shape(augment.decoded(features, config.image_size, c), [h, w, c]), features[tfrecord.LABEL]


def train_batches(config, examples: Examples, stages, per_replica: int, consumed: int, seed: int, workers):
    """Per-replica ``(x, y)`` batches of the keys ``stages`` give: ((order, key vectors of its epochs), ...), the
    stages one after the other (a later stage of an interrupted epoch, then the ordinary epochs). Example ``i`` of
    the stream (counted from ``consumed``) is augmented with seed (``seed``, i), as the record pipeline does."""
    info, split = examples.info, examples.info.train_split
    h, w, c = info.image_shape
    on_decoded = augment.augmentation(config.augment).on_decoded

    def decode(serialized):
        return decoded(config, examples, serialized)

    tables, keyed, base = [], None, 0
    for order, keys in stages:  # one table of every stage's records; a key's position offset by its stage's
        tables.append(order.table_records())
        at = base
        stage = keys.map(_no_autograph(lambda k, order=order, at=at: (k, order.positions(k) + at)))
        keyed = stage if keyed is None else keyed.concatenate(stage)
        base += int(order.count.sum())
    records = tables[0]
    for more in tables[1:]:
        records = records.concatenate(more)
    table = records.map(_no_autograph(decode), num_parallel_calls=workers, deterministic=True).batch(max(1, base))

    def gather(images, labels):
        batches = tf.data.Dataset.zip(tf.data.Dataset.counter(), keyed.rebatch(per_replica, drop_remainder=True))

        def batch(b, keyed_batch):
            keys, positions = keyed_batch
            x = tf.gather(images, positions)
            if on_decoded is not augment.unchanged:
                index = consumed + b * per_replica + tf.range(per_replica, dtype=tf.int64)
                seeds = tf.stack([tf.fill([per_replica], tf.constant(seed, tf.int64)), index], 1)
                x = tf.map_fn(lambda a: on_decoded(a[0], a[1]), (x, seeds),
                              fn_output_signature=tf.TensorSpec([h, w, c], x.dtype))
            x = tf.ensure_shape(augment.to_model_range(x, config.input_range), [per_replica, h, w, c])
            return x, examples.check_batch(tf.gather(labels, positions), keys, split)

        return batches.map(_no_autograph(batch), num_parallel_calls=workers, deterministic=True)

    return table.take(1).flat_map(_no_autograph(gather))

