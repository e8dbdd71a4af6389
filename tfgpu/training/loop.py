"""The compiled loop over steps, one for every door: ``run_steps`` is tfgpu's one ``tf.while_loop`` over steps.

``while i < n: strategy.run(step, (next(iterator),))`` (a tf.while_loop) is what Keras 3 ``fit`` cannot do under
MirroredStrategy with ``steps_per_execution > 1`` or under MultiWorkerMirroredStrategy. ``run_steps`` runs it for
the flag command (``build_loop`` below), for ``tfgpu.fit`` (``fit/steps.py``: the model's own train/test step) and for
the script's own ``model.evaluate``/``predict`` under a job strategy (``keras_adapter``'s replacement of Keras'
``_make_function``): n steps per host call, an input of known length or one that may end, a stop request
(``StopFlag``: Ctrl-C, SIGTERM) ending a call after the step in flight, which says how many steps it ran.
``build_loop``'s steps add their metric shares per replica to sync-on-read variables, which the same call reads as
their sum over replicas and zeroes, and returns: one host call per loop, no eager op between loops; a run of
consecutive skipped (non-finite) steps is counted across loops.
"""
import contextlib
import threading
import time

import tensorflow as tf

from tfgpu.training import replica_local



def step_counter(strategy) -> tf.Variable:
    """The run's one step counter, made before the task so that the task is built with it (``Task.__init__``): it
    counts every step, skipped or not; the train loop advances it, checkpoints save it, schedules and a GAN's
    random draws follow it."""
    with strategy.scope():
        return tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step",
                           aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)


def host_cpu_only(placement) -> bool:
    """Whether each worker's one replica is its host CPU (one_device or one CPU replica per worker, no GPU):
    nothing to copy batches to, nothing to split among a worker's replicas."""
    return placement.num_replicas == placement.num_workers and \
        not any("GPU" in device.upper() for device in placement.devices)


def input_iterator(strategy, placement, dataset_fn):
    """An iterator over ``dataset_fn``'s per-replica batches for ``strategy.run``.

    When each worker's one replica is its host CPU, the dataset's own iterator, called with this worker's
    ``InputContext`` as ``distribute_datasets_from_function`` would call it: a distributed dataset's iterator
    there has no device to prefetch to, yet while it exists every op of the process ran about 2x the CPU time
    (Keras ``fit`` too, measured with tf.profiler: the same kernels, each slower; 6.8 against 14.6 CPU ms per
    small_cnn step on a 2-core host; 2 workers of one core each over localhost, quickstart at batch 64 each:
    92 against 52 ms per step). Every worker runs the same number of steps of its own share, so no worker
    needs the distributed iterator's agreement on the end. Elsewhere (GPUs, several replicas on a worker) the
    strategy's distributed dataset, which prefetches to the devices and splits the input among replicas."""
    if host_cpu_only(placement):
        return iter(dataset_fn(tf.distribute.InputContext(placement.num_workers, placement.worker_index,
                                                          placement.num_replicas)))
    return iter(strategy.distribute_datasets_from_function(dataset_fn))


def accumulators(strategy, names) -> dict:
    """Per-replica float32 sums that read as the sum over replicas."""
    with strategy.scope():
        return {name: tf.Variable(0.0, trainable=False, name=f"sum_{name}",
                                  synchronization=tf.VariableSynchronization.ON_READ,
                                  aggregation=tf.VariableAggregation.SUM) for name in names}


def take_sums(sums: dict) -> dict:
    """The sums over replicas as tensors, zeroed for the next loop (in a loop's graph, or eagerly)."""
    values = {name: var.read_value() for name, var in sums.items()}
    for var in sums.values():
        var.assign(tf.zeros_like(var))
    return values


def as_floats(values: dict) -> dict:
    """A loop's returned sums as Python floats; reading waits for the loop's steps."""
    return {name: float(value.numpy()) for name, value in values.items()}


