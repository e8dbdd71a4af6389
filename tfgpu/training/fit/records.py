"""tfgpu's converted records given to ``tfgpu.fit`` (a Dataset ``tfgpu.data.load`` made), read by index: every
example once per epoch on any number of workers and replicas, and exact resume on another topology.

The records and their order are the loader's (``data.input.loader.Records``: the flag command's order of the whole
split, drawn from the loader's seed and the epoch; the images held decoded in memory or read at their offsets).
Global batch ``k`` of an epoch is the loader's batch ``k``, so on one device ``tfgpu.fit`` trains on the batches
``model.fit`` draws from the same Dataset. As for arrays (``arrays``), each global batch is cut among the job's
replicas in contiguous, nearly equal parts (``arrays.replica_bounds``), and each worker's pipeline yields its
replicas' parts, step by step, replica by replica: the parts of all workers are the global batch, whatever the
topology, so a run resumed at (epoch, step) on other workers trains on the global batches the run it continues
would have. Held in memory, a worker gathers only its parts; read from the shards, every worker reads each global
batch's records and decodes only its parts (a tf.data service does not read them: --data_service is the flag
command's alone so far).
"""
import tensorflow as tf

from tfgpu.training.fit import arrays
from tfgpu.training.fit.arguments import FitError


def make(records, y, sample_weight, batch_size, class_weight, steps_per_epoch):
    """The input of a loaded Dataset, refusing what ``model.fit`` refuses with a Dataset (it holds its labels and
    its batches)."""
    for name, value in (("y", y), ("sample_weight", sample_weight), ("batch_size", batch_size),
                        ("class_weight", class_weight)):
        if value is not None:
            raise FitError(name, f"is not taken with a tfgpu.data.load Dataset, which holds its labels and its "
                           f"batches of {records.batch_size} (give batch_size to tfgpu.data.load)")
    return RecordsInput(records, steps_per_epoch)


def part_bounds(batch_examples, num_replicas: int, replica_ids):
    """``arrays.replica_bounds`` in the graph, for the replicas ``replica_ids`` (consecutive): the offsets of their
    parts in a global batch of ``batch_examples`` (a tensor), ``len(replica_ids) + 1`` of them."""
    ids = tf.range(replica_ids[0], replica_ids[-1] + 2, dtype=tf.int64)
    n = tf.cast(batch_examples, tf.int64)
    return ids * (n // num_replicas) + tf.minimum(ids, n % num_replicas)


class RecordsInput:
    """A loaded split as an epoch-by-epoch input of per-replica batches ``(images, labels)``; ``steps_per_epoch``
    caps an epoch (Keras' ``steps_per_epoch``; each epoch starts a new order)."""

    kind = "records"
    fixed_steps = None  # an epoch is exactly ``steps_per_epoch`` steps, known in advance

    def __init__(self, records, steps_per_epoch=None):
        self.records = records
        self.batch_size, self.num_examples = records.batch_size, records.num_examples
        full = records.num_steps
        self._fetch = None  # (the Records, its fetch as a tf.function)
        self.steps_per_epoch = min(full, int(steps_per_epoch)) if steps_per_epoch else full

    @property
    def seed(self) -> int:
        return self.records.seed

    @seed.setter
    def seed(self, seed: int) -> None:  # a resumed run reads in the order its checkpoint recorded
        self.records = self.records.with_seed(seed)

    def describe(self) -> str:
        records = self.records
        return (f"{self.num_examples} records of split {records.split!r} of {records.info.directory} read by "
                f"index ({'decoded in memory' if records.in_memory else 'read at their offsets'}), "
                f"{'a new order each epoch' if records.shuffle else 'in shard order'}: every example once per "
                f"epoch, split among the replicas by global batch of {self.batch_size}")

    def last_batch_smaller(self) -> bool:
        return self.steps_per_epoch == self.records.num_steps and self.num_examples % self.batch_size != 0

    def element_spec(self):
        h, w, c = self.records.info.image_shape
        return tf.TensorSpec([None, h, w, c], tf.uint8), tf.TensorSpec([None], tf.int64)

    def parts(self, epoch: int, first_step: int, num_replicas: int, replica_ids):
        """``(keys, payload)`` of this worker's parts of epoch ``epoch`` from ``first_step`` on, step by step,
        replica by replica (``Records.fetch`` makes each one a batch). Held in memory: cut here as arrays are
        (``arrays.worker_parts`` over the epoch's keys), the payload the parts' places in memory; else each global
        batch read, then cut in the graph (``part_bounds``)."""
        records, batch = self.records, self.batch_size
        if records.in_memory:
            keys = records.epoch_keys(epoch)[:self.steps_per_epoch * batch]
            indices, offsets = arrays.worker_parts(keys, batch, first_step, num_replicas, replica_ids)
            with tf.device("/cpu:0"):
                positions = records.order.positions(tf.constant(indices))
                parts = [tf.RaggedTensor.from_row_splits(values, tf.constant(offsets), validate=False)
                         for values in (tf.constant(indices), positions)]
            return tf.data.Dataset.from_tensor_slices(tuple(parts))
        batches = records.global_batches(epoch, first_step).take(max(0, self.steps_per_epoch - first_step))
        replica_ids = list(replica_ids)

        def split(keys, payload):
            bounds = part_bounds(tf.shape(keys)[0], num_replicas, replica_ids)
            return tf.data.Dataset.range(len(replica_ids)).map(
                lambda j: (keys[bounds[j]:bounds[j + 1]], payload[bounds[j]:bounds[j + 1]]))

        return batches.flat_map(tf.autograph.experimental.do_not_convert(split))

    def epoch_dataset(self, epoch: int, first_step: int, num_replicas: int, replica_ids):
        """The tf.data pipeline of this worker's parts of epoch ``epoch`` from ``first_step`` on."""
        if self._fetch is None or self._fetch[0] is not self.records:  # traced once a Records, not every epoch
            spec = tf.TensorSpec([None], tf.int64)
            self._fetch = (self.records, tf.function(self.records.fetch, input_signature=[spec, spec if
                           self.records.in_memory else tf.TensorSpec([None], tf.string)], autograph=False))
        dataset = self.parts(epoch, first_step, num_replicas, replica_ids).map(
            self._fetch[1], num_parallel_calls=arrays.PARALLEL_GATHERS, deterministic=True).prefetch(2)
        return arrays.as_read_by_index(dataset)

    def on_epoch_begin(self) -> None:
        pass

    def on_epoch_end(self) -> None:
        pass
