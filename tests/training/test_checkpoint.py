"""Restoring a checkpoint trusts nothing: one that another model, task or head wrote, a truncated or corrupt file,
a directory or a file that is no checkpoint each stop with one ConfigError naming the checkpoint and the first
variable that does not fit. The checkpoints here are written with TensorFlow and Keras directly, not by tfgpu.
Each checkpoint tfgpu writes holds the data position and topology that trained it; older ones restore without."""
import os
import re

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tfgpu.config import ConfigError
from tfgpu.runtime.distribute import Placement
from tfgpu.training import checkpoint
from tfgpu.runtime import run_dir


def _classifier(classes: int, hidden: int = 6):
    """A checkpoint root shaped like a classification run's: step, model, optimizer (built, so it has slots)."""
    import keras
    import tensorflow as tf

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(hidden, name="features"),
                              keras.layers.Dense(classes, name="logits")])
    optimizer = keras.optimizers.SGD(momentum=0.9)
    optimizer.build(model.trainable_variables)
    return tf.train.Checkpoint(step=tf.Variable(0, dtype=tf.int64), model=model, optimizer=optimizer)


def _saved(root, directory) -> str:
    """Writes ``root`` as a checkpoint (step 7) the way a TensorFlow user would; returns its prefix."""
    root.step.assign(7)
    return root.save(os.path.join(directory, "ckpt"))


def test_a_checkpoint_of_the_same_model_restores_its_values(tmp_path):
    written = _classifier(10)
    path = _saved(written, tmp_path)
    into = _classifier(10)
    checkpoint.restore(into, path, "checkpoint")
    assert int(into.step.numpy()) == 7
    for ours, theirs in zip(into.model.weights, written.model.weights):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


@settings(max_examples=12, deadline=None)
@given(written=st.integers(2, 12), built=st.integers(2, 12))
def test_another_head_is_named_with_both_shapes(tmp_path_factory, written, built):
    """Whatever the head's width in the checkpoint and in the model, a difference names the head's kernel."""
    path = _saved(_classifier(written), tmp_path_factory.mktemp("ckpt"))
    into = _classifier(built)
    if written == built:
        checkpoint.restore(into, path, "checkpoint")
        return
    with pytest.raises(ConfigError) as error:
        checkpoint.restore(into, path, "checkpoint")
    assert str(error.value).startswith(f"--checkpoint: checkpoint {path} does not fit the model built here: its ")
    assert f"/logits/kernel) has shape [6, {written}], the model built here [6, {built}]" in str(error.value)


def test_a_checkpoint_of_another_task_names_what_it_lacks_and_holds(tmp_path):
    import keras
    import tensorflow as tf

    generator = keras.Sequential([keras.Input((2,)), keras.layers.Dense(4)])
    path = _saved(tf.train.Checkpoint(step=tf.Variable(0, dtype=tf.int64), generator=generator), tmp_path)
    with pytest.raises(ConfigError, match=r"^--model_dir: checkpoint .* does not fit the model built here: it has "
                       r"no 'model', 'optimizer' \(it holds generator, save_counter, step\); it was written by "
                       r"another model, task or dataset: train this model into a new --model_dir$"):
        checkpoint.restore(_classifier(10), path, "model_dir")


def test_a_checkpoint_missing_a_variable_names_it(tmp_path):
    """A model one layer shorter: the variable the checkpoint lacks, by the checkpoint's name and the layer's."""
    import keras
    import tensorflow as tf

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(6, name="features")])
    optimizer = keras.optimizers.SGD(momentum=0.9)
    optimizer.build(model.trainable_variables)
    path = _saved(tf.train.Checkpoint(step=tf.Variable(0, dtype=tf.int64), model=model, optimizer=optimizer),
                  tmp_path)
    with pytest.raises(ConfigError, match=r"it has no variable optimizer/_trainable_variables/2 \(\S*/logits/kernel\) "
                       r"\(shape \[6, 10\]\)"):
        checkpoint.restore(_classifier(10), path, "checkpoint")


