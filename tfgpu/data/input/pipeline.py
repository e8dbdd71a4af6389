"""Input pipelines: a converted dataset (or a built-in one) to per-replica batches.

``tfgpu.data.catalog.prepare`` resolves where the data is
and what it looks like (``DatasetInfo``). ``train_dataset_fn`` / ``eval_dataset_fn``
return the functions ``strategy.distribute_datasets_from_function`` calls once
per input pipeline (one per worker).

Each input pipeline trains on its own share of the train split (``train_share``:
contiguous record ranges of nearly equal size), and an epoch is the same number
of records in every pipeline, so one epoch of all pipelines together holds every
record once (but for fewer than num_pipelines left out as the remainder).
Training order is a pure function of (seed, position): each epoch's order is a
permutation of the share's record indices (``share_order``, ``data.index.order``), read
by byte offset, and a resumed run starts at its record of that order by arithmetic
(nothing before it is read). So a run resumed at step N sees exactly the batches an
uninterrupted run sees from step N on (with a tf.data service: the same epochs,
not the same order). Evaluation visits every example exactly once across all
pipelines; pipelines are padded with weight-0 examples so all replicas run the
same number of steps. Train and eval images (and synthetic data) reach the model
in --input_range (``augment.to_model_range``).
"""
import logging
import math
import warnings

import numpy as np
import tensorflow as tf

from tfgpu import durations
from tfgpu.config import ConfigError, InputConfig
from tfgpu.data.index import order, position
from tfgpu.data.input import augment, memory
from tfgpu.data.input.records import (Examples, Segments, _no_autograph, readable_files, readable_indices,
                                      segment_records, train_records)
from tfgpu.data.input.dataset_info import DatasetInfo

log = logging.getLogger("tfgpu")


def train_share(files, num_pipelines: int, pipeline_id: int):
    """This pipeline's share of a split's ``files`` ((file, num_examples), ...): ((file_index, first_record,
    num_records), ...) and the records it trains on per epoch.

    The split's records, files taken in strided order (file i goes to slot ``i % num_pipelines``), are cut into
    ``num_pipelines`` contiguous ranges whose sizes differ by at most one. When the files divide evenly by
    records every range is whole files (``files[p::num_pipelines]``); otherwise at most ``num_pipelines - 1``
    files are split between two pipelines, each reading its part (skipping to it costs a read, no decode).
    Every pipeline trains on ``total // num_pipelines`` records per epoch, so all pipelines start every epoch at
    the same step and the ranges together hold each record once; a pipeline whose range is one record longer
    leaves out one record per epoch, the one its shuffle puts last (fewer than ``num_pipelines`` in all).
    """
    order = sorted(range(len(files)), key=lambda i: (i % num_pipelines, i))
    total = sum(n for _, n in files)
    lo, hi = total * pipeline_id // num_pipelines, total * (pipeline_id + 1) // num_pipelines
    segments, start = [], 0
    for i in order:
        n = files[i][1]
        first, last = max(lo, start), min(hi, start + n)
        if first < last:
            segments.append((i, first - start, last - first))
        start += n
    return tuple(segments), total // num_pipelines


def _eval_files(info: DatasetInfo, split: str, num_pipelines: int, pipeline_id: int):
    """This pipeline's eval files (indices in the split) and its record count; element sharding (of one fixed
    order, read by every pipeline) when some pipeline would get no file."""
    files = info.split_files[split]
    if len(files) >= num_pipelines:
        mine = range(pipeline_id, len(files), num_pipelines)
        return list(mine), sum(files[i][1] for i in mine), False
    total = sum(n for _, n in files)
    return list(range(len(files))), len(range(pipeline_id, total, num_pipelines)), True


def _with_options(ds, config: InputConfig, deterministic: bool):
    options = tf.data.Options()
    options.deterministic = deterministic
    if config.data_threadpool_size:
        options.threading.private_threadpool_size = config.data_threadpool_size
    return ds.with_options(options)


def _pipeline_seed(config: InputConfig, pipeline_id: int) -> int:
    return config.seed * 1_000_003 + pipeline_id


