"""The compiled loop: n steps per host call, metric sums over replicas, skipped runs counted across loops."""
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
        train_loop(iterator, tf.constant(n, tf.int64))
        calls.append((loop.read_and_reset(sums), skipped_run.read_longest()))
    return int(step.numpy()), calls


def test_a_call_runs_n_steps_and_sums_their_metric_shares():
    steps, calls = _run(tf.distribute.get_strategy(), [0.0] * 8, [5, 3])
    assert steps == 8
    assert [c[0]["loss"] for c in calls] == [10.0, 6.0]  # 2 per step, then reset after each read


def test_a_run_of_skipped_steps_is_counted_across_call_boundaries():
    """Three skipped steps that straddle two calls are one run of 3, and a finite step ends a run."""
    skipped = [0, 1, 0, 0, 1, 1, 1, 0, 0]
    _, calls = _run(tf.distribute.get_strategy(), skipped, [5, 4])
    assert [c[0]["skipped"] for c in calls] == [2.0, 2.0]
    assert [c[1] for c in calls] == [1, 3]


def _placement(devices, workers=1):
    from types import SimpleNamespace

    return SimpleNamespace(devices=tuple(devices), num_replicas=len(devices), num_workers=workers)


def test_one_cpu_replica_reads_its_dataset_directly_and_devices_get_the_distributed_input():
    """On the host CPU alone a distributed dataset has nowhere to prefetch to, yet doubled the CPU time of
    every op while it existed; GPUs, several replicas and workers keep the strategy's distributed input."""
    cpu, gpu = "/job:localhost/replica:0/task:0/device:CPU:0", "/job:localhost/replica:0/task:0/device:GPU:0"
    assert loop.host_cpu_only(_placement([cpu]))
    assert not loop.host_cpu_only(_placement([gpu]))
    assert not loop.host_cpu_only(_placement([cpu, cpu.replace("CPU:0", "CPU:1")]))
    assert not loop.host_cpu_only(_placement([cpu], workers=2))

    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    batches = lambda ctx: tf.data.Dataset.range(6).map(lambda i: tf.fill([2], tf.cast(i, tf.float32)))  # noqa: E731
    iterator = loop.input_iterator(strategy, _placement([cpu]), batches)
    assert isinstance(iterator, tf.data.Iterator)
    sums = loop.accumulators(strategy, ("loss",))
    train_loop = loop.build_loop(strategy, lambda batch: {"loss": tf.reduce_sum(batch)}, sums)
    train_loop(iterator, tf.constant(4, tf.int64))
    assert loop.read_and_reset(sums) == {"loss": 12.0}  # 2 x (0 + 1 + 2 + 3): every batch once, in order
    distributed = loop.input_iterator(strategy, _placement([gpu]), batches)
    assert isinstance(distributed, tf.distribute.DistributedIterator)
