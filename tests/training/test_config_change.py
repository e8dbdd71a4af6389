"""tfgpu.training.config_change: a resume whose configuration changes what is trained stops in one line naming each
field with its old and new value, unless --allow_config_change lists it; other fields change freely."""
import dataclasses
import json

import hypothesis
import hypothesis.strategies as st
import pytest
import yaml

from tfgpu import config_sources
from tfgpu.config import Config, ConfigError
from tfgpu.training import config_change
from tfgpu.metrics.history import History
from tfgpu.runtime import run_dir

BASE = dict(model_dir="/runs/r", dataset="digits", model="small_cnn", global_batch_size=32)
FIELDS = {name: option.field for name, option in config_sources.options().items()}


def make(**values) -> Config:
    return config_sources.build(**{**BASE, **values})


def value_of(config: Config, name: str):
    """``name``'s value in ``config``; another task's option has its default there."""
    return config.options().get(name, FIELDS[name].default)


def recorded_from(config: Config, step: int = 40, **edits) -> config_change.Recorded:
    """What config.yaml would hold had ``config`` trained to ``step``, with ``edits`` as the recorded values."""
    return config_change.Recorded("/runs/r/config.yaml", {**{name: value_of(config, name) for name in FIELDS}, **edits}, step)


def other_value(name: str, value):
    """A valid value of field ``name`` that differs from ``value``."""
    choices = FIELDS[name].metadata.get("choices")
    if choices:
        return next(c for c in choices if c != value)
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value * 2 + 0.5
    if isinstance(value, tuple):
        return value + (30.0,)
    return value + "-other" if value else "something"


def test_every_option_is_either_compared_or_declared_safe_to_change_once():
    """A new Config field must be placed in TRAINED or SAFE (with its reason) before it can ship."""
    safe = [name for names in config_change.SAFE.values() for name in names]
    placed = list(config_change.TRAINED_FIELDS) + safe
    assert sorted(placed) == sorted(FIELDS), "each field exactly once in TRAINED or SAFE"


@hypothesis.settings(max_examples=60, deadline=None)
@hypothesis.given(name=st.sampled_from(config_change.TRAINED_FIELDS))
def test_a_changed_field_that_changes_what_is_trained_stops_the_resume_naming_old_and_new(name):
    config = make()
    old = other_value(name, value_of(config, name))
    recorded = recorded_from(config, **{name: old})
    with pytest.raises(ConfigError) as e:
        config_change.check(recorded, config)
    message = str(e.value)
    assert "\n" not in message and e.value.flag == "allow_config_change"
    assert config_change.Change(name, old, value_of(config, name)).describe() in message
    assert f"--allow_config_change={name} " in message and "step 40" in message
    # Allowed deliberately, the resume goes on with that one change.
    assert config_change.check(recorded, dataclasses.replace(config, allow_config_change=name)) == [
        config_change.Change(name, old, value_of(config, name))]


@hypothesis.settings(max_examples=60, deadline=None)
@hypothesis.given(name=st.sampled_from([n for names in config_change.SAFE.values() for n in names]))
def test_a_field_that_does_not_change_what_is_trained_may_change_on_any_resume(name):
    config = make()
    assert config_change.check(recorded_from(config, **{name: other_value(name, value_of(config, name))}),
                               config) == []


def test_every_refused_field_is_named_in_the_one_line_and_in_the_fix():
    config = make(global_batch_size=16, model="resnet20", allow_config_change="seed")
    recorded = recorded_from(config, global_batch_size=32, model="small_cnn", seed=7)
    with pytest.raises(ConfigError) as e:
        config_change.check(recorded, config)
    assert str(e.value) == (
        "--allow_config_change: /runs/r resumes at step 40 a run trained with other settings (/runs/r/config.yaml): "
        "model 'small_cnn' -> 'resnet20'; global_batch_size 32 -> 16. Pass "
        "--allow_config_change=global_batch_size,model,seed to resume with the change, or train into a new "
        "--model_dir")


def test_precision_auto_is_compared_once_resolved():
    recorded = recorded_from(make(precision="mixed_bfloat16"))
    assert config_change.check(recorded, make(precision="auto")) == []  # not resolved yet: setup checks again
    assert config_change.check(recorded, make(precision="mixed_bfloat16")) == []
    with pytest.raises(ConfigError, match="precision 'mixed_bfloat16' -> 'float32'"):
        config_change.check(recorded, make(precision="float32"))


def test_a_path_under_another_spelling_is_the_same_data_and_the_same_model_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "data")
    recorded = recorded_from(make(), data_dir=str(tmp_path / "data"), model=f"{tmp_path}/net.py:build")
    same = make(data_dir="./link", model=f"{tmp_path}/./net.py:build")
    assert config_change.changes(recorded, same) == []
    other = make(data_dir=str(tmp_path), model=f"{tmp_path}/net.py:build_other")
    assert [c.field for c in config_change.changes(recorded, other)] == ["model", "data_dir"]


def test_an_unknown_name_to_allow_is_refused_with_close_names():
    with pytest.raises(ConfigError, match=r"^--allow_config_change: 'global_batch' is not an option \(did you mean "
                                          r"global_batch_size"):
        config_change.check_allowed_names(make(allow_config_change="global_batch"))
    config_change.check_allowed_names(make(allow_config_change="global_batch_size, model"))


# -- the recorded config.yaml, as it is found in a model_dir ---------------------------------------------------------
@pytest.fixture
def resumable(tmp_path):
    """A model_dir holding a checkpoint at step 40, as a run leaves it; its config.yaml is the test's to write."""
    import tensorflow as tf

    step = tf.Variable(40, dtype=tf.int64)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(step=step), run_dir.checkpoints(tmp_path), 1)
    manager.save(checkpoint_number=40)
    return tmp_path


