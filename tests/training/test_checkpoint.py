"""Checkpoints hold the data position and topology that trained them; older checkpoints restore without one."""
import tensorflow as tf

from tfgpu.runtime.distribute import Placement
from tfgpu.training import checkpoint as checkpoint_lib


def _checkpointer(model_dir, step, weights, record=None):
    placement = Placement(tf.distribute.get_strategy(), "one_device", 1, 1, 0, True, ("/cpu:0",), False)
    return checkpoint_lib.Checkpointer(str(model_dir), placement, {"weights": weights}, step, keep=2,
                                       data_position=(lambda: record) if record is not None else None)


def test_each_checkpoint_restores_the_data_position_saved_with_it(tmp_path):
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
    reader.restore(str(tmp_path / "checkpoints" / "ckpt-10")).assert_existing_objects_matched()
    assert reader.data_position.restored == records[10]


def test_a_checkpoint_written_before_the_data_position_restores_without_one(tmp_path):
    step, weights = tf.Variable(7, dtype=tf.int64), tf.Variable([3.0, 4.0])
    tf.train.CheckpointManager(tf.train.Checkpoint(step=step, weights=weights), str(tmp_path / "checkpoints"),
                               max_to_keep=1, step_counter=step).save(checkpoint_number=7)
    step.assign(0)
    weights.assign([0.0, 0.0])
    reader = _checkpointer(tmp_path, step, weights)
    assert not checkpoint_lib.has_data_position(str(tmp_path / "checkpoints" / "ckpt-7"))
    assert reader.restore_latest() == 7 and reader.data_position.restored is None
    assert weights.numpy().tolist() == [3.0, 4.0]
