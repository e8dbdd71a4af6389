"""Finding a task by --task name (tfgpu.tasks.registry), and the batches per step its declaration gives the input
pipeline's section."""
import dataclasses

import pytest

from tfgpu.config import Config
from tfgpu.tasks.registry import get_task, input_config


def test_batches_per_step_is_the_tasks_declaration():
    config = Config(model_dir="x", dataset="digits", task="gan", n_critic=3, global_batch_size=8)
    assert input_config(config).batches_per_step == 3 and input_config(config).examples_per_step == 24
    assert input_config(dataclasses.replace(config, task="classification")).batches_per_step == 1


def test_an_unknown_task_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown task 'segmentation'; known tasks: .*classification.*gan"):
        get_task("segmentation")
