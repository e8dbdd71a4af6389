"""Arrays given to ``tfgpu.fit``, read from memory by index: every example once per epoch on any topology.

An epoch's order is a permutation of the example indices (``epoch_order``: drawn from the run's seed and the epoch,
or ``arange`` for ``shuffle=False``); global batch ``k`` is the order's ``k``-th slice of ``batch_size`` indices, the
last one partial as in Keras (``ceil(N / batch_size)`` steps). Each global batch is split among the job's replicas
in contiguous, nearly equal parts (``replica_bounds``): the replicas of the job hold disjoint parts whose union is the
global batch, whatever the number of workers and replicas, so a run resumed at (epoch, step) on another topology
trains on the same global batches as the run it continues. Each worker's input pipeline gathers its replicas'
parts from the arrays in memory (no copy to disk). Keras' own array adapter checks and packs the arrays first
(``x``, ``y``, ``sample_weight``, ``class_weight`` as sample weights, floats to floatx).
"""
import math

import numpy as np

PARALLEL_GATHERS = 2  # fixed, not autotuned: an autotuned pipeline's iterator can take up to a minute to delete


def as_read_by_index(dataset):
    """``dataset`` (a worker's gathered parts) with the options every input read by index runs with: not autotuned
    (see PARALLEL_GATHERS) and never auto-sharded (it holds this worker's replicas' parts already)."""
    import tensorflow as tf

    options = tf.data.Options()
    options.autotune.enabled = False
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return dataset.with_options(options)


def epoch_order(num_examples: int, epoch: int, seed: int, shuffle: bool) -> np.ndarray:
    """The example indices of epoch ``epoch`` in training order: a permutation drawn from (seed, epoch), so every
    worker and every resumed run draws the same one; ``arange`` without shuffling."""
    if not shuffle:
        return np.arange(num_examples, dtype=np.int64)
    return np.random.default_rng([seed, epoch]).permutation(num_examples).astype(np.int64)


def num_steps(num_examples: int, batch_size: int) -> int:
    """Steps of one epoch: Keras' batches, the last one partial."""
    return int(math.ceil(num_examples / batch_size))


def replica_bounds(batch_examples: int, num_replicas: int) -> np.ndarray:
    """Where a global batch of ``batch_examples`` is cut among ``num_replicas`` replicas: ``num_replicas + 1``
    offsets, contiguous parts whose sizes differ by at most one (a replica's part is empty only when the batch holds
    fewer examples than there are replicas)."""
    sizes = np.full(num_replicas, batch_examples // num_replicas, dtype=np.int64)
    sizes[:batch_examples % num_replicas] += 1
    return np.concatenate([[0], np.cumsum(sizes)])


def worker_parts(order: np.ndarray, batch_size: int, first_step: int, num_replicas: int, replica_ids) -> tuple:
    """The parts this worker's replicas (``replica_ids``, of ``num_replicas`` in the job) take of every global batch
    from ``first_step`` to the epoch's end, in the order its pipeline yields them (step by step, replica by replica):
    ``(indices, offsets)``, part ``j`` being ``indices[offsets[j]:offsets[j + 1]]``."""
    pieces, sizes = [], []
    for step in range(first_step, num_steps(len(order), batch_size)):
        batch = order[step * batch_size:(step + 1) * batch_size]
        bounds = replica_bounds(len(batch), num_replicas)
        for replica in replica_ids:
            part = batch[bounds[replica]:bounds[replica + 1]]
            pieces.append(part)
            sizes.append(len(part))
    indices = np.concatenate(pieces) if pieces else np.zeros([0], np.int64)
    return indices.astype(np.int64), np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])


class ArrayInput:
    """Arrays (and tuples, lists or dicts of them) as an epoch-by-epoch input of per-replica batches.

    ``packed``: Keras' ``(x, y, sample_weight)`` packing of the checked arrays; ``seed`` draws the epochs' orders.
    ``steps_per_epoch`` caps an epoch (Keras' ``steps_per_epoch``; each epoch starts a new order)."""

    kind = "arrays"
    fixed_steps = None  # an epoch is exactly ``steps_per_epoch`` steps, known in advance

    def __init__(self, packed, batch_size: int, shuffle: bool, seed: int, steps_per_epoch=None):
        import tensorflow as tf

        from tfgpu.runtime.keras_internals import internal

        tree, array_slicing = internal("tree"), internal("array_slicing")

        arrays = array_slicing.convert_to_sliceable(packed, target_backend="tensorflow")
        with tf.device("/cpu:0"):
            self.tensors = tree.map_structure(lambda a: None if a is None else tf.convert_to_tensor(a), arrays)
        self.num_examples = int(next(t for t in tree.flatten(self.tensors) if t is not None).shape[0])
        self.batch_size, self.shuffle, self.seed = int(batch_size), shuffle, int(seed)
        full = num_steps(self.num_examples, self.batch_size)
        self.steps_per_epoch = min(full, int(steps_per_epoch)) if steps_per_epoch else full
        self._gather = None  # rows -> the arrays' rows (a tf.function made on the first epoch's pipeline)

    def describe(self) -> str:
        return (f"{self.num_examples} examples read from memory by index, "
                f"{'a new order each epoch' if self.shuffle else 'in their order'}: every example once per epoch, "
                f"split among the replicas by global batch of {self.batch_size}")

    def last_batch_smaller(self) -> bool:
        """Whether an epoch's last batch is partial (Keras' last batch)."""
        return self.steps_per_epoch == num_steps(self.num_examples, self.batch_size) and \
            self.num_examples % self.batch_size != 0

    def element_spec(self):
        """A batch's structure, for Keras' symbolic build: shapes with a free batch dimension."""
        import tensorflow as tf

        from tfgpu.runtime.keras_internals import internal

        tree = internal("tree")
        return tree.map_structure(lambda t: None if t is None else tf.TensorSpec([None, *t.shape[1:]], t.dtype),
                                  self.tensors)

    def epoch_dataset(self, epoch: int, first_step: int, num_replicas: int, replica_ids):
        """The tf.data pipeline of this worker's parts of epoch ``epoch`` from ``first_step`` on."""
        import tensorflow as tf

        from tfgpu.runtime.keras_internals import internal

        tree = internal("tree")
        order = epoch_order(self.num_examples, epoch, self.seed, self.shuffle)
        order = order[:self.steps_per_epoch * self.batch_size]
        indices, offsets = worker_parts(order, self.batch_size, first_step, num_replicas, replica_ids)
        if self._gather is None:  # traced once: a new trace for every epoch's pipeline cost a third of its build
            tensors = self.tensors
            self._gather = tf.function(
                lambda rows: tree.map_structure(lambda t: None if t is None else tf.gather(t, rows), tensors),
                input_signature=[tf.TensorSpec([None], tf.int64)], autograph=False)
        with tf.device("/cpu:0"):
            parts = tf.RaggedTensor.from_row_splits(tf.constant(indices), tf.constant(offsets), validate=False)
        dataset = tf.data.Dataset.from_tensor_slices(parts).map(
            self._gather, num_parallel_calls=PARALLEL_GATHERS, deterministic=True).prefetch(2)
        return as_read_by_index(dataset)

    def on_epoch_begin(self) -> None:
        pass

    def on_epoch_end(self) -> None:
        pass
