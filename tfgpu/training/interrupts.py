"""Ctrl-C and SIGTERM while training: a request to stop after the current step and save, not a crash.

The first SIGINT or SIGTERM asks the compiled loops to stop (``loop.StopFlag``); the trainer then saves a checkpoint
at that step and raises ``failures.Interrupted`` (SIGINT: exit 130) or ``failures.Preempted`` (SIGTERM: exit 143).
A second SIGINT gives up the save: a command ends at once (exit 130), saying what is lost; under ``tfgpu.fit`` a
KeyboardInterrupt reaches the caller as soon as Python runs again. A second SIGTERM changes nothing (the save is
under way; the cluster's SIGKILL ends it if its grace period is over).

Why a thread: Python runs a signal handler only between two bytecodes of the main thread, and the main thread
sits in one TensorFlow call for a whole loop of steps (minutes with a large --steps_per_loop). The C-level
handler writes the signal's number to ``signal.set_wakeup_fd``'s pipe at once, from whatever thread the kernel
picked; a watcher thread reading that pipe requests the stop while the loop runs (TensorFlow holds no GIL then).
Importing this module loads no TensorFlow.
"""
import logging
import os
import select
import signal
import sys
import threading

log = logging.getLogger("tfgpu")

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopSignals:
    """While active (a context manager, in the main thread): SIGINT and SIGTERM call ``on_stop(signum)`` once, for
    the first of them, from the watcher thread or the main thread, whichever reads it first. A later SIGINT calls
    ``lost()`` (a sentence: what is not saved) and then, with ``exit_at_once`` (a command), prints it and ends the
    process with exit 130; else (a library call) raises KeyboardInterrupt with it in the main thread. Outside the
    main thread (where Python installs no handler) it does nothing. On leaving, the previous handlers and wakeup
    fd are back; signals that are not ours are passed on to the wakeup fd that was there."""

    def __init__(self, on_stop, lost, exit_at_once: bool):
        self.on_stop, self.lost, self.exit_at_once = on_stop, lost, exit_at_once
        self.received = []  # the stop signals delivered, in order
        self._lock = threading.RLock()  # the main thread's handler may run again inside itself
        self._active = False
        self._raised = False

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is not threading.main_thread():
            log.debug("not in the main thread: Ctrl-C and SIGTERM are not turned into a save")
            return self
        self._read, self._write = os.pipe()
        for fd in (self._read, self._write):
            os.set_blocking(fd, False)
        self._previous = {s: signal.signal(s, self._handler) for s in STOP_SIGNALS}
        self._previous_fd = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        self._active = True
        self._watcher = threading.Thread(target=self._watch, name="tfgpu-stop-signals", daemon=True)
        self._watcher.start()
        return self

    def __exit__(self, *exc_info) -> None:
        if not self._active:
            return
        signal.set_wakeup_fd(self._previous_fd)
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._active = False
        os.close(self._write)  # the watcher reads the end of the pipe and returns
        self._watcher.join(5.0)
        os.close(self._read)

    # -- where signals arrive --------------------------------------------------
    def _watch(self) -> None:
        while True:
            try:
                select.select([self._read], [], [])
            except (OSError, ValueError):
                return
            if not self._drain():
                return

    def _handler(self, signum, frame) -> None:
        """Python's handler (main thread): what the watcher has not read yet, then a library call's second Ctrl-C."""
        self._drain()
        if self.exit_at_once or self._raised or len(self.received) < 2 or signal.SIGINT not in self.received[1:]:
            return
        self._raised = True
        raise KeyboardInterrupt(self._lost_sentence())

    def _drain(self) -> bool:
        """Handles the signal numbers waiting in the pipe; False once the pipe is closed."""
        with self._lock:
            try:
                data = os.read(self._read, 512)
            except BlockingIOError:
                return True
            except OSError:
                return False
            if not data:
                return False
            for signum in data:
                if signum in STOP_SIGNALS:
                    self._delivered(signum)
                elif self._previous_fd >= 0:  # another's signal: its own wakeup fd gets it
                    try:
                        os.write(self._previous_fd, bytes([signum]))
                    except OSError:
                        pass
            return True

    def _delivered(self, signum: int) -> None:
        self.received.append(signum)
        if len(self.received) == 1:
            self.on_stop(signum)
        elif signum == signal.SIGINT and self.exit_at_once:
            end_now(128 + signal.SIGINT, self._lost_sentence())
        elif signum == signal.SIGTERM:
            log.warning("SIGTERM again: the checkpoint is being saved; stopping once it is")

    def _lost_sentence(self) -> str:
        return f"a second SIGINT (Ctrl-C) ended it at once, without saving: {self.lost()}"


def end_now(code: int, sentence: str) -> None:
    """Ends a command's process at once with ``code``, after one line (``stopped: <sentence>``) on stderr."""
    print(f"stopped: {sentence}", file=sys.stderr, flush=True)
    os._exit(code)


def name(signum: int) -> str:
    """SIGINT (Ctrl-C) or SIGTERM, as the log and the exceptions say it."""
    return "SIGINT (Ctrl-C)" if signum == signal.SIGINT else signal.Signals(signum).name
