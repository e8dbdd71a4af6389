"""A command's process ends once its outputs are written, however long a tracked teardown thread would take; its
atexit handlers run, its output is flushed, its exit status kept, and threads of its own are still waited for.

The teardown here is a plain thread that sleeps (what tfgpu tracks is a ``feed.Feed`` release thread stuck in
TensorFlow; ``tests/training/test_loop.py`` checks that Feed tracks it). Subprocesses: the process's end is what is
tested. They import neither TensorFlow nor Keras, so each takes a second or two.
"""
import subprocess
import sys
import threading
import time

from tests.conftest import REPO
from tfgpu.runtime import process_exit

COMMAND = """
import atexit, sys, threading, time
from tfgpu.runtime import process_exit

teardown_s, other_s, code, out = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]

def write(text):
    with open(out, "a") as f:
        f.write(text + "\\n")

teardown = threading.Thread(target=lambda: (time.sleep(teardown_s), write("teardown done")))
teardown.start()
process_exit.track(teardown)
if other_s:
    threading.Thread(target=lambda: (time.sleep(other_s), write("other thread done"))).start()
atexit.register(write, "atexit ran")
print("the outputs are written", end="")  # no newline, no flush: exit_command flushes
process_exit.GRACE_S = 0.3


def main():
    if code == 1:
        raise RuntimeError("a bug in the command")
    return code


process_exit.run_command(main)
"""


def _command(tmp_path, teardown_s, other_s=0.0, code=0):
    out = tmp_path / "events.txt"
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", COMMAND, str(teardown_s), str(other_s), str(code), str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    events = out.read_text().splitlines() if out.exists() else []
    return proc, time.monotonic() - started, events


def test_a_stuck_teardown_is_not_waited_for_and_the_exit_still_runs_atexit_and_flushes(tmp_path):
    proc, wall_s, events = _command(tmp_path, teardown_s=60, code=3)
    assert proc.returncode == 3, proc.stderr
    assert wall_s < 20  # not the teardown's 60 s
    assert events == ["atexit ran"]
    assert proc.stdout == "the outputs are written"
    assert "not waiting for 1 input pipeline(s) still stopping" in proc.stderr


def test_a_preempted_run_s_exit_143_does_not_wait_either(tmp_path):
    """python -m tfgpu.train's main returns 143 once the checkpoint of a SIGTERM is saved (failures.Preempted)."""
    proc, wall_s, events = _command(tmp_path, teardown_s=60, code=143)
    assert proc.returncode == 143, proc.stderr
    assert wall_s < 20 and events == ["atexit ran"]


def test_a_crash_is_printed_as_the_interpreter_would_and_exits_1_without_waiting(tmp_path):
    proc, wall_s, events = _command(tmp_path, teardown_s=60, code=1)
    assert proc.returncode == 1
    assert "Traceback (most recent call last)" in proc.stderr and "RuntimeError: a bug in the command" in proc.stderr
    assert wall_s < 20 and events == ["atexit ran"]


def test_a_teardown_that_ends_within_the_grace_ends_the_process_normally(tmp_path):
    proc, wall_s, events = _command(tmp_path, teardown_s=0.1)
    assert proc.returncode == 0, proc.stderr
    assert events == ["teardown done", "atexit ran"]
    assert proc.stdout == "the outputs are written" and "not waiting" not in proc.stderr


def test_another_thread_of_the_process_is_waited_for_as_the_interpreter_would(tmp_path):
    """A thread tfgpu did not start (a user's) holds the interpreter open: its work is not cut short, and the
    teardown is then waited for too."""
    proc, wall_s, events = _command(tmp_path, teardown_s=1.5, other_s=1.0, code=4)
    assert proc.returncode == 4, proc.stderr
    assert events == ["other thread done", "teardown done", "atexit ran"]
    assert "not waiting" not in proc.stderr


def test_unfinished_lists_only_running_tracked_threads_longest_first():
    stop = threading.Event()
    older = threading.Thread(target=stop.wait)
    older.start()
    process_exit.track(older)
    time.sleep(0.05)
    newer = threading.Thread(target=stop.wait)
    newer.start()
    process_exit.track(newer)
    done = threading.Thread(target=lambda: None)
    done.start()
    done.join()
    process_exit.track(done)
    try:
        running = [(thread, age) for thread, age in process_exit.unfinished(0.05) if thread in (older, newer, done)]
        assert [thread for thread, _ in running] == [older, newer]
        assert running[0][1] > running[1][1] >= 0.05  # waited for them, then gave up
    finally:
        stop.set()
    older.join()
    newer.join()
    assert not [t for t, _ in process_exit.unfinished(0) if t in (older, newer, done)]