def share_order(config: InputConfig, info: DatasetInfo, num_pipelines: int, pipeline_id: int) -> order.Order:
    """The order of pipeline ``pipeline_id``'s share (``train_share``) in ordinary epochs: chunks of its readable
    records, permuted and mixed per epoch with seeds of (seed, epoch, pipeline) (``order``)."""
    split = info.train_split
    segments, epoch_size = train_share(readable_files(info, split), num_pipelines, pipeline_id)
    runs = [(i, readable_indices(info, split, i, first, count)) for i, first, count in segments]
    return order.build(info, split, runs, epoch_size, _pipeline_seed(config, pipeline_id), 0, config.shuffle_buffer)


def train_dataset_fn(config: InputConfig, info: DatasetInfo, start_step: int, record_keys: bool = False,
                     plan=None, examples: Examples | None = None):
    """Returns ``fn(input_context) -> Dataset`` of per-replica ``(x, y)`` batches, resumed at ``start_step``;
    ``examples`` (the task's ``Task.examples()``, default classification's ``records.Examples``) turns a record
    into ``(x, y)``.

    Each input pipeline trains on its share of the split (``train_share``); an epoch is ``total //
    num_input_pipelines`` records of every pipeline, batches run on across epoch boundaries. ``plan``
    (``resume.plan_resume``) says where in its epoch a resumed run starts, on this topology or another; without
    one, where an uninterrupted run on this topology is at ``start_step``. ``record_keys`` yields batches of record
    identities instead of decoded examples (same records, same order; for tfgpu.audit_input)."""
    workers = config.data_workers or tf.data.AUTOTUNE
    examples = examples or Examples(config, info)

    def dataset_fn(ctx: tf.distribute.InputContext):
        per_replica = ctx.get_per_replica_batch_size(config.global_batch_size)
        replicas_here = ctx.num_replicas_in_sync // ctx.num_input_pipelines
        if info.name == "synthetic":
            return _synthetic(info, examples, per_replica, config.seed + ctx.input_pipeline_id, config.input_range)
        split_files = readable_files(info, info.train_split)
        segments, epoch_size = train_share(split_files, ctx.num_input_pipelines, ctx.input_pipeline_id)
        if any(first or n < split_files[i][1] for i, first, n in segments):
            log.info("input pipeline %d reads part of a shard: the %d records of split %r are balanced over %d "
                     "pipelines by record (equal-sized shards in a multiple of %d would give whole shards)",
                     ctx.input_pipeline_id, info.num_train_examples, info.train_split, ctx.num_input_pipelines,
                     ctx.num_input_pipelines)
        if epoch_size < per_replica:
            raise ConfigError("global_batch_size", f"{config.global_batch_size} is larger than the "
                              f"{info.num_train_examples} examples of split {info.train_split!r}")
        consumed = start_step * config.batches_per_step * replicas_here * per_replica
        if plan is not None and plan.in_later_stage and plan.num_pipelines != ctx.num_input_pipelines:
            raise ValueError(f"a resume plan for {plan.num_pipelines} input pipelines given to pipeline "
                             f"{ctx.input_pipeline_id} of {ctx.num_input_pipelines}")
        start = plan.position if plan is not None else position.from_step(start_step, position.Topology(
            ctx.num_input_pipelines, 1, config.global_batch_size, config.batches_per_step), train_records(info))
        start_epoch, offset = start.epoch, start.stages[-1].consumed
        seed = _pipeline_seed(config, ctx.input_pipeline_id)

        def parse(index, element):
            key, serialized = element
            if record_keys:
                return key
            return examples.example(serialized, info.train_split, key, seed=index)

        def parse_unchecked(index, element):  # the label check runs per batch (check_batch)
            key, serialized = element
            return (*examples.train_example(serialized, info.train_split, key, seed=index), key)

        def check(x, y, *rest):  # rest: a task's sample weights, if its examples have them, then the keys
            *weight, keys = rest
            return (x, examples.check_batch(y, keys, info.train_split), *weight)

        ordinary = share_order(config, info, ctx.num_input_pipelines, ctx.input_pipeline_id)
        if config.data_service:
            def service_epoch(e):  # a job an epoch, the first one from the run's record of it (by index)
                first = tf.where(e == start_epoch, tf.constant(offset, tf.int64), 0)
                return _service_epoch(config, ordinary, e, first, parse, per_replica, seed, workers)

            # Two epochs open at a time, read one after the other: the next epoch's job starts while this one
            # is consumed (a new job takes seconds to reach its first example: its workers build a window's readers).
            ds = tf.data.Dataset.range(start_epoch, 1 << 40).interleave(
                _no_autograph(service_epoch), cycle_length=2, block_length=epoch_size, num_parallel_calls=2,
                deterministic=True)
            ds = ds.batch(per_replica, drop_remainder=True)
            return _with_options(ds.prefetch(tf.data.AUTOTUNE), config, config.deterministic_input)

        if plan is not None and plan.in_later_stage:
            later = plan.stage_order(config, info, ctx.input_pipeline_id)  # its records, from the stage's start
            stages = ((later, start_epoch, offset, 1), (ordinary, start_epoch + 1, 0, None))
        else:
            stages = ((ordinary, start_epoch, offset, None),)
        if not record_keys and memory.holds(config, examples, [s[0] for s in stages], ctx.input_pipeline_id):
            ds = memory.train_batches(config, examples, [(o, o.stream_keys(e, k, n)) for o, e, k, n in stages],
                                      per_replica, consumed, seed, workers)
            return _with_options(ds.prefetch(tf.data.AUTOTUNE), config, config.deterministic_input)
        streams = [o.stream(e, k, config.cache, epochs=n) for o, e, k, n in stages]
        records = streams[0] if len(streams) == 1 else streams[0].concatenate(streams[1])
        indexed = tf.data.Dataset.zip(tf.data.Dataset.counter(start=consumed), records)
        one = parse if record_keys else parse_unchecked
        ds = indexed.map(_no_autograph(lambda i, element: one(tf.stack([seed, i]), element)),
                         num_parallel_calls=workers, deterministic=config.deterministic_input)
        ds = ds.batch(per_replica, drop_remainder=True)
        if not record_keys:
            ds = ds.map(_no_autograph(check))
        return _with_options(ds.prefetch(tf.data.AUTOTUNE), config, config.deterministic_input)

    return dataset_fn