class SkippedRun:
    """Counts consecutive skipped steps inside the train loop, so that a run of them is seen wherever loop
    boundaries fall: ``current`` is the run in progress (carried from loop to loop, 0 after a finite step),
    ``longest`` the longest run that reached into the current loop. A step is skipped on every replica or on
    none (finiteness is all-reduced), so every replica counts the same and the replica mean reads the count.
    Not checkpointed: a resumed run starts counting from 0."""

    def __init__(self, strategy):
        with strategy.scope():
            self.current, self.longest = (
                tf.Variable(0.0, trainable=False, name=name, synchronization=tf.VariableSynchronization.ON_READ,
                            aggregation=tf.VariableAggregation.MEAN) for name in ("skip_run", "longest_skip_run"))

    def update(self, skipped):
        """In a replica step: extends the run on a skipped step, ends it on a finite one."""
        run = tf.where(skipped, self.current + 1.0, 0.0)
        self.current.assign(run)
        self.longest.assign(tf.maximum(self.longest, run))

    def take_longest(self):
        """The longest run that reached into the loop just finished, as a tensor; starts the next loop's count."""
        longest = self.longest.read_value()
        self.longest.assign(0.0)
        return longest

    def reset(self) -> None:
        for variable in (self.current, self.longest):
            variable.assign(0.0)


# Several workers agree whether to stop about this often (wall time): one all-reduce of two numbers per check.
CHECK_INTERVAL_S = 0.5
MAX_CHECK_EVERY = 100_000
CLOCK_TICK_S = 0.05  # how often ``StopFlag.ticking`` sets the loops' clock


