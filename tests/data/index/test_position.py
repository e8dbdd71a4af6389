"""The data position in records: stages of an epoch, the checkpoint's record and its refusals (pure Python).

Which records a position consumed, read through the real pipelines, is the property test in
tests/data/test_exactly_once.py (test_a_resume_on_another_topology_...)."""
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfgpu.config import ConfigError
from tfgpu.data.index import position
from tfgpu.data.index.position import Position, Stage, Topology


def test_from_step_is_todays_step_arithmetic():
    """2 workers, global batch 24, 1,438 records (digits): step 30 is record 360 of each worker's 719."""
    assert position.from_step(30, Topology(2, 1, 24, 1), 1438) == Position(0, (Stage(2, 360),))
    assert position.from_step(60, Topology(2, 1, 24, 1), 1438) == Position(1, (Stage(2, 1),))
    assert position.from_step(3, Topology(1, 2, 8, 2), 10) == Position(4, (Stage(1, 8),))


def test_resume_keeps_the_stage_on_as_many_pipelines_and_adds_one_on_another_number():
    mid = Position(0, (Stage(2, 360),))
    assert position.resume(mid, 2) is mid
    assert position.resume(mid, 1) == Position(0, (Stage(2, 360), Stage(1, 0)))
    # At an epoch boundary nothing of the epoch was consumed: an ordinary epoch of the new topology.
    assert position.resume(Position(3, (Stage(2, 0),)), 3) == Position(3, (Stage(3, 0),))


def test_advance_finishes_the_stage_then_runs_ordinary_epochs():
    later = Position(0, (Stage(2, 360), Stage(1, 0)))
    assert position.advance(later, 718, 1438, 700) == Position(0, (Stage(2, 360), Stage(1, 700)))
    assert position.advance(later, 718, 1438, 720) == Position(1, (Stage(1, 2),))
    assert position.advance(later, 718, 1438, 718 + 2 * 1438 + 5) == Position(3, (Stage(1, 5),))


@settings(max_examples=60, deadline=None)
@given(remaining=st.lists(st.integers(0, 500), unique=True, max_size=60), pipelines=st.integers(1, 7))
def test_stage_ranges_cut_the_remaining_records_into_near_equal_contiguous_ranges(remaining, pipelines):
    remaining = np.array(sorted(remaining), np.int64)
    ranges, length = position.stage_ranges(remaining, pipelines)
    assert np.array_equal(np.concatenate(ranges), remaining)
    assert length == len(remaining) // pipelines and all(length <= len(r) <= length + 1 for r in ranges)


def _record(**changes):
    record = position.to_record(Position(0, (Stage(2, 360), Stage(1, 12))), Topology(1, 2, 24, 1), 7, "abc")
    record.update(changes)
    return record


def test_the_record_round_trips_through_json():
    record = json.loads(json.dumps(_record()))
    assert record["records_consumed_in_epoch"] == 732
    assert position.from_record(record, "ckpt-30") == (Position(0, (Stage(2, 360), Stage(1, 12))),
                                                       Topology(1, 2, 24, 1), 7, "abc")


@pytest.mark.parametrize("record, says", [
    (_record(version=9), "has version 9, this tfgpu reads 1"),
    (_record(stages=[[2]]), "is malformed (ValueError"),
    (_record(num_workers="two"), "is malformed (ValueError"),
    ({"version": 1}, "is malformed (KeyError"),
    (_record(records_consumed_in_epoch=5), "is inconsistent"),
    (_record(stages=[[0, 3]]), "is inconsistent"),
    ("not a record", "has version None"),
])
def test_a_bad_record_is_one_line_naming_the_checkpoint(record, says):
    with pytest.raises(ConfigError) as raised:
        position.from_record(record, "/runs/a/checkpoints/ckpt-30")
    message = str(raised.value)
    assert message.startswith("--model_dir: /runs/a/checkpoints/ckpt-30: the data position it records ")
    assert says in message and "\n" not in message and "resume from an earlier checkpoint" in message


def test_the_fingerprint_names_shards_and_counts_not_directories():
    a = position.dataset_fingerprint((("/data/a/train-0.tfrecord", 5), ("/data/a/train-1.tfrecord", 4)))
    assert a == position.dataset_fingerprint((("gs://b/train-0.tfrecord", 5), ("gs://b/train-1.tfrecord", 4)))
    assert a != position.dataset_fingerprint((("/data/a/train-0.tfrecord", 5), ("/data/a/train-1.tfrecord", 3)))
