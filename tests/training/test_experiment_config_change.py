"""experiment.setup compares a resume's configuration with the run's recorded config.yaml before it builds
anything (tfgpu.training.config_change): a change to what is trained stops in one line, an allowed one is
recorded in history.jsonl and the report."""
import json

import keras
import pytest
import yaml

from tests.training.model_files import NET
from tfgpu import config as config_lib
from tfgpu import config_sources
from tfgpu.config import ConfigError
from tfgpu.runtime import run_dir
from tests.conftest import read_history

TINY = ["--dataset=digits", "--model=small_cnn", "--eval_split=none", "--steps_per_loop=1", "--tensorboard=false",
        "--verbose=2"]


def test_a_refused_resume_stops_before_the_strategy_and_keeps_the_recorded_config(tmp_path, monkeypatch):
    import tensorflow as tf

    from tfgpu.runtime import distribute
    from tfgpu.training import experiment

    recorded = config_lib.Config(model_dir=str(tmp_path), dataset="digits", model="small_cnn", global_batch_size=32)
    config_sources.save_yaml(recorded, run_dir.config_yaml(tmp_path))
    before = (tmp_path / run_dir.CONFIG_FILE).read_text()
    step = tf.Variable(40, dtype=tf.int64)
    tf.train.CheckpointManager(tf.train.Checkpoint(step=step), run_dir.checkpoints(tmp_path), 1).save(40)

    def built(*args, **kwargs):
        raise AssertionError("the strategy was built for a refused resume")

    monkeypatch.setattr(distribute, "build_strategy", built)
    with pytest.raises(ConfigError, match=r"global_batch_size 32 -> 16\. Pass --allow_config_change=global_"):
        experiment.setup(config_lib.Config(model_dir=str(tmp_path), dataset="digits", model="small_cnn",
                                           global_batch_size=16))
    assert (tmp_path / run_dir.CONFIG_FILE).read_text() == before


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
    assert failed and yaml.safe_load((model_dir / run_dir.CONFIG_FILE).read_text())["model"] == "small_cnn"
    assert read_history(model_dir, "config_change") == []

    out = train_here(*TINY, "--global_batch_size=16", "--train_steps=4", "--allow_config_change=global_batch_size",
                     f"--model_dir={model_dir}").output
    assert "resuming at step 2 with a changed config (--allow_config_change): global_batch_size 32 -> 16" in out
    (record,) = read_history(model_dir, "config_change")
    assert (record["step"], record["field"], record["old"], record["new"]) == (2, "global_batch_size", 32, 16)
    assert json.loads((model_dir / "metrics.json").read_text())["step"] == 4
    assert yaml.safe_load((model_dir / run_dir.CONFIG_FILE).read_text())["global_batch_size"] == 16
    assert "| 2 | global_batch_size | 32 | 16 |" in (model_dir / "report.md").read_text()


# -- resume only the same model; a refused resume writes nothing (issue 37 items 4, 5) -------------------------------
# The edit: another activation and another pooling layer, the same variables.
EDITED = NET.replace('activation="relu"', 'activation="gelu"').replace("GlobalAveragePooling2D", "GlobalMaxPooling2D")


def _files(model_dir) -> dict:
    """{path: bytes} of every file under ``model_dir``: a refused resume must leave this unchanged."""
    return {str(p.relative_to(model_dir)): p.read_bytes() for p in sorted(model_dir.rglob("*")) if p.is_file()}


def _write_model_file(path, text, monkeypatch):
    """Writes the user's model file and forgets the module this process imported from it (a new process would
    import the file afresh)."""
    import sys

    from tfgpu.models import user

    path.write_text(text)
    monkeypatch.setattr(user, "_LOADED", {})
    for name in [n for n in sys.modules if n.startswith(f"tfgpu_user_{path.stem}_")]:
        monkeypatch.delitem(sys.modules, name)


def _refused(train_here, *args) -> str:
    result = train_here(*args, check=False)
    assert result.returncode == 1 and "Traceback" not in result.output, result.output[-3000:]
    (error,) = [line for line in result.output.splitlines() if line.startswith("error:")]
    return error


