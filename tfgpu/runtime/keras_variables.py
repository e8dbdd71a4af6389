"""Keras variables made under a tf.distribute strategy read as Python numbers, as they do on one device.

Under a strategy a Keras 3 variable holds a distributed TensorFlow variable (a metric's state is a
``SyncOnReadVariable``), which has no ``__float__`` or ``__int__``: ``float(metric.result())`` raises ``TypeError``
after ``model.fit`` on a MirroredStrategy, and so in every script ``import tfgpu`` puts under the job's strategy,
where the same line works on one device. ``v.numpy()`` reads such a variable as Keras reads it (a sync-on-read sum
is summed over replicas and workers), so ``float``/``int`` go through it. Applied when a strategy is made for the
script (``job_strategy.make``) and by ``tfgpu.fit``; idempotent, and a no-op for variables that already converted.
"""


def read_as_numbers() -> None:
    """Gives Keras' TensorFlow variables ``__float__`` and ``__int__`` through ``numpy()``."""
    from tfgpu.runtime.keras_internals import internal

    Variable = internal("tensorflow_core").Variable

    if getattr(Variable, "_tfgpu_reads_as_numbers", False):
        return
    Variable.__float__ = lambda self: float(self.numpy())
    Variable.__int__ = lambda self: int(self.numpy())
    Variable._tfgpu_reads_as_numbers = True
