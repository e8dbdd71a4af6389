"""An input pipeline's iterator held by one reference and destroyed on another thread, since TensorFlow 2.21
can block a minute in that destruction; the run's loops, its evaluation and the GAN's FID read through it."""
import threading

from tfgpu.runtime import process_exit


class Feed:
    """The one reference to an input pipeline's iterator (``input_iterator``'s, or any tf.data iterator), so that
    ``release`` can destroy the pipeline on another thread: in TensorFlow 2.21 destroying an autotuned tf.data
    iterator can block for up to a minute (``release``). The caller keeps no other reference. As a context
    manager it releases on leaving the block, an exception included."""

    def __init__(self, iterator):
        self.iterator = iterator

    def __enter__(self) -> "Feed":
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()

    def release(self) -> None:
        """Drops the iterator; its pipeline is destroyed on another thread and the caller goes on at once.

        The iterator's destructor stops tf.data's autotune thread and waits for it. That thread sleeps between
        optimizations, 10 ms at first and twice as long after each, up to 60 s. ``CancellationManager::StartCancel``
        runs the callback that wakes it before it marks itself cancelled, so a thread that wakes in between finds
        no cancellation and sleeps out its period. Measured on 2 cores: 13 of 100 deletions of 2-second-old
        iterators waited 0.54 s (none with autotune off), and 5 of 42 runs of mnist5k to a target waited 1.5 to
        38.5 s at that ``del`` (native stacks: the main thread in ``RootDataset::Iterator::~Iterator``, the autotune
        thread asleep in ``Model::OptimizeLoop``). The destroying thread holds no GIL while it waits.

        Not a daemon thread: the interpreter waits for it at exit. A daemon thread that finishes the destruction
        while the interpreter finalizes is ended by Python 3.11 with ``pthread_exit`` through TensorFlow's C++
        frames, which aborts the process ("FATAL: exception not rethrown"; seen when a preempted worker exited
        143 right after its release). tfgpu's commands do not wait for it (``process_exit.exit_command``); a
        Python caller's interpreter does, at its exit."""
        held, self.iterator = [self.iterator], None
        thread = threading.Thread(target=held.clear, name="tfgpu-release-input")
        thread.start()
        process_exit.track(thread)