def _service_epoch(config, share: order.Order, epoch, offset, parse, per_replica, seed, workers):
    """--data_service: records ``[offset, length)`` of the pipeline's epoch ``epoch`` (its index order, ``share``),
    read, parsed and batched by the service's workers; one service job an epoch.

    The job's dataset is ``Order.service_epoch``: a range of units (the order's windows, or blocks of large
    records) expanded to their records by index, so the shuffle holds indices and nothing is read before
    ``offset``. Its processing mode is ``distributed_epoch`` (``ShardingPolicy.DYNAMIC``): the dispatcher hands
    each unit to one worker, so the workers together produce every record of the epoch once (tf.data service's
    guarantee is at most once: a worker restarted mid-epoch loses the units it held, never repeats one), and the
    record left out of a share one record longer is the one the order puts last, as without the service.
    (``parallel_epochs``, ``ShardingPolicy.OFF``, would have every worker produce the whole epoch: each record
    once per worker.) The examples arrive in the order the workers finish them, so which records of an epoch a
    step sees is not a function of the step: a resumed run restarts the interrupted epoch at the same record of
    its order, and the records it skips are those the order put first, not necessarily those the interrupted
    run trained on (the units in flight when it stopped may repeat or be missed; every later epoch is exactly
    once). Augmentation is seeded by (seed, epoch, record), whichever worker decodes it. Workers batch their
    examples; batches are re-cut here, so no worker drops a remainder."""
    service = tf.data.experimental.service
    records = share.service_epoch(epoch, offset)
    examples = records.map(_no_autograph(lambda key, serialized: parse(
        tf.random.experimental.stateless_fold_in(tf.stack([tf.constant(seed, tf.int64), key]), epoch),
        (key, serialized))), num_parallel_calls=workers)
    with warnings.catch_warnings():  # distribute reads the dataset's options, which warns inside a function
        warnings.filterwarnings("ignore", "To make it possible to preserve tf.data options", UserWarning)
        produced = examples.batch(per_replica).apply(service.distribute(
            processing_mode=service.ShardingPolicy.DYNAMIC, service=config.data_service))
    return produced.unbatch()


