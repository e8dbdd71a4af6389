"""Ctrl-C and SIGTERM as a stop request: real signals to this process (and, for the exit of a second Ctrl-C, to a
small process of its own, without TensorFlow)."""
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from tfgpu.training import interrupts


@pytest.fixture
def stop_signals():
    """A StopSignals of a library call (a second Ctrl-C raises), recording each on_stop call and its thread."""
    calls = []
    watcher = interrupts.StopSignals(lambda signum: calls.append((signum, time.perf_counter())),
                                     lambda: "training after step 7 is not saved", exit_at_once=False)
    return watcher, calls


def test_the_first_signal_is_a_stop_request_seen_while_the_main_thread_is_in_c(stop_signals):
    """The watcher reads the signal from the wakeup pipe while the main thread is busy in C, where Python's own
    handler cannot run; a later SIGTERM does not ask again."""
    watcher, calls = stop_signals
    callers = {s: signal.getsignal(s) for s in interrupts.STOP_SIGNALS}
    wakeup_before = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(wakeup_before)
    a = np.random.default_rng(0).random((1500, 1500))
    with watcher:
        threading.Timer(0.02, os.kill, (os.getpid(), signal.SIGTERM)).start()
        a @ a  # one C call (BLAS, without the GIL) that runs no Python handler, as a TensorFlow call does
        returned = time.perf_counter()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)
    assert [signum for signum, _ in calls] == [signal.SIGTERM] and calls[0][1] < returned
    assert watcher.received == [signal.SIGTERM, signal.SIGTERM]
    assert {s: signal.getsignal(s) for s in interrupts.STOP_SIGNALS} == callers  # the caller's handlers back
    assert signal.set_wakeup_fd(wakeup_before) == wakeup_before  # and its wakeup fd


def test_a_second_ctrl_c_in_a_library_call_raises_keyboard_interrupt_saying_what_is_lost(stop_signals):
    watcher, calls = stop_signals
    with pytest.raises(KeyboardInterrupt, match="a second SIGINT .Ctrl-C. ended it at once, without saving: "
                                                "training after step 7 is not saved"):
        with watcher:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)
    assert calls[:1] and calls[0][0] == signal.SIGINT and len(calls) == 1


def test_outside_the_main_thread_nothing_is_installed():
    """Python installs handlers only in the main thread: a tfgpu.fit called from another thread trains as before."""
    errors = []

    def enter():
        try:
            with interrupts.StopSignals(lambda signum: None, lambda: "", exit_at_once=False):
                pass
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    thread = threading.Thread(target=enter)
    thread.start()
    thread.join()
    assert errors == []


COMMAND = """
import sys, time
from tfgpu.training import interrupts
with interrupts.StopSignals(lambda signum: print("stopping", signum, flush=True),
                            lambda: "training after step 40 is not saved (the last checkpoint)", exit_at_once=True):
    print("ready", flush=True)
    time.sleep(60)
print("not reached", flush=True)
"""


def test_a_second_ctrl_c_ends_a_command_at_once_with_exit_130_saying_what_is_lost():
    """A command (a process of its own) does not wait for the save: exit 130 and one line, whatever the main
    thread is doing."""
    proc = subprocess.Popen([sys.executable, "-c", COMMAND], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        assert proc.stdout.readline() == "ready\n"
        proc.send_signal(signal.SIGINT)
        assert proc.stdout.readline() == f"stopping {int(signal.SIGINT)}\n"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == 130 and "not reached" not in out
    assert err.splitlines() == ["stopped: a second SIGINT (Ctrl-C) ended it at once, without saving: training after "
                                "step 40 is not saved (the last checkpoint)"]


def test_names():
    assert interrupts.name(signal.SIGINT) == "SIGINT (Ctrl-C)" and interrupts.name(signal.SIGTERM) == "SIGTERM"
