"""training/summaries.py: TensorBoard scalars under Keras's run names and tags; nothing for a kind without a run."""
import numpy as np
import tensorflow as tf

from tfgpu.training.summaries import Summaries


def _scalars(directory) -> dict:
    found = {}
    for path in tf.io.gfile.glob(f"{directory}/events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                found[(value.tag, event.step)] = float(tf.make_ndarray(value.tensor))
    return found


def test_eval_tags_drop_the_val_prefix_and_only_finite_numbers_are_written(tmp_path):
    summaries = Summaries({"train": str(tmp_path / "train"), "eval": str(tmp_path / "validation")})
    summaries.write("train", 5, {"loss": 0.5, "examples_per_sec": 100, "nan": float("nan"), "flag": True})
    summaries.write("eval", 5, {"val_loss": 0.25, "val_accuracy": 0.75, "note": "text"})
    assert _scalars(tmp_path / "train") == {("loss", 5): 0.5, ("examples_per_sec", 5): 100.0}
    assert _scalars(tmp_path / "validation") == {("loss", 5): 0.25, ("accuracy", 5): 0.75}


def test_without_a_run_for_the_kind_nothing_is_written(tmp_path):
    Summaries({}).write("train", 1, {"loss": 1.0})
    assert list(tmp_path.iterdir()) == []


def test_the_same_names_in_two_runs_and_at_many_steps_land_in_their_own_run(tmp_path):
    """Each kind keeps its own writer; every write is on disk when it returns."""
    summaries = Summaries({"train": str(tmp_path / "train"), "eval": str(tmp_path / "validation")})
    for step in (1, 2, 3):
        summaries.write("train", step, {"loss": float(step), "accuracy": 0.5})
        summaries.write("eval", step, {"val_loss": 10.0 * step, "val_accuracy": 0.25})
    summaries.write("train", 4, {"loss": 4.0})  # another set of names
    assert _scalars(tmp_path / "train") == {**{("loss", s): float(s) for s in (1, 2, 3, 4)},
                                            **{("accuracy", s): 0.5 for s in (1, 2, 3)}}
    assert _scalars(tmp_path / "validation") == {**{("loss", s): 10.0 * s for s in (1, 2, 3)},
                                                 **{("accuracy", s): 0.25 for s in (1, 2, 3)}}


def test_the_scalars_are_what_tf_summary_scalar_writes(tmp_path):
    """TensorBoard and tools reading the events (``tf.summary`` readers, Keras' own runs) find the same value,
    dtype and plugin as ``tf.summary.scalar`` writes."""
    Summaries({"train": str(tmp_path / "ours")}).write("train", 7, {"loss": 0.125})
    with tf.summary.create_file_writer(str(tmp_path / "tf")).as_default(step=7):
        tf.summary.scalar("loss", 0.125)
    tf.summary.flush()

    def values(directory):
        [path] = tf.io.gfile.glob(f"{directory}/events.out.tfevents.*")
        return [(event.step, value) for event in tf.compat.v1.train.summary_iterator(path)
                for value in event.summary.value]

    [(step, ours)], [(tf_step, theirs)] = values(tmp_path / "ours"), values(tmp_path / "tf")
    assert step == tf_step == 7 and ours.tag == theirs.tag == "loss"
    assert ours.tensor.dtype == theirs.tensor.dtype and ours.tensor.tensor_shape == theirs.tensor.tensor_shape
    assert tf.make_ndarray(ours.tensor) == tf.make_ndarray(theirs.tensor) == np.float32(0.125)
    assert ours.metadata.plugin_data.plugin_name == theirs.metadata.plugin_data.plugin_name == "scalars"
