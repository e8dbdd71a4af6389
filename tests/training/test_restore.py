"""tfgpu.training.restore: evaluate, export and sample open a finished run through one helper, so a directory that
is not a run, or a run of the wrong task, is the same one line in all three."""
import importlib

import pytest

from tests.training.model_files import NET
from tfgpu import config as config_lib
from tfgpu import config_sources
from tfgpu.runtime import run_dir

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




@pytest.mark.parametrize("name", COMMANDS)
def test_a_builder_file_inside_the_run_directory_is_not_imported_unless_the_command_line_names_it(name, tmp_path,
                                                                                              capsys):
    """config.yaml names a --model file inside the run directory: whoever can write the run directory could have put
    both there. Refused in one line (nothing imported) unless the command line passes it too."""
    planted = tmp_path / "net.py"
    planted.write_text(NET + "\nopen(__file__ + '.ran', 'w').close()\n")
    reference = f"{planted}:build"
    config_sources.save_yaml(config_lib.Config(model_dir=str(tmp_path), dataset="digits", model=reference,
                                               task="gan" if name == "sample" else "classification"),
                             run_dir.config_yaml(tmp_path))
    code, err = _errors(name, [f"--model_dir={tmp_path}"], capsys)
    assert code == 1 and err == [f"error: --model: {tmp_path}/config.yaml names {reference!r}, code inside the run "
                                 f"directory ({planted}), which is not imported from there: pass "
                                 f"--model={reference} if you trust it"]
    assert not (tmp_path / "net.py.ran").exists()


def test_a_builder_file_inside_the_run_directory_passed_on_the_command_line_is_imported(tmp_path):
    from tfgpu.training import restore

    planted = tmp_path / "net.py"
    planted.write_text(NET)
    reference = f"{planted}:build"
    config_sources.save_yaml(config_lib.Config(model_dir=str(tmp_path), dataset="digits", model=reference),
                             run_dir.config_yaml(tmp_path))
    parser = restore.parser("tfgpu.evaluate", "", "", "to evaluate")
    assert restore.run_config(str(tmp_path), parser.parse_args([f"--model_dir={tmp_path}",
                                                                f"--model={reference}"])).model == reference


@pytest.mark.slow  # a run and three restores (13 s loaded); the refusal's line runs by default in test_config_change.py
def test_evaluate_and_export_refuse_a_model_that_is_not_the_checkpoints_until_allowed(train_here, tmp_path,
                                                                                       monkeypatch, capsys):
    """An edited --model file with the same variables (another activation) restored silently: evaluate gave the
    metrics of a model that was never trained, export wrote it. Now one line naming the change and the flag,
    nothing restored or written; --allow_config_change=model evaluates the changed model."""
    import sys

    from tfgpu.models import user
    from tfgpu.training import experiment

    def write(text):  # a new process would import the edited file afresh
        net.write_text(text)
        monkeypatch.setattr(user, "_LOADED", {})
        for name in [n for n in sys.modules if n.startswith("tfgpu_user_net_")]:
            monkeypatch.delitem(sys.modules, name)

    monkeypatch.setattr(experiment, "_write_report", lambda model_dir: None)  # its plots take seconds
    net, run = tmp_path / "net.py", tmp_path / "run"
    write(NET)
    train_here("--dataset=digits", f"--model={net}:build", "--global_batch_size=16", "--train_steps=2",
               "--steps_per_loop=1", "--tensorboard=false", "--verbose=0", f"--model_dir={run}")
    write(NET.replace('activation="relu"', 'activation="gelu"'))
    for name in ("evaluate", "export"):
        code, err = _errors(name, [f"--model_dir={run}", f"--output={tmp_path / 'm.keras'}"][:1 + (name == "export")],
                            capsys)
        assert code == 1 and len(err) == 1, err
        assert err[0].startswith(f"error: --allow_config_change: {run}/checkpoints/ckpt-2 was saved by another model "
                                 "than the one built now: layer 'conv' activation changed: 'relu' -> 'gelu'")
        assert err[0].endswith(f"pass --allow_config_change=model to {name} it with the changed model")
    assert not (tmp_path / "m.keras").exists() and not list(run.glob("eval*"))
    code, _ = _errors("evaluate", [f"--model_dir={run}", "--allow_config_change=model",
                                   f"--output_json={tmp_path / 'e.json'}"], capsys)
    assert code == 0 and (tmp_path / "e.json").exists()
