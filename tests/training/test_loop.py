"""The compiled loop: n steps per host call, metric sums over replicas, skipped runs counted across loops."""
import threading
import time

import pytest
import tensorflow as tf

from tfgpu.training import loop


def _run(strategy, skipped_per_step, steps_per_call):
    """Runs a toy step whose 'skipped' share is read from ``skipped_per_step`` (by the step counter)."""
    with strategy.scope():
        step = tf.Variable(0, dtype=tf.int64, trainable=False, aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
    flags = tf.constant(skipped_per_step, tf.float32)
    sums = loop.accumulators(strategy, ("loss", "skipped"))
    skipped_run = loop.SkippedRun(strategy)

    def step_fn(batch):
        return {"loss": tf.reduce_sum(batch), "skipped": flags[step]}

    train_loop = loop.build_loop(strategy, step_fn, sums, step, 1, skipped_run, ("skipped",))
    iterator = iter(strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensors([1.0, 1.0]).repeat()))
    calls = []
    for n in steps_per_call:
        taken, longest, ran = train_loop(iterator, tf.constant(n, tf.int64))
        assert int(ran) == n
        calls.append((loop.as_floats(taken), int(longest)))
    return int(step.numpy()), calls


def test_a_call_runs_n_steps_and_returns_their_summed_metric_shares():
    steps, calls = _run(tf.distribute.get_strategy(), [0.0] * 8, [5, 3])
    assert steps == 8
    assert [c[0]["loss"] for c in calls] == [10.0, 6.0]  # 2 per step, zeroed by the call that returned them


def _stoppable(strategy, num_workers=1, request_at=None):
    """A loop of toy steps (each sums its batch [1, 1]: 2) that reads a StopFlag; with ``request_at`` the step of
    that index (0-based) asks for the stop itself, as a signal during it would."""
    with strategy.scope():
        step = tf.Variable(0, dtype=tf.int64, trainable=False, aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
    stop = loop.StopFlag(strategy, num_workers)
    sums = loop.accumulators(strategy, ("loss",))

    def step_fn(batch):
        if request_at is not None:
            with tf.control_dependencies([tf.cond(tf.equal(step, request_at), lambda: stop.flag.assign(1.0),
                                                  lambda: stop.flag.read_value())]):
                batch = tf.identity(batch)
        return {"loss": tf.reduce_sum(batch)}

    train_loop = loop.build_loop(strategy, step_fn, sums, step, stop=stop)
    iterator = iter(tf.data.Dataset.from_tensors([1.0, 1.0]).repeat())
    return train_loop, iterator, step, stop


def test_a_stop_requested_during_a_step_ends_the_loop_after_it_and_the_call_says_how_many_ran():
    """The step, the sums and the steps run agree, so the trainer's step counter, data position and metrics stay
    exact; a later call after ``clear`` runs whole again."""
    train_loop, iterator, step, stop = _stoppable(tf.distribute.get_strategy(), request_at=5)
    sums, _, ran = train_loop(iterator, tf.constant(1000, tf.int64))
    assert int(ran) == 6 and int(step.numpy()) == 6 and loop.as_floats(sums) == {"loss": 12.0}
    sums, _, ran = train_loop(iterator, tf.constant(3, tf.int64))  # still requested: not a step more
    assert int(ran) == 0 and int(step.numpy()) == 6 and loop.as_floats(sums) == {"loss": 0.0}
    stop.clear()
    sums, _, ran = train_loop(iterator, tf.constant(3, tf.int64))
    assert int(ran) == 3 and int(step.numpy()) == 9


def test_a_stop_requested_from_another_thread_reaches_a_running_loop():
    """What the signal watcher does: the host's main thread is inside one call of a million steps (TensorFlow holds
    no GIL then); a request from another thread ends it within a step, not at its end."""
    train_loop, iterator, step, stop = _stoppable(tf.distribute.get_strategy())
    train_loop(iterator, tf.constant(1, tf.int64))  # traced
    timer = threading.Timer(0.5, stop.request)
    started = time.perf_counter()
    timer.start()
    sums, _, ran = train_loop(iterator, tf.constant(1_000_000, tf.int64))
    elapsed = time.perf_counter() - started
    assert 0 < int(ran) < 1_000_000 and int(step.numpy()) == int(ran) + 1, int(ran)
    assert loop.as_floats(sums) == {"loss": 2.0 * int(ran)}
    assert 0.5 <= elapsed < 5.0, elapsed


def test_several_workers_check_every_few_steps_about_half_a_second_apart():
    """With several workers the flag is all-reduced every ``check_every`` steps, which follows the measured step
    time (here one replica stands for the workers): after the first checks it grows far above 1 for
    sub-millisecond steps, and a request is still seen within about CHECK_INTERVAL_S."""
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    train_loop, iterator, step, stop = _stoppable(strategy, num_workers=2)
    with stop.ticking():
        sums, _, ran = train_loop(iterator, tf.constant(3000, tf.int64))
        assert int(ran) == 3000
        every = int(stop.check_every.numpy())
        assert every > 20, every  # a check costs an all-reduce: not every step
        timer = threading.Timer(0.5, stop.request)
        started = time.perf_counter()
        timer.start()
        _, _, ran = train_loop(iterator, tf.constant(10_000_000, tf.int64))
        elapsed = time.perf_counter() - started
    assert int(ran) < 10_000_000 and elapsed < 0.5 + 4 * loop.CHECK_INTERVAL_S + 1.0, (int(ran), elapsed)
    assert int(step.numpy()) == 3000 + int(ran)


MIRRORED = """
import json, sys
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
sys.path.insert(0, sys.argv[1])
from test_loop import _run
steps, calls = _run(tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]), [0, 1, 1, 0, 1, 1], [3, 3])
print("RESULT " + json.dumps({"steps": steps, "calls": calls}))
"""


# Slow (7.5 s: a process of its own); by default tests/training/test_trainer.py's mirrored-vs-one-device run
# compares the per-loop losses these sums give, over two loops.
@pytest.mark.slow
def test_mirrored_sums_come_back_from_the_call_and_every_replica_restarts_at_zero():
    """Read inside the compiled call, a sync-on-read sum is the sum over both replicas; zeroed there, the next
    call starts from zero on each replica; a skipped run straddling the calls is still one run. (A process of
    its own: the host CPU is split into two devices before TensorFlow starts.)"""
    import json
    import os
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", MIRRORED, os.path.dirname(__file__)], capture_output=True,
                          text=True, timeout=120)
    result = json.loads(proc.stdout.split("RESULT ", 1)[1]) if "RESULT " in proc.stdout else proc.stderr[-2000:]
    # Each replica sums its half of the batch [1, 1]: 2 per step over both, as on one device; the skipped shares
    # (not divided by replicas in this toy step) 2 per replica; runs of 2 skipped steps in each call.
    assert result == {"steps": 6, "calls": [[{"loss": 6.0, "skipped": 4.0}, 2], [{"loss": 6.0, "skipped": 4.0}, 2]]}


