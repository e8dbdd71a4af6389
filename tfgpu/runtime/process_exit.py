"""How a tfgpu command's process ends once its outputs are written: at once, not held open by TensorFlow.

Two things held finished runs open (TensorFlow 2.21, 2 cores):
- the interpreter's last garbage collection, which walks every object TensorFlow made (2-6 s): ``gc.freeze``
  leaves them to the OS, which takes the memory back at exit;
- an input pipeline still being destroyed on a ``feed.Feed`` release thread. tf.data's autotune thread can miss
  its wake-up and sleep out its period, up to 60 s (``feed.Feed.release``); the interpreter waits for that
  non-daemon thread. Measured: 26 s after the outputs of a 64 s mnist5k run to its target.

Such threads are registered here (``track``). Destroying a pipeline writes nothing, so ``exit_command`` lets them
go: when one is still running after a short grace and no other thread would hold the interpreter open, it runs
the atexit handlers (logging's flush among them) and ends the process with ``os._exit``.
"""
import atexit
import gc
import os
import sys
import threading
import time

# A pipeline's destruction normally takes 0.1-0.2 s (the shutdown record's trainer_teardown_s).
GRACE_S = 2.0

_tracked = []  # (thread, monotonic start) of teardown threads that exit_command may abandon
_in_command = False  # whether run_command runs this process's command (not a library call from a user's Python)


def track(thread: threading.Thread) -> None:
    """Registers a started thread that only tears down (writes nothing), so that ``exit_command`` need not wait
    for it. Finished ones are dropped, so a long process does not accumulate them."""
    _tracked[:] = [(t, started) for t, started in _tracked if t.is_alive()]
    _tracked.append((thread, time.monotonic()))


def unfinished(wait_s: float) -> list:
    """Waits up to ``wait_s`` in all for the tracked threads; returns those still running as (thread, seconds
    running), longest first (empty when all are done)."""
    deadline = time.monotonic() + wait_s
    for thread, _ in list(_tracked):
        thread.join(max(0.0, deadline - time.monotonic()))
    now = time.monotonic()
    return sorted(((thread, now - started) for thread, started in _tracked if thread.is_alive()),
                  key=lambda pair: -pair[1])


def run_command(main):
    """Runs a command's ``main`` and ends the process with its exit status (``exit_command``), that of a
    ``SystemExit`` it raised included: a preempted run's 143 (``failures.PREEMPTED``, which ``main`` returns) must
    not wait either, nor a crashed worker, whose peers wait for it to go. An uncaught exception is printed and
    exits 1, as the interpreter would do."""
    global _in_command
    _in_command = True
    try:
        code = main()
    except SystemExit as e:
        code = e.code
    except Exception:
        sys.excepthook(*sys.exc_info())
        code = 1
    exit_command(code)


def in_command() -> bool:
    """Whether this process is a tfgpu command (``run_command``), which may end the process itself (a second Ctrl-C
    while training), rather than a user's Python calling tfgpu (``tfgpu.fit``), whose process is the user's."""
    return _in_command


def exit_command(code):
    """Ends a command's process with exit status ``code`` (as ``sys.exit`` takes it), waiting up to ``GRACE_S`` for
    tracked threads; never returns. Called once the command's outputs are written."""
    gc.freeze()
    stuck = unfinished(GRACE_S)
    abandoned = {thread for thread, _ in stuck}
    others = [thread for thread in threading.enumerate()
              if thread is not threading.main_thread() and not thread.daemon and thread not in abandoned]
    if not stuck or others:  # others: the interpreter waits for them, and so for ours too
        sys.exit(code)
    print(f"tfgpu: not waiting for {len(stuck)} input pipeline(s) still stopping after {stuck[0][1]:.0f} s "
          "(TensorFlow 2.21's tf.data autotune thread can miss its wake-up and sleep up to 60 s; docs/benchmarks.md); "
          "stopping a pipeline writes nothing", file=sys.stderr, flush=True)
    if code is None:
        code = 0
    elif not isinstance(code, int):  # sys.exit's message form
        print(code, file=sys.stderr)
        code = 1
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
