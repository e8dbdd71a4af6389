"""data/index/resume.py: a resume inside an epoch on another topology. The property that the rest of the epoch is fed
each record once is in tests/data/test_exactly_once.py (test_a_resume_on_another_topology_...); here, that the
records it counts as consumed are the ones training read, and what it refuses."""
import pytest
import tensorflow as tf

from tests.data.test_exactly_once import make_split
from tfgpu.config import Config, ConfigError
from tfgpu.data import catalog
from tfgpu.data.index import position, resume
from tfgpu.data.input import pipeline
from tfgpu.tasks.registry import input_config


def test_a_data_service_run_changes_topology_only_at_an_epoch_boundary():
    """The service's order is not a function of the step, so which records an interrupted epoch fed is not known:
    refused in one line with the way out; at an epoch boundary nothing of the epoch was fed, and it resumes."""
    info = catalog.prepare(Config(model_dir="unused", data_dir=make_split((9, 9, 5))))
    config = Config(model_dir="unused", data_dir=info.directory, global_batch_size=6, data_service="grpc://x:1")
    with pytest.raises(ConfigError) as refused:
        resume.plan_resume(input_config(config), info, 1, 2, position.from_step(2, position.Topology(2, 1, 6, 1), 23))
    assert str(refused.value).startswith("--data_service: a tf.data service's order is not reproducible, so the 12 "
                                         "records epoch 1 fed before the interruption are not known; finish that "
                                         "epoch on 2 worker(s)")
    at_boundary = resume.plan_resume(input_config(config), info, 1, 0, position.Position(3, (position.Stage(2, 0),)))
    assert at_boundary.position == position.Position(3, (position.Stage(1, 0),)) and not at_boundary.in_later_stage


def _real_keys(config, info, plan, pipeline_id, num_records):
    ctx = tf.distribute.InputContext(plan.num_pipelines, pipeline_id, plan.num_pipelines)
    ds = pipeline.train_dataset_fn(input_config(config), info, 0, record_keys=True, plan=plan)(ctx).unbatch()
    return [int(key) for key in ds.take(num_records).as_numpy_iterator()]


@pytest.mark.parametrize("cache,shuffle_buffer", [pytest.param(False, 4, marks=pytest.mark.slow), (True, 10000)])
def test_the_consumed_records_are_computed_in_the_order_the_real_pipelines_read_them(cache, shuffle_buffer):
    """resume.stage_keys opens no file: its keys must be the ones training read, in order, in an ordinary epoch
    (epoch 1 of 2 pipelines) and in a later stage (that epoch's rest on 3 pipelines)."""
    info = catalog.prepare(Config(model_dir="unused", data_dir=make_split((7, 9, 8, 8))))
    config = Config(model_dir="unused", data_dir=info.directory, global_batch_size=6, seed=3, cache=cache,
                    shuffle_buffer=shuffle_buffer)
    ordinary = resume.plan_resume(input_config(config), info, 2, 0, position.Position(1, (position.Stage(2, 0),)))
    for p in range(2):
        assert resume.stage_keys(config, info, 1, 0, 2, p, records=16).tolist() == \
            _real_keys(config, info, ordinary, p, 16)
    later = resume.plan_resume(input_config(config), info, 3, 0, position.Position(1, (position.Stage(2, 5),)))
    assert later.in_later_stage and later.stage_length == (32 - 10) // 3
    for p in range(3):
        assert resume.stage_keys(config, info, 1, 1, 3, p, later.ranges[p], later.stage_length,
                                   later.stage_length).tolist() == _real_keys(config, info, later, p, 7)
