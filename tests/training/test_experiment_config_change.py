"""experiment.setup compares a resume's configuration with the run's recorded config.yaml before it builds
anything (tfgpu.training.config_change): a change to what is trained stops in one line, an allowed one is
recorded in history.jsonl and the report."""
import json

import pytest
import yaml

from tfgpu import config as config_lib
from tfgpu import config_sources
from tfgpu.config import ConfigError
from tests.conftest import read_history

TINY = ["--dataset=digits", "--model=small_cnn", "--eval_split=none", "--steps_per_loop=1", "--tensorboard=false",
        "--verbose=2"]


def test_a_refused_resume_stops_before_the_strategy_and_keeps_the_recorded_config(tmp_path, monkeypatch):
    import tensorflow as tf

    from tfgpu.runtime import distribute
    from tfgpu.training import experiment

    recorded = config_lib.Config(model_dir=str(tmp_path), dataset="digits", model="small_cnn", global_batch_size=32)
    config_sources.save_yaml(recorded, str(tmp_path / "config.yaml"))
    before = (tmp_path / "config.yaml").read_text()
    step = tf.Variable(40, dtype=tf.int64)
    tf.train.CheckpointManager(tf.train.Checkpoint(step=step), str(tmp_path / "checkpoints"), 1).save(40)

    def built(*args, **kwargs):
        raise AssertionError("the strategy was built for a refused resume")

    monkeypatch.setattr(distribute, "build_strategy", built)
    with pytest.raises(ConfigError, match=r"global_batch_size 32 -> 16\. Pass --allow_config_change=global_"):
        experiment.setup(config_lib.Config(model_dir=str(tmp_path), dataset="digits", model="small_cnn",
                                           global_batch_size=16))
    assert (tmp_path / "config.yaml").read_text() == before


def test_a_resume_with_another_batch_or_model_is_one_line_until_allowed(train_here, tmp_path):
    """The issue's two cases: --global_batch_size 32 -> 16 resumed silently at the old step, --model changed gave a
    raw ValueError about moving_mean shapes. Both stop in one line; allowed, the batch change trains on and is
    recorded in history.jsonl, the report and config.yaml."""
    model_dir = tmp_path / "run"
    train_here(*TINY, "--global_batch_size=32", "--train_steps=2", f"--model_dir={model_dir}")

    for change, line in (("--global_batch_size=16", "global_batch_size 32 -> 16"),
                         ("--model=resnet20", "model 'small_cnn' -> 'resnet20'")):
        result = train_here(*TINY, "--global_batch_size=32", change, "--train_steps=4", f"--model_dir={model_dir}",
                            check=False)
        assert result.returncode == 1 and "Traceback" not in result.output
        errors = [x for x in result.output.splitlines() if x.startswith("error:")]
        assert len(errors) == 1 and line in errors[0] and "resumes at step 2" in errors[0], result.output[-2000:]

    # Allowed, a change the checkpoint cannot restore into still fails, at the restore, and leaves config.yaml
    # describing the checkpoint, with no record of a change that never trained.
    try:
        failed = train_here(*TINY, "--global_batch_size=32", "--model=resnet20", "--train_steps=4",
                            "--allow_config_change=model", f"--model_dir={model_dir}", check=False).returncode != 0
    except ValueError:  # the restore's own error where checkpoints do not yet name a mismatch in one line
        failed = True
    assert failed and yaml.safe_load((model_dir / "config.yaml").read_text())["model"] == "small_cnn"
    assert read_history(model_dir, "config_change") == []

    out = train_here(*TINY, "--global_batch_size=16", "--train_steps=4", "--allow_config_change=global_batch_size",
                     f"--model_dir={model_dir}").output
    assert "resuming at step 2 with a changed config (--allow_config_change): global_batch_size 32 -> 16" in out
    (record,) = read_history(model_dir, "config_change")
    assert (record["step"], record["field"], record["old"], record["new"]) == (2, "global_batch_size", 32, 16)
    assert json.loads((model_dir / "metrics.json").read_text())["step"] == 4
    assert yaml.safe_load((model_dir / "config.yaml").read_text())["global_batch_size"] == 16
    assert "| 2 | global_batch_size | 32 | 16 |" in (model_dir / "report.md").read_text()
