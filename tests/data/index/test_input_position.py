"""data/index/input_position.py: the run's input position (planned at start, advanced with the step, saved in each
checkpoint), the refusals of a resume whose records cannot be placed, and the flag a read error names."""
import types

import pytest
import tensorflow as tf

from tests.data.test_exactly_once import make_split
from tfgpu.config import Config, ConfigError
from tfgpu.data import catalog
from tfgpu.data.index import position
from tfgpu.data.index.input_position import InputPosition
from tfgpu.tasks.registry import input_config


class _History:
    def __init__(self):
        self.records = []

    def write(self, kind, step, values):
        self.records.append((kind, step, values))


def _position(info, workers=1, replicas=1, flag="data_dir", allowed=(), **overrides):
    values = {"model_dir": "unused", "data_dir": info.directory, "global_batch_size": 6, "seed": 3, **overrides}
    config = Config(**values)
    placement = types.SimpleNamespace(num_workers=workers, num_replicas=replicas)
    step = tf.Variable(0, dtype=tf.int64)
    return InputPosition(input_config(config), info, placement, flag, allowed, step), step


def test_the_position_is_recorded_only_once_planned_and_advances_with_the_step():
    info = catalog.prepare(Config(model_dir="unused", data_dir=make_split((9, 9, 5))))
    inputs, step = _position(info)
    assert inputs.record() is None  # before start: nothing to save
    assert inputs.start(0, None, "nowhere", _History()) is not None
    step.assign(2)  # two steps of 6 records
    pos, topology, seed, _ = position.from_record(inputs.record(), "here")
    assert (pos.epoch, pos.records_in_epoch, seed) == (0, 12, 3)
    assert topology == position.Topology(1, 1, 6, 1)


def test_a_resume_on_another_topology_is_said_once_and_another_seed_or_batch_is_refused():
    info = catalog.prepare(Config(model_dir="unused", data_dir=make_split((9, 9, 5))))
    saved, step = _position(info)
    saved.start(0, None, "nowhere", _History())
    step.assign(2)
    recorded = saved.record()

    on_two, _ = _position(info, workers=2, replicas=2)
    history = _History()
    on_two.start(2, recorded, "ckpt-2", history)
    assert [r[0] for r in history.records] == ["topology"] and history.records[0][2]["records_consumed_in_epoch"] == 12
    assert on_two.resumed_examples == (2, 12)

    with pytest.raises(ConfigError, match=r"^--seed: 4 differs from the 3 of ckpt-2"):
        _position(info, seed=4)[0].start(2, recorded, "ckpt-2", _History())
    other_batch = Config(model_dir="unused", data_dir=info.directory, global_batch_size=4, seed=3)
    bigger = InputPosition(input_config(other_batch), info, types.SimpleNamespace(num_workers=1, num_replicas=1),
                           "data_dir", (), tf.Variable(0, dtype=tf.int64))
    with pytest.raises(ConfigError, match=r"^--global_batch_size: 4 differs from the 6 of ckpt-2"):
        bigger.start(2, recorded, "ckpt-2", _History())
    elsewhere = catalog.prepare(Config(model_dir="unused", data_dir=make_split((9, 8, 5))))
    with pytest.raises(ConfigError, match=r"^--dataset: the train split"):
        _position(elsewhere, flag="dataset")[0].start(2, recorded, "ckpt-2", _History())


def test_a_read_error_names_the_flag_of_the_data_and_other_errors_pass_unchanged():
    info = catalog.prepare(Config(model_dir="unused", data_dir=make_split((9, 9, 5))))
    inputs, _ = _position(info, flag="dataset")
    with pytest.raises(ConfigError, match=r"^--dataset: .*unreadable"):
        with inputs.reading():
            raise tf.errors.DataLossError(None, None, "corrupted record")
    with pytest.raises(tf.errors.InvalidArgumentError):
        with inputs.reading():
            raise tf.errors.InvalidArgumentError(None, None, "not a record error")
