"""Which task declares which options section: the table ``config_sources`` and ``cli`` read to turn a task's
options into flat flags and config.yaml keys, and flat values back into the run's section.

Light on purpose (no TensorFlow, no task module): a command reads it before TensorFlow is imported. A task with
options of its own adds its TaskOptions class here, one line.
"""
from tfgpu.tasks.gan.options import GanOptions

SECTIONS = {options.task: options for options in (GanOptions,)}
