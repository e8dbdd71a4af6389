"""``tfgpu.data.load(data_dir, split, batch_size)``: a split that ``python -m tfgpu.convert`` wrote, as a
``tf.data.Dataset`` of batches ``(images, labels)`` as stored (uint8 ``HxWxC`` images, int64 class indices).

The directory is described from its ``dataset.json`` with its shards checked, as a run's ``--data_dir`` is
(``dataset_info.describe``). Its records are ordered as the flag command orders the records of one input pipeline
(``pipeline.share_order``: chunks of a shard's records permuted, then mixed a window at a time, drawn from (seed,
epoch); shard order with ``shuffle=False``), read by index (``data.index.order``), and batched as Keras batches
arrays: ``ceil(N / batch_size)`` batches an epoch, the last one partial. Each iteration of the Dataset is the next
epoch (as ``shuffle(reshuffle_each_iteration=True)`` reshuffles: the Dataset counts its iterations), so
``model.fit(dataset, epochs=E)`` trains epoch ``e`` on the order of epoch ``e``.

The images are held decoded in memory when a training pipeline would hold them (``memory.holds``: at most 256 MiB
decoded, or ``cache=True``): read and decoded once, then gathered by the epoch's keys; else every epoch reads its
records at their offsets and decodes them a batch at a time. ``tfgpu.fit`` knows the Dataset by ``records_of`` (a
registry of the Datasets ``load`` made, not a guess from its type) and reads the same records by index on any
number of workers and replicas (``tfgpu.training.fit.records``); a Dataset derived from it (``.map``, ``.take``) is
a Dataset like any other.
"""
import dataclasses
import functools
import math
import os
import weakref

import tensorflow as tf

from tfgpu.config import Config, ConfigError, DatasetConfig, InputConfig
from tfgpu.data.input import dataset_info, memory, pipeline
from tfgpu.data.input.records import Examples, _no_autograph

_LOADED = weakref.WeakKeyDictionary()  # a Dataset load returned -> its Records


class LoadError(ConfigError):
    """A bad argument of ``tfgpu.data.load``: ``flag`` names it; the message reads ``tfgpu.data.load: NAME: why``."""

    def __init__(self, flag: str, message: str):
        ValueError.__init__(self, f"tfgpu.data.load: {flag}: {message}")
        self.flag, self.reason = flag, message


# describe's flags in load's words
_ARGUMENT_OF_FLAG = {"train_split": "split", "num_classes": "data_dir"}


class Records:
    """One split of a converted dataset read by index: its order (``order.Order`` of the whole split, as one input
    pipeline's share), ``batch_size`` examples a batch, the images held decoded or read each epoch."""

    def __init__(self, info, config: InputConfig, batch_size: int, held=None):
        self.info, self.config, self.batch_size = info, config, int(batch_size)
        self.split = info.train_split
        self.examples = Examples(config, info)
        self.order = pipeline.share_order(config, info, 1, 0)
        self.num_examples = int(self.order.length)  # the split's readable records
        self.in_memory = held is not None or memory.holds(config, self.examples, [self.order], 0)
        self._held = held
        self.iterations = None  # the iterations of ``dataset()`` begun: the next one's epoch

    @property
    def seed(self) -> int:
        return self.config.seed

    @property
    def shuffle(self) -> bool:
        return self.order.shuffled

    def with_seed(self, seed: int) -> "Records":
        """The same records in the order another seed draws (the images held, if any, are shared)."""
        if seed == self.seed:
            return self
        return Records(self.info, dataclasses.replace(self.config, seed=int(seed)), self.batch_size,
                       self._held if self.in_memory else None)

    @property
    def num_steps(self) -> int:
        """Batches of an epoch: Keras' batches, the last one partial."""
        return int(math.ceil(self.num_examples / self.batch_size))

    def epoch_keys(self, epoch: int):
        """The keys (``file_index * 2**32 + index in the shard``) of epoch ``epoch``'s records in order."""
        return self.order.keys(epoch)

    def held(self):
        """``(images, labels)`` of every record in table order (``Order.positions`` counts on it), read and decoded
        once, on the host's CPU."""
        if self._held is None:
            decode = _no_autograph(functools.partial(memory.decoded, self.config, self.examples))
            with tf.init_scope(), tf.device("/cpu:0"):  # eagerly, also when first asked inside a traced function
                table = self.order.table_records().map(decode, num_parallel_calls=tf.data.AUTOTUNE,
                                                       deterministic=True)
                self._held = table.batch(max(1, int(self.order.count.sum()))).get_single_element()
        return self._held

    def global_batches(self, epoch, first_step: int = 0):
        """Epoch ``epoch``'s batches from batch ``first_step`` on, as ``(keys, payload)``: where each record is held
        in memory (``Order.positions``), or the serialized records; ``fetch`` makes them ``(images, labels)``.
        ``epoch`` may be a tensor when ``first_step`` is 0."""
        offset = first_step * self.batch_size
        order = self.order
        if self.in_memory:
            self.held()
            if isinstance(epoch, int):  # computed here (Order.keys, compiled once): no per-epoch graph to trace
                keys = tf.data.Dataset.from_tensor_slices(self.epoch_keys(epoch)[offset:])
            else:
                keys = order.stream_keys(epoch, offset, epochs=1).unbatch()
            return keys.batch(self.batch_size).map(_no_autograph(lambda k: (k, order.positions(k))))
        return order.stream(epoch, offset, epochs=1).batch(self.batch_size)

    def fetch(self, keys, payload):
        """``(images, labels)`` of a batch of ``global_batches`` (or a slice of one), labels checked against the
        classes (a bad one fails the step naming its shard and record)."""
        if self.in_memory:
            images, labels = self.held()
            images, labels = tf.gather(images, payload), tf.gather(labels, payload)
        else:
            h, w, c = self.info.image_shape
            images, labels = tf.map_fn(
                functools.partial(memory.decoded, self.config, self.examples), payload,
                fn_output_signature=(tf.TensorSpec([h, w, c], tf.uint8), tf.TensorSpec([], tf.int64)))
        return images, self.examples.check_batch(labels, keys, self.split)

    def dataset(self):
        """Every epoch's batches, one epoch an iteration (the epoch: how many iterations began before it)."""
        with tf.device("/cpu:0"):
            self.iterations = tf.Variable(0, dtype=tf.int64, trainable=False, name="tfgpu_load_iterations")
        iterations = self.iterations

        def epoch(_):
            return self.global_batches(iterations.assign_add(1) - 1).map(_no_autograph(self.fetch))

        ds = tf.data.Dataset.range(1).flat_map(_no_autograph(epoch))
        return ds.apply(tf.data.experimental.assert_cardinality(self.num_steps)).prefetch(2)