@pytest.mark.parametrize("damage, message", [
    ("truncate_index", "is not a readable checkpoint"),
    ("truncate_data", "cannot be restored"),
    ("not_a_checkpoint", "is not a readable checkpoint"),
    ("nothing_there", "is not a readable checkpoint"),
])
def test_an_unreadable_checkpoint_is_one_line_naming_it(tmp_path, damage, message):
    path = _saved(_classifier(10), tmp_path)
    data = f"{path}.data-00000-of-00001"
    if damage == "truncate_index":
        with open(f"{path}.index", "r+b") as f:
            f.truncate(os.path.getsize(f"{path}.index") // 2)
    elif damage == "truncate_data":
        with open(data, "r+b") as f:
            f.truncate(os.path.getsize(data) // 2)
    elif damage == "not_a_checkpoint":
        path = str(tmp_path / "history.jsonl")
        with open(path, "w") as f:
            f.write('{"kind": "train", "step": 1}\n')
    else:
        path = str(tmp_path / f"{run_dir.CHECKPOINT_PREFIX}99")
    with pytest.raises(ConfigError) as error:
        checkpoint.restore(_classifier(10), path, "checkpoint")
    text = str(error.value)
    assert text.startswith("--checkpoint: ") and path in text and message in text and "\n" not in text


def test_a_directory_names_the_checkpoint_inside_or_that_there_is_none(tmp_path):
    path = _saved(_classifier(10), tmp_path / "run")
    with pytest.raises(ConfigError, match=rf"is a directory, not a checkpoint; pass a checkpoint's prefix, e.g. "
                       rf"{path}$"):
        checkpoint.restore(_classifier(10), str(tmp_path / "run"), "checkpoint")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"is a directory, not a checkpoint; it holds no checkpoint$"):
        checkpoint.restore(_classifier(10), str(tmp_path / "empty"), "checkpoint")


def test_a_state_file_naming_deleted_files_or_garbled_is_refused_not_restarted_from_zero(tmp_path):
    path = _saved(_classifier(10), tmp_path / run_dir.CHECKPOINTS_DIR)
    assert checkpoint.latest(str(tmp_path)) == path
    state = (tmp_path / run_dir.CHECKPOINTS_DIR / run_dir.CHECKPOINT_STATE_FILE).read_text()
    (tmp_path / run_dir.CHECKPOINTS_DIR / run_dir.CHECKPOINT_STATE_FILE).write_text("model_checkpoint_path: {")
    with pytest.raises(ConfigError, match=r"^--model_dir: .*/checkpoint is unreadable; put back an intact copy"):
        checkpoint.latest(str(tmp_path))
    (tmp_path / run_dir.CHECKPOINTS_DIR / run_dir.CHECKPOINT_STATE_FILE).write_text(state)
    for name in os.listdir(tmp_path / run_dir.CHECKPOINTS_DIR):
        if name.startswith(os.path.basename(path) + "."):
            os.remove(tmp_path / run_dir.CHECKPOINTS_DIR / name)
    with pytest.raises(ConfigError, match=r"^--model_dir: .*/checkpoint names .*" + re.escape(os.path.basename(path))
                       + ", whose files are missing"):
        checkpoint.latest(str(tmp_path))
    assert checkpoint.latest(str(tmp_path / "fresh")) is None



def _checkpointer(model_dir, step, weights, record=None):
    import tensorflow as tf

    placement = Placement(tf.distribute.get_strategy(), "one_device", 1, 1, 0, True, ("/cpu:0",), False)
    return checkpoint.Checkpointer(str(model_dir), placement, {"weights": weights}, step, keep=2,
                                       data_position=(lambda: record) if record is not None else None)


def test_each_checkpoint_restores_the_data_position_saved_with_it(tmp_path):
    import tensorflow as tf

    step, weights = tf.Variable(0, dtype=tf.int64), tf.Variable([1.0, 2.0])
    records = {}
    writer = _checkpointer(tmp_path, step, weights, record=None)
    writer.data_position.current = lambda: records[int(step.numpy())]
    for at in (10, 20):
        step.assign(at)
        records[at] = {"version": 1, "epoch": 0, "stages": [[2, at * 12]]}
        writer.save()
    step.assign(0)
    reader = _checkpointer(tmp_path, step, weights)
    assert reader.restore_latest() == 20 and reader.data_position.restored == records[20]
    assert reader.restore(run_dir.checkpoint(tmp_path, 10), "checkpoint") == 10
    assert reader.data_position.restored == records[10]


def test_a_checkpoint_written_before_the_data_position_restores_without_one(tmp_path):
    import tensorflow as tf

    step, weights = tf.Variable(7, dtype=tf.int64), tf.Variable([3.0, 4.0])
    tf.train.CheckpointManager(tf.train.Checkpoint(step=step, weights=weights), run_dir.checkpoints(tmp_path),
                               max_to_keep=1, step_counter=step).save(checkpoint_number=7)
    step.assign(0)
    weights.assign([0.0, 0.0])
    reader = _checkpointer(tmp_path, step, weights)
    assert not checkpoint.has_data_position(run_dir.checkpoint(tmp_path, 7))
    assert reader.restore_latest() == 7 and reader.data_position.restored is None
    assert weights.numpy().tolist() == [3.0, 4.0]
