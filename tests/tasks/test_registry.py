"""Finding a task by --task name (tfgpu.tasks.registry), and the batches per step its declaration gives the input
pipeline's section."""
import dataclasses

import pytest

from tfgpu import config_sources
from tfgpu.tasks.registry import get_task, input_config


def test_batches_per_step_is_the_tasks_declaration():
    config = config_sources.build(model_dir="x", dataset="digits", task="gan", n_critic=3, global_batch_size=8)
    assert input_config(config).batches_per_step == 3 and input_config(config).examples_per_step == 24
    assert input_config(dataclasses.replace(config, task="classification")).batches_per_step == 1


def test_an_unknown_task_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown task 'segmentation'; known tasks: .*classification.*gan"):
        get_task("segmentation")


def test_the_task_flags_help_names_every_registered_task():
    """tfgpu.config is a leaf and cannot read the registry: a task's name in --task's help is kept true here."""
    import re

    from tfgpu.config import Config
    from tfgpu.tasks import base
    from tfgpu.tasks.registry import _import_tasks

    _import_tasks()
    (field,) = [f for f in dataclasses.fields(Config) if f.name == "task"]
    registered = {name for name, task in base._TASKS.items() if task.__module__.startswith("tfgpu.tasks")}
    assert set(re.findall(r"(\w+)(?: \(|,| or|\.$)", field.metadata["help"].split(": ", 1)[1])) == registered
