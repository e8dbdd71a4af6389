"""runtime/feed.py: an input pipeline's iterator, destroyed off the caller's thread."""
import threading
import time

import tensorflow as tf

from tfgpu.runtime import feed as feed_lib
from tfgpu.runtime import process_exit


def test_a_released_feed_stops_its_pipeline_on_another_thread_and_the_caller_does_not_wait():
    """Destroying a tf.data iterator waits for its pipeline's threads (in TF 2.21 sometimes for the autotune
    thread's whole sleep, up to a minute); ``Feed.release`` leaves that wait to another thread."""
    in_flight = threading.Event()

    def slow(x):
        if x >= 2:  # elements 0 and 1 make the first batch; 2 and 3 are then being read when the feed is released
            in_flight.set()
        time.sleep(1.5)
        return x

    batches = lambda ctx: tf.data.Dataset.range(100).map(  # noqa: E731
        lambda x: tf.py_function(slow, [x], tf.int64), num_parallel_calls=2).batch(2)
    feed = feed_lib.Feed(iter(batches(None)))
    assert next(feed.iterator).numpy().tolist() == [0, 1]
    assert in_flight.wait(10)

    earlier = set(threading.enumerate())  # other tests' releases may still be running in this process
    started = time.perf_counter()
    feed.release()
    assert time.perf_counter() - started < 0.5  # destroying it here waits for the 1.5 s reads in flight
    assert feed.iterator is None
    (releasing,) = [t for t in threading.enumerate() if t.name == "tfgpu-release-input" and t not in earlier]
    assert releasing.is_alive()  # still waiting for those reads
    assert not releasing.daemon  # the interpreter waits for it: a daemon ending mid-finalization aborts
    assert releasing in [thread for thread, _ in process_exit.unfinished(0)]  # so tfgpu's commands need not wait
    releasing.join(30)
    assert not releasing.is_alive()  # the pipeline did stop
