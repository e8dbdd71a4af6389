"""tfgpu.training.restore: evaluate, export and sample open a finished run through one helper, so a directory that
is not a run, or a run of the wrong task, is the same one line in all three."""
import importlib

import pytest

from tfgpu import config as config_lib
from tfgpu import config_sources
from tfgpu.training import run_dir

COMMANDS = ("evaluate", "export", "sample")


def _errors(name, argv, capsys):
    code = importlib.import_module(f"tfgpu.{name}").main(list(argv))
    return code, [line for line in capsys.readouterr().err.splitlines() if line.strip()]


@pytest.mark.parametrize("name", COMMANDS)
def test_a_directory_that_is_not_a_run_is_the_same_line_in_every_command(name, tmp_path, capsys):
    code, err = _errors(name, [f"--model_dir={tmp_path}"], capsys)
    assert code == 1 and err == [f"error: --model_dir: {tmp_path}/config.yaml not found: '{tmp_path}' is not a "
                                 "tfgpu run directory"]


def test_sample_names_the_task_of_a_run_that_is_not_a_gan(tmp_path, capsys):
    config_sources.save_yaml(config_lib.Config(model_dir=str(tmp_path), dataset="digits", model="small_cnn"),
                         run_dir.config_yaml(tmp_path))
    code, err = _errors("sample", [f"--model_dir={tmp_path}"], capsys)
    assert code == 1 and err == [f"error: --model_dir: {tmp_path} is a classification run, not a GAN run"]
