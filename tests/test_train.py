"""The entrypoint: flag sources and precedence, and bad input stopping the run with a clear error."""
import os

import pytest
import yaml

from tfgpu import train

DIGITS = ["--dataset=digits", "--model=small_cnn"]


def test_command_line_wins_over_flagfile_wherever_it_appears(tmp_path):
    flagfile = tmp_path / "job.flags"
    flagfile.write_text("# comment\n--global_batch_size=32\n--model=resnet20\n--dataset=digits\n")
    config = train.parse(["--global_batch_size=16", f"--flagfile={flagfile}", f"--model_dir={tmp_path}"])
    assert config.global_batch_size == 16
    assert config.model == "resnet20"


def test_nested_flagfile_is_found_next_to_the_including_file(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "base.flags").write_text("--dataset=digits\n--steps_per_loop=7\n")
    (tmp_path / "sub" / "job.flags").write_text("--flagfile=base.flags\n--steps_per_loop=9\n")
    config = train.parse([f"--flagfile={tmp_path / 'sub' / 'job.flags'}", f"--model_dir={tmp_path}"])
    assert config.steps_per_loop == 9  # the including file's later line wins
    assert config.dataset == "digits"


def test_yaml_config_is_lowest_precedence(tmp_path):
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({"global_batch_size": 8, "seed": 3, "dataset": "digits"}))
    (tmp_path / "f.flags").write_text("--seed=5\n")
    config = train.parse([f"--config={tmp_path / 'c.yaml'}", f"--flagfile={tmp_path / 'f.flags'}",
                          f"--model_dir={tmp_path}"])
    assert (config.global_batch_size, config.seed) == (8, 5)


def test_lists_and_booleans_parse(tmp_path):
    config = train.parse(DIGITS + ["--lr_decay_epochs=30,60", "--nodeterministic", "--jit_compile",
                                   f"--model_dir={tmp_path}"])
    assert config.lr_decay_epochs == (30.0, 60.0)
    assert config.jit_compile and not config.deterministic


def test_helpfull_groups_flags_by_module():
    text = train.help_text()
    for group in ("tfgpu.distribute", "tfgpu.precision", "tfgpu.data", "tfgpu.optimizer"):
        assert group in text
    assert "--global_batch_size" in text and "Examples per optimizer step" in text


@pytest.mark.parametrize("args, flag", [
    (["--model=resnet9000"], "--model"),
    (["--global_batch_size=-4"], "--global_batch_size"),
    (["--precision=float8"], "--precision"),
    (["--flagfile=/nonexistent/job.flags"], "--flagfile"),
    (["--learning_rat=0.1"], "learning_rat"),
    (["--global_batch_size=abc"], "--global_batch_size"),
])
def test_bad_flags_fail_fast_naming_the_flag(args, flag, tmp_path, capsys):
    assert train.main(DIGITS + [f"--model_dir={tmp_path}"] + args) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and flag in err[0], err


def test_unwritable_model_dir_is_refused(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert train.main(DIGITS + [f"--model_dir={blocker}/run"]) == 1
    err = capsys.readouterr().err
    assert "--model_dir" in err and "not writable" in err


def test_batch_not_divisible_by_replicas_exits_nonzero(run_train, tmp_path):
    proc = run_train(*DIGITS, "--global_batch_size=33", "--cpu_logical_devices=2",
                 "--distribution_strategy=mirrored", f"--model_dir={tmp_path}", check=False, timeout=120)
    assert proc.returncode == 1
    assert "error: --global_batch_size: 33 is not divisible by the 2 replicas" in proc.output
    assert not os.path.exists(tmp_path / "checkpoints")


def test_effective_config_is_written_and_replays(run_train, tmp_path):
    run_dir = tmp_path / "run"
    run_train(*DIGITS, "--train_steps=3", "--steps_per_loop=3", "--global_batch_size=32", "--eval_steps=1",
          f"--model_dir={run_dir}", timeout=180)
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["train_steps"] == 3 and saved["model"] == "small_cnn"
    again = train.parse([f"--config={run_dir / 'config.yaml'}"])
    assert again.to_dict() == saved
