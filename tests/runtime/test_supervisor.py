"""tfgpu.runtime.supervisor: what the launcher reads of a worker, in-process (the whole launcher runs as a command in
tests/test_launch.py): progress is a changed heartbeat, and a worker stopped by SIGSTOP is seen as stopped."""
import signal
import subprocess
import sys
import time

from tfgpu.runtime import heartbeat, supervisor


def _worker(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], stdout=subprocess.PIPE,
                            start_new_session=True)
    return supervisor.Worker(0, 0, proc, lambda data: None, str(tmp_path / "beat.json"))


def test_progress_is_a_new_heartbeat_record_not_the_process_being_alive(tmp_path):
    worker = _worker(tmp_path)
    try:
        started = worker.progress_at
        worker.read_heartbeat(started + 5)  # no heartbeat yet: still "starting", no progress
        assert (worker.phase, worker.progress_at) == ("starting", started)
        environ = {heartbeat.ENV: worker.heartbeat_path}
        heartbeat.beat("training", 10, "/runs/r", environ=environ)
        worker.read_heartbeat(started + 6)
        assert (worker.phase, worker.beat["step"], worker.progress_at) == ("training", 10, started + 6)
        worker.read_heartbeat(started + 9)  # the same record again: no progress since
        assert worker.progress_at == started + 6
        heartbeat.beat("training", 20, "/runs/r", environ=environ)
        worker.read_heartbeat(started + 10)
        assert (worker.beat["step"], worker.progress_at) == (20, started + 10)
    finally:
        worker.proc.kill()
        worker.proc.wait()


def test_a_worker_stopped_by_sigstop_is_seen_as_stopped(tmp_path):
    worker = _worker(tmp_path)
    try:
        assert not worker.stopped()
        worker.signal(signal.SIGSTOP)
        deadline = time.monotonic() + 5
        while not worker.stopped() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert worker.stopped()
        worker.signal(signal.SIGCONT)
        deadline = time.monotonic() + 5
        while worker.stopped() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not worker.stopped()
    finally:
        worker.proc.kill()
        worker.proc.wait()
