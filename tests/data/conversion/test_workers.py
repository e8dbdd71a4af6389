"""Shard-writing workers end with the converter, even when it is SIGKILLed (no orphan goes on writing)."""
import glob
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.conftest import REPO


def _wait_gone(pids, timeout):
    import psutil

    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    return alive


def test_a_worker_exits_when_its_parent_is_killed(tmp_path):
    """A parent (no TensorFlow: fast) starts a child that calls exit_with_parent and sleeps; SIGKILL the parent."""
    script = textwrap.dedent("""
        import multiprocessing, os, sys, time
        from tfgpu.data.conversion import workers

        def child(parent):
            workers.exit_with_parent(parent, interval=0.05)
            time.sleep(120)

        if __name__ == "__main__":
            p = multiprocessing.get_context("spawn").Process(target=child, args=(os.getpid(),))
            p.start()
            print(p.pid, flush=True)
            time.sleep(120)
    """)
    (tmp_path / "parent.py").write_text(script)
    parent = subprocess.Popen([sys.executable, str(tmp_path / "parent.py")], cwd=REPO, stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "PYTHONPATH": REPO}, start_new_session=True)
    child = None
    try:
        child = int(parent.stdout.readline())
        time.sleep(0.5)  # the child is up and watching
        parent.kill()
        parent.wait(timeout=30)
        assert not _wait_gone([child], timeout=10), "the child outlived its SIGKILLed parent"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(timeout=30)
        if child is not None:
            for alive in _wait_gone([child], timeout=0):
                alive.kill()


@pytest.mark.slow
def test_converter_workers_die_with_a_sigkilled_converter(tmp_path):
    import psutil

    out = tmp_path / "out"
    args = [sys.executable, "-m", "tfgpu.convert", "--source=digits", f"--output_dir={out}", "--num_shards=150",
            "--workers=2"]
    proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    children = []
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            if glob.glob(str(out / ".tfgpu-convert" / "*.tfrecord.json")):
                break
            time.sleep(0.01)
        children = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
        assert len(children) >= 2, "no worker processes found"
        proc.kill()  # the converter only, not its process group
        proc.wait(timeout=30)
        assert not _wait_gone(children, timeout=20), "workers outlived their SIGKILLed converter"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        for alive in _wait_gone(children, timeout=0):
            alive.kill()
