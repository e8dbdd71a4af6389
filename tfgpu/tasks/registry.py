"""Finding a task by ``--task`` name, and what its declarations give a run's other sections.

Tasks register themselves with ``tasks.base.register_task``; this module imports the task modules
``tfgpu.tasks.TASK_MODULES`` names (one line per task), so the
registrations have run before a name is looked up (the task modules import ``base``, never this module).
"""
import importlib

from tfgpu.config import Config, InputConfig
from tfgpu.tasks import TASK_MODULES, base


def _import_tasks():
    for module in TASK_MODULES:  # each registers its task on import
        importlib.import_module(module)


def get_task(name: str):
    """The Task class registered as ``name``; a ValueError listing the known tasks otherwise."""
    _import_tasks()
    if name not in base._TASKS:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(sorted(base._TASKS))}")
    return base._TASKS[name]


def input_config(config: Config) -> InputConfig:
    """The input pipeline's section of ``config``, reading as many batches per step as its task declares."""
    return InputConfig.of(config, get_task(config.task).batches_per_step(config))