class StopFlag:
    """A request to stop between two steps, read inside the compiled loops (``build_loop``): a stop waits for the
    step in flight, not for the rest of a loop of --steps_per_loop steps.

    ``request`` may be called from any thread while a loop runs (the signal watcher of ``training.interrupts``):
    TensorFlow holds no GIL while a tf.function runs, and the loop's reads of the variable see the write. With one
    worker the loop reads it after every step (one variable read; its replicas share one graph). With several,
    every worker must stop after the same step (a step's all-reduce waits for all of them), so they all-reduce their
    flags, and with them the time since the last such check, every ``check_every`` steps: the same decision on every
    worker, from the same sums. ``check_every`` is set from that summed time to about ``CHECK_INTERVAL_S`` apart
    (at least every step), so a check costs one small all-reduce per half second (measured: 1.5-2 ms a check on
    two localhost workers over gRPC, 30-50% of a 3-5 ms toy step if done every step) and a stop waits at most
    max(one step, ``CHECK_INTERVAL_S``). The time comes from ``clock``, a variable a thread sets while training
    (``ticking``): TensorFlow's own clock op (tf.timestamp) is refused under --deterministic's op determinism."""

    def __init__(self, strategy, num_workers: int):
        self.strategy = strategy
        self.num_workers = num_workers
        self.requested_by = None  # what asked, for the host (a signal's number); the variable is the loops'
        # Plain (per worker) variables on the host: each worker's own request, and what its checks carry.
        with tf.device("/cpu:0"):
            self.flag = tf.Variable(0.0, trainable=False, name="stop_requested")
            if num_workers > 1:
                self.since_check = tf.Variable(0, dtype=tf.int64, trainable=False, name="steps_since_stop_check")
                self.check_every = tf.Variable(1, dtype=tf.int64, trainable=False, name="stop_check_every")
                self.clock = tf.Variable(time.time(), dtype=tf.float64, trainable=False, name="stop_clock")
                self.checked_at = tf.Variable(time.time(), dtype=tf.float64, trainable=False, name="stop_checked_at")

    def request(self, by=True) -> None:
        """Asks the running (or next) loop to stop after its current step; ``by``: what asked (kept for the host)."""
        if self.requested_by is None:
            self.requested_by = by
        with tf.init_scope():  # now, even from a handler that Python runs while the main thread traces a function
            self.flag.assign(1.0)

    def clear(self) -> None:
        self.requested_by = None
        with tf.init_scope():
            self.flag.assign(0.0)

    @contextlib.contextmanager
    def ticking(self):
        """While inside, with several workers: a thread sets ``clock`` to the wall time every ``CLOCK_TICK_S`` for the
        loops' checks (stopped and joined on leaving)."""
        if self.num_workers == 1:
            yield
            return
        done = threading.Event()

        def tick():
            while not done.wait(CLOCK_TICK_S):
                self.clock.assign(time.time())

        thread = threading.Thread(target=tick, name="tfgpu-stop-clock", daemon=True)
        self.clock.assign(time.time())
        self.checked_at.assign(time.time())
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()

    def at_start(self):
        """In a loop's graph, before its first step: whether to run no step at all. One worker reads its flag (a
        request made between loops); several leave it to their first check (the host's vote after each loop,
        ``Stopping.any_worker_preempted``, has seen what came before)."""
        return self.flag.read_value() > 0 if self.num_workers == 1 else tf.constant(False)

    def after_step(self, done):
        """In a loop's graph, once ``done`` (the step's outputs) are computed: whether to stop after this step, the
        same on every worker."""
        with tf.control_dependencies(done):
            if self.num_workers == 1:
                return self.flag.read_value() > 0
            since = self.since_check.assign_add(1)
        return tf.cond(since >= self.check_every.read_value(), self._agree, lambda: tf.constant(False))

    def _agree(self):
        """Every worker's flag and its seconds since the last check, summed over all replicas; from the same sums
        every worker decides alike, and sets the next check about ``CHECK_INTERVAL_S`` later."""
        steps = tf.cast(self.since_check.read_value(), tf.float64)

        def replica_share():
            mine = tf.stack([tf.cast(self.flag.read_value(), tf.float64), self.clock.read_value() - self.checked_at])
            return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, mine)

        total = self.strategy.experimental_local_results(self.strategy.run(replica_share))[0]
        step_s = total[1] / float(self.strategy.num_replicas_in_sync) / tf.maximum(steps, 1.0)
        # At most twice as many steps as the last time: the clock ticks every CLOCK_TICK_S, so short checks read 0 s.
        every = tf.clip_by_value(tf.minimum(tf.floor(CHECK_INTERVAL_S / tf.maximum(step_s, 1e-6)), 2.0 * steps),
                                 1.0, MAX_CHECK_EVERY)
        with tf.control_dependencies([self.check_every.assign(tf.cast(every, tf.int64)),
                                      self.since_check.assign(0), self.checked_at.assign(self.clock.read_value())]):
            return total[0] > 0


def run_steps(step, num_steps, carried=(), *, next_batch=None, iterator=None, first=None, stop=None):
    """The one ``tf.while_loop`` over steps (issue 54: every compiled step loop of tfgpu is this one), in a
    tf.function's graph: runs ``step`` while fewer than ``num_steps`` ran, no stop was asked for and, on an input
    that may end, a next batch exists. ``step(batch, carried)`` runs one step (its ``strategy.run``) and returns
    ``(carried, done)``: the state carried from step to step (a nested structure: the last step's logs) and the
    tensors a stop waits for.

    Batches come from ``next_batch()`` (an input that holds ``num_steps`` batches: drawn in the loop's body) or
    from ``iterator`` (one that may end: read as an Optional, the next drawn only while more steps are due, so none
    is drawn and dropped at the end of a count). With ``first`` (a batch) the first step runs on it before the loop,
    so that the loop's carried state starts as that step's (its structure is the step's logs: Keras' own) and
    ``strategy.run`` is never under a ``tf.cond`` (MirroredStrategy cannot run it there: keras-team/keras#19246);
    without it the loop starts by reading ``stop`` (a ``StopFlag``: a request made between calls runs no step).
    Returns ``(steps run, whether a stop was asked for, carried)`` as tensors."""
    num_steps = tf.convert_to_tensor(num_steps)
    steps_run = tf.constant(0 if first is None else 1, num_steps.dtype)

    def stopping_after(done):
        return stop.after_step(done) if stop is not None else tf.constant(False)

    if first is not None:
        carried, done = step(first, carried)
        stopping = stopping_after(done)
    else:
        stopping = stop.at_start() if stop is not None else tf.constant(False)

    def more(i, stopping, carried, upcoming):
        going = tf.logical_and(i < num_steps, tf.logical_not(stopping))
        return going if iterator is None else tf.logical_and(going, upcoming.has_value())

    def one_step(i, stopping, carried, upcoming):
        carried, done = step(next_batch() if iterator is None else upcoming.get_value(), carried)
        if iterator is not None:  # the next batch only while more steps are due: none is drawn and dropped
            upcoming = tf.cond(i + 1 < num_steps, iterator.get_next_as_optional, lambda: upcoming)
        return i + 1, stopping_after(done), carried, upcoming

    ran, stopped, carried, _ = tf.while_loop(more, one_step, (steps_run, stopping, carried, () if iterator is None
                                                              else iterator.get_next_as_optional()))
    return ran, stopped, carried


