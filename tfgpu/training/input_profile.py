"""--profile_input: is the run waiting for data? Times the input pipeline alone and the train step alone.

The step is timed on one cached batch with every variable restored afterwards, so training is unchanged;
the real run's rate is compared with both at the end (``finish``), and ``input_profile.json`` records the
verdict (the one input-bound rule, shared with report.md).
"""
import json
import logging
import os
import tempfile
import time

import tensorflow as tf

from tfgpu.reporting.report import input_verdict
from tfgpu.runtime.fileio import atomic_write_bytes
from tfgpu.runtime import feed as feed_lib
from tfgpu.runtime import run_dir

log = logging.getLogger("tfgpu")


def measure(strategy, make_iterator, dataset_fn, train_loop, checkpoint_items: dict, examples_per_batch: int,
            examples_per_step: int, on_done, batches: int = 20) -> dict:
    """Examples per second of the input pipeline alone (``dataset_fn``) and of ``train_loop`` on one cached
    batch, both read through ``make_iterator(dataset_fn)``, the iterator the run itself trains from
    (``loop.input_iterator``). ``checkpoint_items`` (with the step) are snapshotted and restored around the
    timed steps; the loop zeroes its sums as it returns them, and ``on_done`` resets what else it carries from
    call to call (the run of skipped steps) afterwards."""

    @tf.function
    def drain(iterator, num_batches):
        total = tf.constant(0.0)
        for _ in tf.range(num_batches):
            per_replica = strategy.run(lambda batch: tf.reduce_sum(tf.cast(batch[1], tf.float32)),
                                       args=(next(iterator),))
            total += strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
        return total

    def rate(fn, iterator, examples_per_iteration):
        fn(iterator, tf.constant(3, tf.int64))  # warm up: tracing, buffers, first files
        started = time.perf_counter()
        for tensor in tf.nest.flatten(fn(iterator, tf.constant(batches, tf.int64))):
            if tensor is not None:
                tensor.numpy()  # reading what the call returns (the loop's sums, the drained total) waits for it
        return batches * examples_per_iteration / (time.perf_counter() - started)

    # released off-thread, as the run's own (runtime/feed.py)
    with feed_lib.Feed(make_iterator(dataset_fn)) as pipeline:
        input_rate = rate(drain, pipeline.iterator, examples_per_batch)
    snapshot = tf.train.Checkpoint(**checkpoint_items)
    with tempfile.TemporaryDirectory(prefix="tfgpu-profile-") as tmp:
        saved = snapshot.write(os.path.join(tmp, "snapshot"))
        with feed_lib.Feed(make_iterator(lambda ctx: dataset_fn(ctx).take(1).cache().repeat())) as one_batch:
            compute_rate = rate(train_loop, one_batch.iterator, examples_per_step)
        snapshot.read(saved).assert_consumed()
    on_done()
    return {"input_examples_per_sec": input_rate, "compute_examples_per_sec": compute_rate}


def finish(profile: dict, train_rate: float, model_dir: str, chief: bool) -> dict:
    """Share of step time spent waiting for data: 1 - (real rate / rate with data already in place)."""
    profile["train_examples_per_sec"] = train_rate
    profile["input_wait_fraction"] = max(0.0, 1.0 - train_rate / profile["compute_examples_per_sec"])
    verdict = profile["verdict"] = input_verdict(profile)
    log.info("input profile: %s (input alone %.0f ex/s, step alone %.0f ex/s, training %.0f ex/s)", verdict,
             profile["input_examples_per_sec"], profile["compute_examples_per_sec"], train_rate)
    if chief:
        atomic_write_bytes(run_dir.input_profile(model_dir), json.dumps(profile, indent=2).encode())
    return profile