def load(data_dir, split: str = "train", batch_size: int = 32, *, shuffle=None, seed: int = 42,
         cache: bool = False, image_size: int = 0) -> tf.data.Dataset:
    """Split ``split`` of the dataset ``python -m tfgpu.convert`` wrote to ``data_dir``, as a Dataset of batches
    ``(images, labels)`` of ``batch_size`` (uint8 images as stored: the model rescales them).

    ``shuffle`` (default: True for the train split only) draws a new order each epoch from ``seed`` (42, as
    ``python -m tfgpu.train --seed``); False reads the records in shard order. ``cache``: hold the split's images
    decoded in memory whatever their size (as --cache; without it, up to 256 MiB are). ``image_size``: images
    resized to ``image_size`` squared, as --image_size (0: as stored; images of several sizes need one). A bad
    argument raises ``tfgpu.ConfigError`` naming it before anything is read."""
    for name, value in (("batch_size", batch_size), ("seed", seed), ("image_size", image_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < (1 if name == "batch_size" else 0):
            raise LoadError(name, f"must be a {'positive' if name == 'batch_size' else 'non-negative'} integer, "
                            f"got {value!r}")
    if not isinstance(split, str) or not split:
        raise LoadError("split", f"must be a split's name, got {split!r}")
    shuffle = split == "train" if shuffle is None else shuffle
    if shuffle not in (True, False) or cache not in (True, False):
        raise LoadError("shuffle" if shuffle not in (True, False) else "cache", "must be True or False")
    try:
        data_dir = os.fspath(data_dir)
    except TypeError:
        raise LoadError("data_dir", f"must be a directory path, got {data_dir!r}") from None
    config = Config(model_dir="unused", data_dir=data_dir, train_split=split, eval_split="none", seed=seed,
                    global_batch_size=batch_size, cache=cache, image_size=image_size,
                    **({} if shuffle else {"shuffle_buffer": 1}))
    try:
        info = dataset_info.describe(DatasetConfig.of(config), data_dir, "data_dir")
    except ConfigError as e:
        raise LoadError(_ARGUMENT_OF_FLAG.get(e.flag, e.flag), e.reason) from None
    if not info.num_classes:
        raise LoadError("data_dir", f"{data_dir} has no classes in its dataset.json: load gives (images, labels) "
                        "of a classification dataset")
    records = Records(info, InputConfig.of(config, 1), batch_size)
    if not records.num_examples:
        raise LoadError("split", f"{split!r} of {data_dir} holds no readable record")
    dataset = records.dataset()
    _LOADED[dataset] = records
    return dataset


def records_of(dataset):
    """The ``Records`` a Dataset ``load`` returned reads, else None (any other object)."""
    try:
        return _LOADED.get(dataset)
    except TypeError:  # not weakly referable, or unhashable: not one of load's
        return None