@pytest.mark.slow  # five runs (about 30 s on 2 loaded cores); the refusal alone runs by default, below
def test_an_edited_model_file_is_refused_naming_what_changed_until_allowed(train_here, tmp_path, monkeypatch):
    """Train with --model=net.py:build, edit an activation and the pooling layer, rerun: it resumed at step 2 and
    model_source.json took the new file's sha256. Now: one line naming both, nothing written; allowed, the change
    is recorded in history.jsonl and the report, and the next resume of the edited model is the same model."""
    net, run = tmp_path / "net.py", tmp_path / "run"
    _write_model_file(net, NET, monkeypatch)
    args = [*TINY, f"--model={net}:build", "--global_batch_size=32", "--tensorboard=true", f"--model_dir={run}"]
    train_here(*args, "--train_steps=2")
    source = run / "model_source.json"
    recorded = source.stat().st_ino, source.read_bytes()
    train_here(*args, "--train_steps=3")  # unchanged: resumes, and leaves the recorded source as it was
    assert (source.stat().st_ino, source.read_bytes()) == recorded

    _write_model_file(net, EDITED, monkeypatch)
    before = _files(run)
    error = _refused(train_here, *args, "--train_steps=4")
    assert error.startswith(f"error: --allow_config_change: {run} resumes at step 3 a checkpoint of another model: "
                            "layer 'conv' activation changed: 'relu' -> 'gelu'; layer 'pool' changed: "
                            "GlobalAveragePooling2D -> GlobalMaxPooling2D; --model file "), error
    assert "Pass --allow_config_change=model to resume with the changed model" in error
    assert _files(run) == before and source.stat().st_ino == recorded[0]

    out = train_here(*args, "--train_steps=4", "--allow_config_change=model").output
    assert "resuming at step 3 with a changed config (--allow_config_change): layer 'pool' changed: " \
           "GlobalAveragePooling2D -> GlobalMaxPooling2D" in out
    changes = read_history(run, "config_change")
    assert [(r["step"], r["field"], r["old"], r["new"]) for r in changes][:2] == [
        (3, "model", "layer 'conv' activation: 'relu'", "layer 'conv' activation: 'gelu'"),
        (3, "model", "layer 'pool': GlobalAveragePooling2D", "layer 'pool': GlobalMaxPooling2D")]
    assert "| 3 | model | layer 'pool': GlobalAveragePooling2D | layer 'pool': GlobalMaxPooling2D |" in \
        (run / "report.md").read_text()
    assert json.loads(source.read_text())["model"]["sha256"] != json.loads(recorded[1])["model"]["sha256"]
    train_here(*args, "--train_steps=5")  # the checkpoints now record the edited model


def _converted(tmp_path, name: str, num_shards: int) -> str:
    """A small dataset converted by tfgpu.convert (64 records of 8x8x1, 10 classes)."""
    import numpy as np

    from tfgpu import convert

    rng = np.random.default_rng(0)
    arrays = tmp_path / f"{name}.npz"
    np.savez(arrays, x=rng.integers(0, 256, (64, 8, 8, 1), dtype=np.uint8), y=np.arange(64) % 10)
    out = tmp_path / name
    assert convert.main([f"--source={arrays}", f"--output_dir={out}", f"--num_shards={num_shards}"]) == 0
    return str(out)


@pytest.mark.parametrize("refusal", ["model", *(pytest.param(r, marks=pytest.mark.slow)
                                                for r in ("config", "data", "checkpoint"))])
