"""A real etcd for the rendezvous tests: Debian's etcd-server on free localhost ports, started per test (about a
second) and killed after. Without the ``etcd`` binary the tests skip with the reason, except under CI (the
variable CI set), where they fail: .ci/run installs etcd-server, so a missing binary there is a broken setup."""
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

import pytest


def free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_etcd(data_dir, address="127.0.0.1", prefix=()):
    """Starts etcd serving clients on ``address``:<free port> (``prefix``: a command to run it under, e.g. ``ip
    netns exec NS``); returns (process, client URL) once it answers."""
    client, peer = free_port(), free_port()
    url = f"http://{address}:{client}"
    command = [*prefix, "etcd", "--name", "t", "--data-dir", str(data_dir), "--listen-client-urls", url,
               "--advertise-client-urls", url, "--listen-peer-urls", f"http://127.0.0.1:{peer}",
               "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
               "--initial-cluster", f"t=http://127.0.0.1:{peer}"]
    log = open(os.path.join(str(data_dir) + ".log"), "wb")
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    probe = f"import urllib.request; urllib.request.urlopen({url + '/health'!r}, timeout=1).read()"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if prefix:  # served inside a namespace: ask from there
            if subprocess.run([*prefix, sys.executable, "-c", probe], stderr=subprocess.DEVNULL).returncode == 0:
                return proc, url
        else:
            try:
                urllib.request.urlopen(url + "/health", timeout=1).read()
                return proc, url
            except OSError:
                pass
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    stop_etcd(proc)
    raise RuntimeError(f"etcd did not start: {open(str(data_dir) + '.log').read()[-1000:]}")


def stop_etcd(proc):
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def require_etcd():
    if shutil.which("etcd"):
        return
    reason = "the etcd binary is not installed (apt-get install -y etcd-server)"
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; CI is set, where .ci/run installs it")
    pytest.skip(reason)


@pytest.fixture
def etcd_url(tmp_path):
    """The client URL of a fresh etcd on localhost, killed after the test."""
    require_etcd()
    proc, url = start_etcd(tmp_path / "etcd")
    try:
        yield url
    finally:
        stop_etcd(proc)
