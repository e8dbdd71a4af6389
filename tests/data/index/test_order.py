"""data/index/order.py: an epoch's order as record indices. Properties over random shapes (records per shard x workers x
replicas x resume step x seed x shuffle window x record size) computed in process from the index alone, and the
real pipelines reading records by offset in that order (small and large records, on a TensorFlow file system)."""
import collections

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from tfgpu import config_sources
from tfgpu.config import Config
from tfgpu.data import catalog
from tfgpu.data.index import chunks, position, resume
from tfgpu.data.input import dataset_info, pipeline
from tfgpu.data.schema import tfrecord
from tfgpu.tasks.registry import input_config


def index_only(sizes, record_bytes: int) -> dataset_info.DatasetInfo:
    """A split of shards with ``sizes`` records of ``record_bytes`` each, known by its offset tables alone (no
    file: the order is computed, never read)."""
    files = tuple((f"/nowhere/part{i}.tfrecord", n) for i, n in enumerate(sizes))
    tables = {f: np.arange(n + 1, dtype=np.int64) * (record_bytes + 16) for f, n in files}
    return dataset_info.DatasetInfo("ids", "/nowhere", tuple(str(i) for i in range(10)), (2, 2, 1),
                               {"train": sum(sizes)}, {"train": files}, "none", "train", "", tables=tables)


SHAPES = dict(sizes=st.lists(st.integers(0, 300), min_size=1, max_size=6), workers=st.integers(1, 5),
              replicas=st.integers(1, 3), per_replica=st.integers(1, 8), resume_step=st.integers(0, 400),
              seed=st.integers(0, 2 ** 31), shuffle_buffer=st.sampled_from([0, 1, 7, 300, 10000]),
              record_bytes=st.sampled_from([40, 3000, chunks.LARGE_RECORD]))


def _every_record_once_and_resume(sizes, workers, replicas, per_replica, resume_step, seed, shuffle_buffer,
                                  record_bytes):
    total = sum(sizes)
    if total // workers < per_replica * replicas:
        return  # the pipeline refuses a batch larger than a worker's share
    info = index_only(sizes, record_bytes)
    config = Config(model_dir="unused", data_dir="/nowhere", seed=seed, shuffle_buffer=shuffle_buffer,
                    global_batch_size=per_replica * replicas * workers)
    length = total // workers
    starts = position.first_of_file(info.split_files["train"])
    topology = position.Topology(workers, replicas, config.global_batch_size, 1)
    at = position.from_step(resume_step, topology, total)
    epochs = [collections.Counter(), collections.Counter()]
    offset = at.stages[0].consumed
    for w in range(workers):
        share = pipeline.share_order(input_config(config), info, workers, w)
        uninterrupted = [share.keys(at.epoch), share.keys(at.epoch + 1)]  # each epoch's order: of (seed, epoch)
        for seen, keys in zip(epochs, uninterrupted):
            assert len(keys) == length
            seen.update(position.global_index(keys, starts).tolist())
        resumed = np.concatenate([share.keys(at.epoch, offset), share.keys(at.epoch + 1)])
        assert resumed.tolist() == np.concatenate(uninterrupted)[offset:].tolist()
        # a pipeline holding its records in memory gathers by the keys stream_keys computes in its graph
        streamed = [keys for keys in share.stream_keys(at.epoch, offset, epochs=2).as_numpy_iterator()]
        assert np.concatenate(streamed).tolist() == resumed.tolist()
        # what another topology finds consumed: the same records, known from one window's plan
        assert sorted(share.first_records(at.epoch, offset).tolist()) == sorted(uninterrupted[0][:offset].tolist())
    for e, seen in enumerate(epochs):
        assert max(seen.values(), default=1) == 1 and set(seen) <= set(range(total))
        assert total - len(seen) < workers, f"epoch {at.epoch + e} misses {total - len(seen)} records"