def _placement(devices, workers=1, worker_index=0):
    from types import SimpleNamespace

    return SimpleNamespace(devices=tuple(devices), num_replicas=len(devices) * workers, num_workers=workers,
                           worker_index=worker_index)


def test_one_cpu_replica_per_worker_reads_its_dataset_directly_and_devices_get_the_distributed_input():
    """On a worker whose one replica is its host CPU a distributed dataset has nowhere to prefetch to, yet
    doubled the CPU time of every op while it existed; GPUs and several replicas on a worker keep the strategy's
    distributed input."""
    cpu, gpu = "/job:localhost/replica:0/task:0/device:CPU:0", "/job:localhost/replica:0/task:0/device:GPU:0"
    assert loop.host_cpu_only(_placement([cpu]))
    assert not loop.host_cpu_only(_placement([gpu]))
    assert not loop.host_cpu_only(_placement([cpu, cpu.replace("CPU:0", "CPU:1")]))
    assert loop.host_cpu_only(_placement([cpu], workers=2))
    assert not loop.host_cpu_only(_placement([cpu, cpu.replace("CPU:0", "CPU:1")], workers=2))

    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    batches = lambda ctx: tf.data.Dataset.range(6).map(lambda i: tf.fill([2], tf.cast(i, tf.float32)))  # noqa: E731
    iterator = loop.input_iterator(strategy, _placement([cpu]), batches)
    assert isinstance(iterator, tf.data.Iterator)
    sums = loop.accumulators(strategy, ("loss",))
    train_loop = loop.build_loop(strategy, lambda batch: {"loss": tf.reduce_sum(batch)}, sums)
    taken, _, _ = train_loop(iterator, tf.constant(4, tf.int64))
    assert loop.as_floats(taken) == {"loss": 12.0}  # 2 x (0 + 1 + 2 + 3): every batch once, in order
    distributed = loop.input_iterator(strategy, _placement([gpu]), batches)
    assert isinstance(distributed, tf.distribute.DistributedIterator)


def test_a_worker_of_several_reads_its_own_share_as_the_distributed_dataset_would_give_it():
    """Worker 1 of 3, one CPU replica each: the dataset function gets the context
    ``distribute_datasets_from_function`` would give worker 1, so each worker reads its own share."""
    cpu = "/job:worker/replica:0/task:1/device:CPU:0"
    seen = []

    def batches(ctx):
        seen.append((ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.num_replicas_in_sync))
        return tf.data.Dataset.range(9).shard(ctx.num_input_pipelines, ctx.input_pipeline_id)

    iterator = loop.input_iterator(None, _placement([cpu], workers=3, worker_index=1), batches)
    assert seen == [(3, 1, 3)] and [int(x) for x in iterator] == [1, 4, 7]
