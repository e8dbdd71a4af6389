"""How long the thread that destroys a tf.data iterator waits, with tf.data autotune on and off, and how long the
caller waits when tfgpu releases the iterator (``tfgpu.runtime.feed.Feed.release``).

In TensorFlow 2.21 the iterator's destructor stops tf.data's autotune thread and waits for it to end. That thread
sleeps between optimizations (10 ms at first, twice as long after each, at most 60 s), and the cancellation that
should wake it can be missed: ``CancellationManager::StartCancel`` runs the wake-up callback before it marks itself
cancelled, so a thread that wakes in between sleeps out its period. Each deletion here is of an iterator
``--age_s`` old that fed a small parallel map; one that waits does so for the rest of the autotune thread's period.

    python tools/iterator_teardown.py --deletions=100 --age_s=2

Prints one line per mode (deletions that waited over --threshold_s, median and longest wait). With TF's race fixed,
the ``autotune on`` line shows none over the threshold and Feed.release is no longer needed.
"""
import argparse
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MODES = ("autotune on", "autotune off", "Feed.release")


def measure(mode: str, deletions: int, age_s: float) -> list:
    """Seconds the destroying caller waited, one per deletion."""
    from types import SimpleNamespace

    import tensorflow as tf

    from tfgpu.runtime import feed as feed_lib
    from tfgpu.training import loop

    def work(x):
        a = tf.random.stateless_normal([128, 128], seed=tf.stack([x, 0]))
        return tf.reduce_sum(tf.tanh(a @ a))

    options = tf.data.Options()
    options.autotune.enabled = mode != "autotune off"
    dataset = tf.data.Dataset.range(1 << 40).map(work, num_parallel_calls=tf.data.AUTOTUNE).batch(8)
    dataset = dataset.prefetch(tf.data.AUTOTUNE).with_options(options)
    placement = SimpleNamespace(devices=("/job:localhost/replica:0/task:0/device:CPU:0",), num_replicas=1,
                                num_workers=1, worker_index=0)
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    waits = []
    for _ in range(deletions):
        feed = feed_lib.Feed(loop.input_iterator(strategy, placement, lambda ctx: dataset))
        end = time.time() + age_s
        while time.time() < end:
            next(feed.iterator)
        started = time.perf_counter()
        if mode == "Feed.release":
            feed.release()
        else:
            del feed  # the last reference: the iterator is destroyed here
        waits.append(time.perf_counter() - started)
    for thread in threading.enumerate():
        if thread.name == "tfgpu-release-input":
            thread.join(120)
    return waits


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deletions", type=int, default=100, help="iterators destroyed per mode")
    parser.add_argument("--age_s", type=float, default=2.0, help="seconds each iterator feeds before it is destroyed")
    parser.add_argument("--threshold_s", type=float, default=0.05, help="a wait longer than this counts as one")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated, of: " + ", ".join(MODES))
    args = parser.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",")]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        parser.error(f"--modes: {', '.join(map(repr, unknown))} is not one of {', '.join(MODES)}")
    if args.deletions < 1 or args.age_s <= 0:
        parser.error(f"--deletions must be >= 1 and --age_s > 0 (got {args.deletions} and {args.age_s})")
    for mode in modes:
        waits = sorted(measure(mode, args.deletions, args.age_s))
        over = sum(w > args.threshold_s for w in waits)
        print(f"{mode}: {over} of {len(waits)} deletions waited over {args.threshold_s} s "
              f"(median {waits[len(waits) // 2]:.3f} s, longest {waits[-1]:.2f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