def test_a_run_without_a_checkpoint_is_fresh_and_compares_nothing(tmp_path):
    config_sources.save_yaml(make(global_batch_size=64), run_dir.config_yaml(tmp_path))
    assert config_change.read_recorded(str(tmp_path)) is None


def test_an_older_config_yaml_without_newer_fields_reads_them_as_their_defaults(resumable):
    (resumable / run_dir.CONFIG_FILE).write_text(yaml.safe_dump({**BASE, "model_dir": str(resumable)}))
    recorded = config_change.read_recorded(str(resumable))
    assert recorded.step == 40 and recorded.path == run_dir.config_yaml(resumable)
    assert config_change.check(recorded, make(model_dir=str(resumable))) == []


def test_the_recorded_config_yaml_round_trips_to_no_change(resumable):
    config = make(model_dir=str(resumable), lr_decay_epochs=(30.0, 60.0), input_range=(0.0, 1.0))
    config_sources.save_yaml(config, run_dir.config_yaml(resumable))
    assert config_change.check(config_change.read_recorded(str(resumable)), config) == []


def test_a_gan_run_recorded_before_task_sections_resumes_and_its_options_are_compared(resumable):
    """The GAN's options live in its section now; config.yaml an earlier tfgpu wrote (flat keys) still resumes
    unchanged, and a changed --n_critic is named with its recorded and new value."""
    import pathlib

    fixture = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "gan_config_before_task_sections.yaml"
    (resumable / run_dir.CONFIG_FILE).write_text(fixture.read_text())
    recorded = config_change.read_recorded(str(resumable))
    resume = {"model_dir": str(resumable)}
    same = config_sources.resolve(resume, str(fixture), references=False)
    assert config_change.check(recorded, same) == []
    changed = config_sources.resolve({**resume, "n_critic": 5}, str(fixture), references=False)
    with pytest.raises(ConfigError, match=r"n_critic 2 -> 5\. Pass --allow_config_change=n_critic "):
        config_change.check(recorded, changed)


@pytest.mark.parametrize("content, reason", [
    (b"global_batch_size: [32\n", "is not valid YAML"),
    (b"\xff\xfe binary", "is not a UTF-8 text file"),
    (b"- a list\n", "must hold a mapping"),
    (b"name: my-notes\nowner: me\n", "is not a tfgpu config.yaml"),
    (b"model: small_cnn\nglobal_batch_size: thirty-two\n", "global_batch_size: expected int"),
])
def test_a_recorded_config_yaml_that_is_unreadable_or_not_tfgpus_is_one_line_naming_it(resumable, content, reason):
    (resumable / run_dir.CONFIG_FILE).write_bytes(content)
    with pytest.raises(ConfigError, match=reason) as e:
        config_change.read_recorded(str(resumable))
    assert e.value.flag == "model_dir" and run_dir.config_yaml(resumable) in str(e.value)
    assert "\n" not in str(e.value)


def test_an_unreadable_checkpoint_state_file_is_one_line_naming_it(tmp_path):
    (tmp_path / run_dir.CHECKPOINTS_DIR).mkdir()
    (tmp_path / run_dir.CHECKPOINTS_DIR / run_dir.CHECKPOINT_STATE_FILE).write_bytes(b"\xff\xfe\x00 not text")
    with pytest.raises(ConfigError, match="checkpoint is not a checkpoint state file TensorFlow can read") as e:
        config_change.read_recorded(str(tmp_path))
    assert e.value.flag == "model_dir" and run_dir.checkpoint_state(tmp_path) in str(e.value)


def test_an_allowed_change_is_logged_and_recorded_in_history(tmp_path, caplog):
    change = config_change.Change("lr_decay_epochs", (30.0,), (30.0, 60.0))
    config_change.record([change], 40, History(str(tmp_path), enabled=True))
    assert "resuming at step 40 with a changed config (--allow_config_change): lr_decay_epochs 30 -> 30,60" in \
        caplog.text
    (line,) = (tmp_path / "history.jsonl").read_text().splitlines()
    assert {k: v for k, v in json.loads(line).items() if k != "time"} == {
        "kind": "config_change", "step": 40, "field": "lr_decay_epochs", "old": [30.0], "new": [30.0, 60.0]}


def test_a_command_on_a_finished_run_refuses_another_model_in_one_line_unless_allowed():
    """evaluate, export and sample (training/restore.py): the models built now against the checkpoint's record;
    a checkpoint of an older tfgpu (no record) is taken as it is."""
    recorded = {"sources": {"model": {"what": "--model file /x/net.py", "sha256": "a" * 64}}}
    edited = {"sources": {"model": {"what": "--model file /x/net.py", "sha256": "b" * 64}}, "models": {}}
    same = {"sources": recorded["sources"], "models": {}}
    config_change.check_same_model(recorded, same, make(), "/runs/r/checkpoints/ckpt-9", "evaluate")
    config_change.check_same_model(None, edited, make(), "/runs/r/checkpoints/ckpt-9", "evaluate")
    config_change.check_same_model(recorded, edited, make(allow_config_change="model"), "ckpt-9", "export")
    with pytest.raises(ConfigError) as error:
        config_change.check_same_model(recorded, edited, make(), "/runs/r/checkpoints/ckpt-9", "export")
    assert str(error.value) == (
        f"--allow_config_change: /runs/r/checkpoints/ckpt-9 was saved by another model than the one built now: "
        f"--model file /x/net.py changed: sha256 {'a' * 12} -> sha256 {'b' * 12}. Build the model it trained (undo "
        "the edit or the override), or pass --allow_config_change=model to export it with the changed model")
