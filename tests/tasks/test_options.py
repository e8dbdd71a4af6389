"""tfgpu.tasks.options: each task's options section becomes flat flags of its own group; an option of one task
given to another is one line naming it; config.yaml files from before the sections load unchanged."""
import dataclasses
import pathlib
import re

import pytest
import yaml

from tfgpu import config_sources, train
from tfgpu.config import ConfigError
from tfgpu.tasks.options import SECTIONS
from tfgpu.runtime import run_dir

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures"
TASK_OPTIONS = [(task, f) for task, section in SECTIONS.items() for f in dataclasses.fields(section)]
CLASSIFIER = ["--dataset=digits", "--model=small_cnn", "--model_dir=/runs/classifier"]


@pytest.mark.parametrize("task, field", TASK_OPTIONS, ids=[f.name for _, f in TASK_OPTIONS])
def test_every_task_option_is_a_train_flag_in_its_tasks_group(task, field):
    """--help lists it, with its help text, under its task's group (e.g. tfgpu.gan flags)."""
    sections = re.split(r"\n(?=tfgpu\.\w+ flags)", train.help_text())
    group = next(s for s in sections if s.startswith(f"tfgpu.{field.metadata['group']} flags"))
    assert re.search(rf"--(\[no\])?{field.name}\b", group), field.name
    assert " ".join(field.metadata["help"].split()[:3]) in " ".join(group.split()), field.name


@pytest.mark.parametrize("task, field", TASK_OPTIONS, ids=[f.name for _, f in TASK_OPTIONS])
def test_a_task_option_given_to_another_task_is_one_line_naming_it(task, field, capsys):
    value = {bool: "true", int: "2", float: "0.5"}.get(type(field.default), "x.py:build")
    if field.metadata["choices"]:
        value = field.metadata["choices"][-1]
    assert train.main(CLASSIFIER + [f"--{field.name}={value}"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: --{field.name}: is for --task={task}; this run is --task=classification"]


def test_a_classifier_config_yaml_written_before_sections_loads_unchanged(tmp_path):
    """Earlier runs recorded every option flat, the GAN's at their defaults too: such a file still replays, and
    the run it gives records its own task's options only."""
    path = FIXTURES / "classification_config_before_task_sections.yaml"
    config = config_sources.resolve({}, str(path), references=False)
    assert (config.task, config.model, config.seed, config.task_options) == ("classification", "small_cnn", 7, None)
    config_sources.save_yaml(config, run_dir.config_yaml(tmp_path))
    written = yaml.safe_load((tmp_path / run_dir.CONFIG_FILE).read_text())
    assert "n_critic" not in written and written["seed"] == 7


def test_another_tasks_option_set_in_a_config_yaml_names_the_file_and_the_option(tmp_path):
    text = (FIXTURES / "classification_config_before_task_sections.yaml").read_text()
    path = tmp_path / run_dir.CONFIG_FILE
    path.write_text(text.replace("n_critic: 1\n", "n_critic: 5\n"))
    with pytest.raises(ConfigError) as error:
        config_sources.resolve({}, str(path), references=False)
    assert str(error.value) == f"--config: {path}: n_critic: is for --task=gan; this run is --task=classification"
    assert config_sources.resolve({"task": "gan", "model": "dcgan"}, str(path), references=False) \
        .task_options.n_critic == 5  # the same file with --task=gan on the command line is a GAN run
