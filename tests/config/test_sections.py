"""tfgpu.config.sections: each subsystem's slice of the Config holds the options the user set, and only narrows."""
import dataclasses
import typing

import pytest

from tfgpu import config as config_lib
from tfgpu.config import SECTIONS, InputConfig, RuntimeConfig, TrainerConfig

DERIVED = {"batches_per_step"}  # not options: the task declares it (tfgpu.tasks.registry.input_config)


def test_every_section_field_is_an_option_of_the_same_type():
    """A section only narrows: each field is a Config option (or a derived value) with the option's type."""
    options = typing.get_type_hints(config_lib.Config)
    for section in SECTIONS:
        for f in dataclasses.fields(section):
            if f.name in DERIVED or isinstance(getattr(config_lib.Config, f.name, None), property):
                continue
            assert f.name in options and typing.get_type_hints(section)[f.name] == options[f.name], \
                (section.__name__, f.name)


def test_a_section_holds_the_values_the_user_set():
    config = config_lib.Config(num_gpus=3, cpu_logical_devices=2, steps_per_loop=7, model_dir="/tmp/run")
    runtime = RuntimeConfig.of(config)
    assert (runtime.num_gpus, runtime.cpu_logical_devices) == (3, 2)
    trainer = TrainerConfig.of(config)
    assert (trainer.steps_per_loop, trainer.model_dir) == (7, "/tmp/run")
    with pytest.raises(dataclasses.FrozenInstanceError):
        trainer.steps_per_loop = 1  # a slice is as frozen as its Config


def test_the_input_section_takes_the_task_s_batches_per_step_and_counts_a_step_s_examples():
    config = config_lib.Config(global_batch_size=48)
    inputs = InputConfig.of(config, batches_per_step=3)  # a GAN's critic steps read 3 batches per step
    assert (inputs.batches_per_step, inputs.examples_per_step) == (3, 144)
    with pytest.raises(TypeError):
        InputConfig.of(config)  # not an option: the caller must say it