def test_every_refused_resume_leaves_the_model_dir_byte_identical(train_here, tmp_path, monkeypatch, refusal):
    """config.yaml (its safe fields, e.g. train_steps, were rewritten), history.jsonl, metrics.json, the
    checkpoints, model_source.json and TensorBoard's files, whatever refused the resume: a changed option, a
    changed model, other records under the same --data_dir, a checkpoint the allowed model cannot take."""
    import shutil

    from tfgpu.training import experiment

    monkeypatch.setattr(experiment, "_write_report", lambda model_dir: None)  # its plots take seconds
    net, run = tmp_path / "net.py", tmp_path / "run"
    _write_model_file(net, NET, monkeypatch)
    data = _converted(tmp_path, "data", num_shards=2)
    args = [*TINY[1:], f"--data_dir={data}", "--global_batch_size=16", "--tensorboard=true", f"--model_dir={run}"]
    train_here(*args, f"--model={net}:build", "--train_steps=2")
    before = _files(run)
    again = [*args, f"--model={net}:build", "--train_steps=6"]
    if refusal == "config":
        error = _refused(train_here, *args, f"--model={net}:build", "--train_steps=6", "--global_batch_size=8")
        assert "global_batch_size 16 -> 8" in error
    elif refusal == "model":
        _write_model_file(net, EDITED, monkeypatch)
        assert "a checkpoint of another model: layer 'conv' activation" in _refused(train_here, *again)
    elif refusal == "data":
        shutil.rmtree(data)
        shutil.move(_converted(tmp_path, "other", num_shards=3), data)
        assert "is not the one" in _refused(train_here, *again)
    else:
        error = _refused(train_here, *args, "--model=small_cnn", "--train_steps=6", "--allow_config_change=model")
        assert "does not fit the model built here" in error
    assert _files(run) == before


@pytest.mark.slow  # three runs, 70 steps (the property test in tests/test_durations.py runs by default)
def test_epochs_count_each_segment_at_its_own_global_batch(train_here, tmp_path, monkeypatch):
    """The issue's case on the digits (1,438 train records): 10 steps of 24, then --global_batch_size=48 allowed and
    --train=1ep. It ran ceil(1438 / 48) = 30 steps in all, 1,198 records, and said "(1.00 epochs)"; a target met at
    step 12 said 0.40 epochs where (240 + 2 * 48) / 1438 = 0.23 were trained."""
    from tfgpu.training import experiment

    monkeypatch.setattr(experiment, "_write_report", lambda model_dir: None)  # its plots take seconds
    run = tmp_path / "run"
    common = ["--dataset=digits", "--model=small_cnn", "--steps_per_loop=2", "--tensorboard=false", "--verbose=2",
              f"--model_dir={run}"]
    train_here(*common, "--global_batch_size=24", "--train_steps=10", "--eval_split=none")
    wider = [*common, "--global_batch_size=48", "--allow_config_change=global_batch_size", "--train=1ep"]
    train_here(*wider, "--target=val_accuracy:0.0", "--eval_every_steps=12")
    metrics = json.loads((run / "metrics.json").read_text())
    assert (metrics["step_at_target"], metrics["epochs_at_target"]) == (12, round((240 + 2 * 48) / 1438, 2))
    out = train_here(*wider).output
    assert "35 steps of 48 examples (1.00 epochs)" in out  # 10 + ceil((1438 - 240) / 48)
    assert json.loads((run / "metrics.json").read_text())["step"] == 35


@pytest.mark.slow  # two runs, 35 steps (tests/test_durations.py holds the property, by default)
def test_an_evaluation_every_half_epoch_falls_where_the_records_end_after_a_batch_change(train_here, tmp_path,
                                                                                      monkeypatch):
    """The digits' 1,438 train records: 10 steps of 24 (240 records), then --global_batch_size=48 allowed,
    --train=1ep and --eval_every=0.5ep. Half an epoch (719 records) is reached at step 10 + 479 / 48 = 20, the
    epoch at 35; the new batch's 15 steps per half epoch counted from step 0 evaluated at 15 and 30 (560 and 1,280
    records)."""
    from tfgpu.training import experiment

    monkeypatch.setattr(experiment, "_write_report", lambda model_dir: None)  # its plots take seconds
    run = tmp_path / "run"
    common = ["--dataset=digits", "--model=small_cnn", "--steps_per_loop=5", "--tensorboard=false", "--verbose=2",
              "--checkpoint_every_steps=0", f"--model_dir={run}"]
    train_here(*common, "--global_batch_size=24", "--train_steps=10", "--eval_split=none")
    train_here(*common, "--global_batch_size=48", "--allow_config_change=global_batch_size", "--train=1ep",
               "--eval_every=0.5ep")
    assert [r["step"] for r in read_history(run, "eval")] == [20, 35]