def build_loop(strategy, step_fn, sums: dict, counter=None, batches_per_step: int = 1, skipped_run=None,
               nonfinite_names=(), stop=None, models=()):
    """A tf.function ``loop(iterator, num_steps)`` running ``num_steps`` replica steps of ``step_fn`` in one
    host call (``run_steps``), adding each step's metric shares to ``sums`` (and 1 to ``counter``). With
    ``batches_per_step`` > 1 a step gets a tuple of that many consecutive batches, so every replica holds its rows
    of the same global batches as one device would. ``skipped_run`` counts consecutive steps whose share of any of
    ``nonfinite_names`` (metrics declared ``counts_nonfinite``) is non-zero (skipped). With ``stop`` (a
    ``StopFlag``) the loop ends after the step during which a stop was requested. The call ends by averaging the
    weights of ``models`` (Keras models) that Keras 3 leaves replica-local (``replica_local``: BatchNormalization's
    moving statistics), so every replica and worker holds one model.

    The call returns ``(sums, longest, steps_run)``: the loop's sums over replicas (``take_sums``: zeroed for the
    next loop), with ``skipped_run`` the longest run of skipped steps that reached into it (else None), and the
    number of steps it ran (``num_steps`` unless stopped), as tensors. Read in the same call, they cost the host
    no eager op (the eager reads and resets took 0.9 ms a loop on a 2-core CPU, more than a small model's step)."""

    def replica_step(batch):
        values = step_fn(batch)
        updates = [sums[name].assign_add(tf.cast(value, tf.float32)) for name, value in values.items()]
        flags = [values[name] > 0 for name in nonfinite_names if name in values]
        if skipped_run is not None and flags:
            skipped_run.update(tf.reduce_any(tf.stack(flags)))
        with tf.control_dependencies(updates):
            return tf.identity(tf.constant(0))  # once the step's values are summed: the stop flag is read after it

    # No autograph: the loop is an explicit tf.while_loop, as Keras writes its own train function, and a step
    # that branched on a tensor in Python fails at trace time instead of being rewritten. Autograph converted
    # every call of the step (model, loss, optimizer, guard): ResNet-20's train loop traced in 3.5 s with it,
    # 2.0 s without, on a 2-core CPU; the graph runs the same steps.
    @tf.function(autograph=False)
    def loop(iterator, num_steps):
        def one_step(batch, carried):
            done = strategy.experimental_local_results(strategy.run(replica_step, args=(batch,)))
            if counter is not None:
                counter.assign_add(1)
            return carried, done

        def next_batch():
            return next(iterator) if batches_per_step == 1 else tuple(next(iterator) for _ in range(batches_per_step))

        steps_run, _, _ = run_steps(one_step, num_steps, next_batch=next_batch, stop=stop)
        replica_local.average_over_replicas(strategy, replica_local.replica_local_weights_of(models, strategy))
        return take_sums(sums), (skipped_run.take_longest() if skipped_run is not None else None), steps_run

    return loop