def _synthetic(info: DatasetInfo, examples: Examples, per_replica: int, seed: int,
               input_range=augment.DEFAULT_RANGE):
    """One random batch (pixels uniform in ``input_range``, the task's random targets) repeated forever: measures
    the model, not the input pipeline."""
    h, w, c = info.image_shape
    rng = np.random.default_rng(seed)
    images = rng.uniform(*input_range, (per_replica, h, w, c)).astype(np.float32)
    labels = examples.synthetic_labels(rng, per_replica)
    return tf.data.Dataset.from_tensors((images, labels)).repeat()


def eval_steps(config: InputConfig, info: DatasetInfo, num_pipelines: int, num_replicas: int) -> int:
    """Eval batches each replica runs so that every example is seen once (or --eval_steps)."""
    if config.eval_steps:
        return config.eval_steps
    global_batch = config.eval_batch_size or config.global_batch_size
    per_replica = global_batch // num_replicas
    replicas_here = num_replicas // num_pipelines
    most = max(_eval_files(info, info.eval_split, num_pipelines, p)[1] for p in range(num_pipelines))
    return max(1, math.ceil(most / (per_replica * replicas_here)))


def eval_dataset_fn(config: InputConfig, info: DatasetInfo, steps: int, examples: Examples | None = None):
    """Returns ``fn(input_context)`` of per-replica ``(x, y, sample_weight)`` batches (Keras' batch contract);
    padding is zeros of weight 0. ``examples`` as for ``train_dataset_fn``."""
    workers = config.data_workers or tf.data.AUTOTUNE
    examples = examples or Examples(config, info)
    global_batch = config.eval_batch_size or config.global_batch_size

    def dataset_fn(ctx: tf.distribute.InputContext):
        per_replica = ctx.get_per_replica_batch_size(global_batch)
        replicas_here = ctx.num_replicas_in_sync // ctx.num_input_pipelines
        indices, _, element_shard = _eval_files(
            info, info.eval_split, ctx.num_input_pipelines, ctx.input_pipeline_id)
        readable = readable_files(info, info.eval_split)
        reader = Segments(info, info.eval_split, [(i, 0, readable[i][1]) for i in indices])
        records = segment_records(reader, reader.dataset, workers)
        if element_shard:
            records = records.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)

        def parse(key, serialized):
            x, y, *weight = examples.example(serialized, info.eval_split, key)
            return x, y, tf.cast(weight[0], tf.float32) if weight else tf.constant(1.0)

        ds = records.map(_no_autograph(parse), num_parallel_calls=workers, deterministic=True)
        if config.cache:
            ds = ds.cache()
        needed = steps * replicas_here * per_replica
        # Endless weight-0 padding: every pipeline yields exactly `needed` examples (unreadable records skipped).
        padding = tf.data.Dataset.from_tensors(
            tf.nest.map_structure(lambda spec: tf.zeros(spec.shape, spec.dtype), ds.element_spec)).repeat()
        ds = ds.concatenate(padding).take(needed).batch(per_replica, drop_remainder=True)
        return _with_options(ds.prefetch(tf.data.AUTOTUNE), config, True)

    return dataset_fn


def split_examples(examples: Examples, split: str):
    """Every readable record of ``split`` once, in a fixed order, as the task's unbatched examples (``(x, y)`` or
    ``(x, y, sample_weight)``; not augmented, labels checked, unreadable records read around): for a split read
    on the host, as a GAN reads real images for FID."""
    info = examples.info
    reader = Segments(info, split, [(i, 0, n) for i, (_, n) in enumerate(readable_files(info, split))])
    records = segment_records(reader, reader.dataset, tf.data.AUTOTUNE)
    return records.map(_no_autograph(lambda key, serialized: examples.example(serialized, split, key)),
                       num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def steps_per_epoch(config: InputConfig, info: DatasetInfo) -> float:
    return info.num_train_examples / config.examples_per_step


def resolve_train_steps(config: InputConfig, info: DatasetInfo) -> int:
    """--train (else --train_steps, else --epochs) in optimizer steps, covering a last partial epoch."""
    length = durations.of(config, "train")
    return max(1, durations.to_steps(length, steps_per_epoch(config, info), config.examples_per_step, round_up=True))

