"""training/summaries.py: TensorBoard scalars under Keras's run names and tags; nothing for a kind without a run."""
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