def _another_topology(sizes, topologies, steps, seed, shuffle_buffer, record_bytes):
    """The records earlier stages consumed (resume.consumed_records) plus what the last topology's orders feed for
    the rest of the epoch: every record once, but for fewer than the last topology's workers left out."""
    total = sum(sizes)
    if total // max(topologies) < 4:
        return
    info = index_only(sizes, record_bytes)
    config = input_config(Config(model_dir="unused", data_dir="/nowhere", seed=seed, shuffle_buffer=shuffle_buffer,
                                 global_batch_size=12))
    pos = position.from_step(steps[0], position.Topology(topologies[0], 1, 12, 1), total)
    for workers, run_steps in zip(topologies[1:-1], steps[1:]):
        pos = position.resume(pos, workers)
        _, layouts = resume.consumed_records(config, info, pos)
        pos = position.advance(pos, layouts[-1][1], total // workers, run_steps * 12 // workers)
    last = topologies[-1]
    plan = resume.plan_resume(config, info, last, 0, pos)
    before = plan.consumed if plan.in_later_stage else resume.consumed_records(config, info, plan.position)[0]
    assert len(before) == pos.records_in_epoch
    seen = collections.Counter(before.tolist())
    starts = position.first_of_file(info.split_files["train"])
    offset = plan.position.stages[-1].consumed
    for w in range(last):
        rest = (plan.stage_order(config, info, w) if plan.in_later_stage else
                pipeline.share_order(config, info, last, w)).keys(plan.position.epoch, offset)
        assert len(rest) == plan.stage_length - offset
        seen.update(position.global_index(rest, starts).tolist())
    assert max(seen.values()) == 1 and total - len(seen) < last



@settings(max_examples=6, deadline=None)
@given(**SHAPES)
def test_every_record_once_per_epoch_and_a_resume_continues_the_uninterrupted_order(**shape):
    _every_record_once_and_resume(**shape)


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(**SHAPES)
def test_every_record_once_per_epoch_and_a_resume_continues_the_uninterrupted_order_many_shapes(**shape):
    _every_record_once_and_resume(**shape)


TRANSITIONS = dict(sizes=st.lists(st.integers(1, 200), min_size=1, max_size=5),
                   topologies=st.lists(st.integers(1, 4), min_size=2, max_size=3),
                   steps=st.lists(st.integers(0, 30), min_size=2, max_size=2), seed=st.integers(0, 99),
                   shuffle_buffer=st.sampled_from([0, 50, 10000]),
                   record_bytes=st.sampled_from([40, chunks.LARGE_RECORD]))


@settings(max_examples=4, deadline=None)
@given(**TRANSITIONS)
def test_a_resume_on_another_topology_feeds_the_rest_of_the_epoch_each_record_once(**shape):
    _another_topology(**shape)


@pytest.mark.slow
@settings(max_examples=100, deadline=None)
@given(**TRANSITIONS)
def test_a_resume_on_another_topology_feeds_the_rest_of_the_epoch_each_record_once_many_shapes(**shape):
    _another_topology(**shape)

def test_small_records_are_mixed_across_the_window_and_large_ones_permuted_globally():
    """At least as random as the shuffle buffer it replaces: with --shuffle_buffer's 10,000 records no record keeps
    its neighbour from the shard (small records: chunks of ~64 KB interleaved at random over a window; large: one
    permutation of the whole share), and an epoch's first records come from all over the split."""
    for record_bytes in (460, 110_000):
        info = index_only([1125] * 40, record_bytes)
        config = Config(model_dir="unused", data_dir="/nowhere", seed=1)
        keys = pipeline.share_order(input_config(config), info, 1, 0).keys(0)
        split_index = position.global_index(keys, position.first_of_file(info.split_files["train"]))
        neighbours = np.mean(np.abs(np.diff(split_index)) == 1)
        assert neighbours < 0.02, (record_bytes, neighbours)
        first = split_index[:2000]
        assert len(np.unique(first // 1125)) >= 30, (record_bytes, np.unique(first // 1125))


def test_resume_reads_nothing_before_its_first_record_at_a_million_records():
    """Locating mid-epoch at 1M records is arithmetic on the index (no record, no file)."""
    import time

    info = index_only([1125] * 889, 460)
    config = Config(model_dir="unused", data_dir="/nowhere", seed=2)
    share = pipeline.share_order(input_config(config), info, 1, 0)
    started = time.perf_counter()
    middle = share.keys(3, 500_000, 1000)
    assert time.perf_counter() - started < 5
    assert middle.tolist() == share.keys(3, 499_000, 2000)[1000:].tolist()


# -- the real pipelines read by offset, in that order ------------------------------------------------------------
def _write(directory: str, sizes, record_bytes: int):
    """Shards of raw images of about ``record_bytes`` (labels 0..N-1 in order), through tfgpu's writer."""
    side = max(2, int(np.sqrt(record_bytes / 3)))
    shards, start = [], 0
    for i, n in enumerate(sizes):
        images = np.random.default_rng(i).integers(0, 256, (n, side, side, 3), dtype=np.uint8)
        entry = tfrecord.write_arrays(directory, f"part{i}", images, np.arange(start, start + n), num_shards=1,
                                      image_format="raw")
        shards += entry["shards"]
        start += n
    tfrecord.write_manifest(directory, {
        "name": "ids", "classes": [str(i) for i in range(start)], "compression": "none",
        "splits": {"train": {"num_examples": start, "shards": shards}},
        "image_shape": {"height": side, "width": side, "channels": 3}})


@pytest.mark.parametrize("record_bytes,where", [(60, "local"), (chunks.LARGE_RECORD + 100, "ram")])
def test_the_pipelines_read_by_offset_in_the_computed_order(tmp_path, record_bytes, where):
    """Small records (chunks mixed in windows) on a local disk; large records (one read each at its offset) on a
    TensorFlow file system (ram://, as gs:// is read): the labels the train pipeline yields are the records
    Order.keys names, in order, also from a step inside the second epoch."""
    directory = str(tmp_path / "d") if where == "local" else f"ram://{tmp_path.name}/d"
    sizes = (7, 12, 5)
    _write(directory, sizes, record_bytes)
    config = config_sources.build(model_dir="unused", data_dir=directory, seed=4, global_batch_size=3,
                                  shuffle_buffer=10, data_cache_dir=str(tmp_path / "cache"))
    info = catalog.prepare(config)
    share = pipeline.share_order(input_config(config), info, 1, 0)
    assert share.single == (record_bytes >= chunks.LARGE_RECORD) and share.by_offset
    starts = position.first_of_file(info.split_files["train"])
    expected = position.global_index(np.concatenate([share.keys(0), share.keys(1)]), starts).tolist()
    for start_step in (0, 10):
        ds = pipeline.train_dataset_fn(input_config(config), info, start_step)(tf.distribute.InputContext())
        labels = [int(y) for _, batch in ds.take(16 - start_step).as_numpy_iterator() for y in batch]
        assert labels == expected[3 * start_step:48], start_step
