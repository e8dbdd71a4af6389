"""A ``tf.data.Dataset``, a Python generator or a ``keras.utils.PyDataset`` given to ``tfgpu.fit``, run as written.

Keras' own data adapter takes the object (``class_weight`` included), so it means what it means under
``model.fit``: each epoch iterates the pipeline again from its start (its random maps drawn again, its order as the
user wrote it: shuffled only where the user shuffles), a PyDataset's ``on_epoch_end`` runs after each epoch. Its
iterators are made when Keras' epoch iterator makes them (``epochs.Epochs``), so a reshuffling pipeline gives each
epoch the order it has under ``model.fit``.
On several replicas the pipeline is split as tf.distribute splits it (``experimental_distribute_dataset``: each global
batch is cut into per-replica batches; across workers its auto-shard policy applies, files when the pipeline reads
several files, else each worker keeps its share of the elements). A resumed epoch runs the pipeline again from its
start and skips the batches already trained (``Dataset.skip``): the same batches as the run it continues when the
pipeline's order does not depend on unseeded randomness (a seeded reshuffling one included: the resumed run first
makes the iterators the run it continues made).
"""
import logging

log = logging.getLogger("tfgpu")


class DatasetInput:
    """A Keras data adapter's ``tf.data`` pipeline, epoch by epoch. ``steps_per_epoch`` (Keras' argument): an
    epoch is that many batches taken from one iterator that runs on across epochs, as Keras' epoch iterator does."""

    kind = "dataset"

    def __init__(self, adapter, steps_per_epoch=None):
        self.adapter = adapter
        self.dataset = adapter.get_tf_dataset()
        self.fixed_steps = int(steps_per_epoch) if steps_per_epoch else None
        known = adapter.num_batches
        self.num_batches = int(known) if known is not None and known >= 0 else None  # the pipeline's length, if known
        self.steps_per_epoch = self.fixed_steps or self.num_batches

    def describe(self) -> str:
        name = type(self.adapter).__name__.replace("Adapter", "")
        return (f"{name} run as written every epoch; on several replicas split as tf.distribute splits a batched "
                "pipeline (a resume reruns the epoch's pipeline and skips the batches trained)")

    def element_spec(self):
        return self.dataset.element_spec

    def last_batch_smaller(self) -> bool:
        """Whether the pipeline's last batch may be partial: its batch dimension is not fixed (no ``drop_remainder``)."""
        import tensorflow as tf

        specs = [s for s in tf.nest.flatten(self.dataset.element_spec) if getattr(s, "shape", None) is not None]
        return any(s.shape.rank and s.shape[0] is None for s in specs)

    def epoch_dataset(self, epoch: int, first_step: int, num_replicas: int, replica_ids):
        return self.dataset.skip(first_step) if first_step else self.dataset

    def on_epoch_begin(self) -> None:
        self.adapter.on_epoch_begin()

    def on_epoch_end(self) -> None:
        self.adapter.on_epoch_end()
