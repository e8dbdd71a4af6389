"""Resuming inside an epoch on another topology: which records the interrupted epoch fed, and the rest of it.

``data.position`` says in records where a run is (epoch, stages); this module turns a position into records. The
records a stage's pipelines consumed are found by ``stage_keys``, which runs each pipeline's own shuffle over
record numbers without opening a file (the order of ``pipeline``'s reads is a function of the segments' lengths and
the seeds); the rest of the epoch is read by ``stage_records``, each new pipeline its contiguous range of the
records no stage consumed. ``plan_resume`` is the one entry point: the trainer and ``tfgpu.audit_input`` call it,
``pipeline.train_dataset_fn`` reads the ``ResumePlan`` it returns.
"""
import dataclasses

import numpy as np
import tensorflow as tf

from tfgpu.config import ConfigError, InputConfig
from tfgpu.data import position
from tfgpu.data.catalog import DatasetInfo
from tfgpu.data.pipeline import _exact_epoch, _ordinary_epoch, _pipeline_seed, train_share
from tfgpu.data.records import Segments, _no_autograph, open_records, train_records


def _virtual_keys(segment_ds, num_segments):
    """The keys of the segments' records in the order ``records.segment_records`` reads them, without opening a file:
    an interleave's order is a function of its inputs' lengths alone (deterministic, with or without parallel
    calls), and a record-less range costs a tenth of a parallel read (0.09 s against 1.4 s for 76,800 keys)."""

    def keys(filename, file_index, first, count, row, rows):  # (a segment of records.Segments: no damaged shard here)
        start = file_index * (1 << 32) + first
        return tf.data.Dataset.range(start, start + count)

    return segment_ds.interleave(_no_autograph(keys), cycle_length=min(num_segments, 16), block_length=1)


def _stage_segments(info: DatasetInfo, indices):
    """A later stage's records ``indices`` (split indices, ascending) as segments: per file, the span from its first
    to its last such record, with the range of ``keys`` (their identities, in order) that fall in it."""
    split_files = info.split_files[info.train_split]
    starts = position.first_of_file(split_files)
    file_of = np.searchsorted(starts, indices, side="right") - 1
    keys = (file_of.astype(np.int64) << 32) + (indices - starts[file_of])
    files, lo = np.unique(file_of, return_index=True)
    bounds = list(zip(lo, list(lo[1:]) + [len(indices)]))
    segments = [(int(f), int(indices[a] - starts[f]), int(indices[b - 1] - indices[a] + 1), int(a), int(b))
                for f, (a, b) in zip(files, bounds)]
    if not segments:  # fewer remaining records than pipelines: this one reads none of them (an empty segment)
        segments = [(0, 0, 0, 0, 0)]
    columns = [tf.constant(column, tf.int64) for column in zip(*segments)]
    table = tf.data.Dataset.from_tensor_slices(([split_files[f][0] for f, *_ in segments], *columns))
    return table, len(segments), tf.constant(keys, tf.int64)


def _stage_records(config: InputConfig, info: DatasetInfo, indices, length: int, pipeline_id: int, epoch: int,
                   stage: int, virtual: bool = False):
    """One pipeline's part of a later stage of an interrupted epoch: the records ``indices`` (split indices,
    ascending), read span by span (the records between them read and dropped, not decoded), shuffled with seeds of
    (seed, epoch, stage, pipeline); ``length`` of them, as (key, record) pairs, or keys alone when ``virtual``
    (no file opened)."""
    workers = config.data_workers or tf.data.AUTOTUNE
    table, num_segments, keys = _stage_segments(info, indices)
    wanted = np.zeros(info.num_train_examples, bool)
    wanted[indices] = True
    wanted = tf.constant(wanted)
    starts = tf.constant(position.first_of_file(info.split_files[info.train_split]))
    seed = _pipeline_seed(config, pipeline_id) + epoch * 7919 + stage * 15_485_863

    def read(filename, file_index, first, count, key_lo, key_hi):
        if virtual:
            return tf.data.Dataset.from_tensor_slices(keys[key_lo:key_hi])
        records = tf.data.Dataset.zip(tf.data.Dataset.counter(start=file_index * (1 << 32)),
                                      open_records(filename, info.compression))
        return records.skip(first).take(count).filter(lambda key, record: tf.gather(
            wanted, tf.gather(starts, tf.bitwise.right_shift(key, 32)) + tf.bitwise.bitwise_and(key, 0xFFFFFFFF)))

    shuffled = table.shuffle(num_segments, seed=seed)
    interleave = dict(cycle_length=min(num_segments, 16), block_length=1)
    records = (shuffled.interleave(_no_autograph(read), **interleave) if virtual else
               shuffled.interleave(_no_autograph(read), **interleave, num_parallel_calls=workers, deterministic=True))
    if config.shuffle_buffer > 1:
        records = records.shuffle(config.shuffle_buffer, seed=seed + 1)
    return _exact_epoch(records, len(indices), length)


