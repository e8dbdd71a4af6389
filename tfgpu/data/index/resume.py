"""Resuming inside an epoch on another topology: which records the interrupted epoch fed, and the rest of it.

``data.index.position`` says in records where a run is (epoch, stages); this module turns a position into records. The
records a stage's pipelines consumed are the first ``consumed`` of each pipeline's order (``Order.first_records``:
computed from the chunk tables and seeds by ``data.index.order``, no file opened); the rest of the epoch is read by
``stage_order``, each new pipeline its contiguous range of the records no stage consumed, in an order of its own.
``plan_resume`` is the one entry point: the trainer and ``tfgpu.audit_input`` call it, ``pipeline.train_dataset_fn``
reads the ``ResumePlan`` it returns.
"""
import dataclasses

import numpy as np

from tfgpu.config import ConfigError, InputConfig
from tfgpu.data.index import order, position
from tfgpu.data.input.dataset_info import DatasetInfo
from tfgpu.data.input.pipeline import _pipeline_seed, share_order
from tfgpu.data.input.records import train_records

STAGE_SALT = 15_485_863  # a later stage's orders differ from the ordinary epoch's and from each other


def stage_order(config: InputConfig, info: DatasetInfo, indices, length: int, pipeline_id: int,
                stage: int) -> order.Order:
    """One pipeline's part of a later stage of an interrupted epoch: the records ``indices`` (split indices,
    ascending), ``length`` of them an epoch, ordered with seeds of (seed, epoch, stage, pipeline)."""
    split_files = info.split_files[info.train_split]
    starts = position.first_of_file(split_files)
    indices = np.asarray(indices, np.int64)
    file_of = np.searchsorted(starts, indices, side="right") - 1
    cut = np.flatnonzero(np.diff(file_of)) + 1  # ascending: each file's indices are one stretch
    runs = ([(int(f), part - starts[f]) for f, part in zip(file_of[np.r_[0, cut]], np.split(indices, cut))]
            if len(indices) else [])
    return order.build(info, info.train_split, runs, length, _pipeline_seed(config, pipeline_id),
                       stage * STAGE_SALT, config.shuffle_buffer)


def _order_of_stage(config: InputConfig, info: DatasetInfo, stage: int, num_pipelines: int, pipeline_id: int,
                    indices, length: int) -> order.Order:
    if stage == 0:
        return share_order(config, info, num_pipelines, pipeline_id)
    return stage_order(config, info, indices, length, pipeline_id, stage)


def stage_keys(config: InputConfig, info: DatasetInfo, epoch: int, stage: int, num_pipelines: int, pipeline_id: int,
               indices=None, length: int = 0, records: int = 0):
    """The first ``records`` record keys pipeline ``pipeline_id`` of ``num_pipelines`` feeds in stage ``stage`` of
    ``epoch`` (stage 0: the ordinary epoch; later stages: its ``indices``, ``length`` of them), in order. Reads no
    file (``order.Order.keys``); ``consumed_records`` takes the same records as a set (``Order.first_records``)."""
    return _order_of_stage(config, info, stage, num_pipelines, pipeline_id, indices, length).keys(epoch, 0, records)


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

    def stage_order(self, config: InputConfig, info: DatasetInfo, pipeline_id: int) -> order.Order:
        """Pipeline ``pipeline_id``'s order of the later stage it resumes in."""
        return stage_order(config, info, self.ranges[pipeline_id], self.stage_length, pipeline_id,
                           len(self.position.stages) - 1)


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
            keys = _order_of_stage(config, info, k, stage.num_pipelines, p, None if ranges is None else ranges[p],
                                   length).first_records(pos.epoch, stage.consumed)
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
