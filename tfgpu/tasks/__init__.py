"""Tasks: what a training step computes. A task registers itself with ``@register_task`` in its own module; the
module is named here, once, and ``tasks.registry.get_task`` imports what is named (no TensorFlow at import of this
list)."""

TASK_MODULES = (
    "tfgpu.tasks.classification",
    "tfgpu.tasks.gan.task",
    "tfgpu.tasks.multilabel",
)