def stage_keys(config: InputConfig, info: DatasetInfo, epoch: int, stage: int, num_pipelines: int, pipeline_id: int,
               indices=None, length: int = 0, records: int = 0):
    """The first ``records`` record keys pipeline ``pipeline_id`` of ``num_pipelines`` feeds in stage ``stage`` of
    ``epoch`` (stage 0: the ordinary epoch; later stages: its ``indices``, ``length`` of them), in order: the
    records a checkpointed position consumed. Reads no file (the order is a function of the segments' lengths and
    the seeds; ``plan_resume`` refuses another topology where --skip_corrupt_records reads around records)."""
    split_files = info.split_files[info.train_split]
    if stage == 0:
        segments, epoch_size = train_share(split_files, num_pipelines, pipeline_id)
        segment_ds = Segments(info, info.train_split, segments).dataset
        share = sum(n for _, _, n in segments)

        def read(ds):
            return _virtual_keys(ds, len(segments))

        cached = read(segment_ds) if config.cache else None
        ds = tf.data.Dataset.range(epoch, epoch + 1).flat_map(_no_autograph(
            lambda e: _ordinary_epoch(config, segment_ds, len(segments), read, share, epoch_size, pipeline_id, e,
                                      cached)))
    else:
        ds = _stage_records(config, info, indices, length, pipeline_id, epoch, stage, virtual=True)
    ds = ds.take(records)
    found = [np.asarray(b) for b in ds.batch(1 << 16).as_numpy_iterator()]
    return np.concatenate(found) if found else np.zeros(0, np.int64)


@dataclasses.dataclass(frozen=True)
class ResumePlan:
    """Where a run's pipelines start: ``position`` (already for this run's ``num_pipelines``); for a later stage
    of the interrupted epoch each pipeline's records (``ranges``) and how many it reads (``stage_length``); and
    the epoch's records the earlier stages consumed (``consumed``, split indices)."""
    num_pipelines: int
    position: position.Position
    stage_length: int
    epoch_length: int
    ranges: tuple = ()
    consumed: np.ndarray = None

    @property
    def in_later_stage(self) -> bool:
        return not self.position.is_ordinary

    def stage_records(self, config: InputConfig, info: DatasetInfo, pipeline_id: int):
        """Pipeline ``pipeline_id``'s (key, record) pairs of the later stage it resumes in, from its start."""
        return _stage_records(config, info, self.ranges[pipeline_id], self.stage_length, pipeline_id,
                              self.position.epoch, len(self.position.stages) - 1)


def consumed_records(config: InputConfig, info: DatasetInfo, pos: position.Position):
    """Split indices of the records ``pos`` says its epoch fed, and, per stage, the stage's pipelines' ranges and
    length (stage 0: ``None``): the same computation for the trainer and tfgpu.audit_input."""
    split_files = info.split_files[info.train_split]
    damaged = [f for f, _ in split_files if f in info.damaged]
    if damaged:
        raise ConfigError("skip_corrupt_records", f"{damaged[0]} has unreadable records that this run reads around, "
                          f"so the {pos.records_in_epoch} records epoch {pos.epoch + 1} fed before the interruption "
                          f"cannot be replayed on another topology; finish that epoch on the topology it was interrupted on "
                          "(--train_steps at its end), or convert the dataset again")
    starts = position.first_of_file(split_files)
    total = info.num_train_examples
    consumed, layouts = np.zeros(total, bool), []  # a mask: numpy's set operations took 13 of 24 s on 1.28M records
    for k, stage in enumerate(pos.stages):
        if k == 0:
            ranges, length = None, total // stage.num_pipelines
        else:
            ranges, length = position.stage_ranges(np.flatnonzero(~consumed), stage.num_pipelines)
        layouts.append((ranges, length))
        if stage.consumed > length:
            raise ConfigError("model_dir", f"the checkpoint's data position has {stage.consumed} records consumed "
                              f"per pipeline in a stage of {length}; resume from an earlier checkpoint")
        for p in range(stage.num_pipelines if stage.consumed else 0):
            keys = stage_keys(config, info, pos.epoch, k, stage.num_pipelines, p,
                              None if ranges is None else ranges[p], length, stage.consumed)
            consumed[position.global_index(keys, starts)] = True
    return np.flatnonzero(consumed), layouts


def plan_resume(config: InputConfig, info: DatasetInfo, num_pipelines: int, start_step: int,
                recorded: position.Position = None) -> ResumePlan:
    """The plan for pipelines resuming at ``recorded`` (a checkpoint's position; ``None``: an uninterrupted run
    on this topology at ``start_step``, as for a checkpoint without one). With as many pipelines as the position's
    last stage nothing is computed (today's exact resume); with another number the records the earlier stages
    consumed are (``consumed_records``; --data_service: refused unless at an epoch boundary)."""
    total = train_records(info)
    epoch_length = total // num_pipelines
    if recorded is None:
        recorded = position.from_step(start_step, position.Topology(
            num_pipelines, 1, config.global_batch_size, config.batches_per_step), total)
    pos = position.resume(recorded, num_pipelines)
    if pos.is_ordinary:
        return ResumePlan(num_pipelines, pos, epoch_length, epoch_length)
    if config.data_service:
        raise ConfigError("data_service", f"a tf.data service's order is not reproducible, so the "
                          f"{recorded.records_in_epoch} records epoch {recorded.epoch + 1} fed before the "
                          "interruption are not "
                          f"known; finish that epoch on {recorded.stages[-1].num_pipelines} worker(s) (--train_steps "
                          "at its end), then resume on this topology")
    consumed, layouts = consumed_records(config, info, pos)
    ranges, length = layouts[-1]
    return ResumePlan(num_pipelines, pos, length, epoch_length, tuple(ranges), consumed)
