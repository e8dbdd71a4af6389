"""tfgpu.bench.netem through tools/netem_cluster.py: the emulated cluster limits a real TCP transfer between two
worker namespaces to its bandwidth, runs a command per worker with TF_CONFIG, and ``down`` leaves nothing behind.

Needs root and iproute2 (as CI has); skips with the reason elsewhere. Every test uses its own name prefix
(TFGPU_NETEM_PREFIX), so a user's emulated cluster on the same host is never touched, and takes it down after.
"""
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO

TOOL = os.path.join(REPO, "tools", "netem_cluster.py")
PREFIX = f"tfgpu-nct{os.getpid() % 10000}"

SERVER = """
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((sys.argv[1], 5201)); s.listen(1)
c, _ = s.accept(); got, start = 0, None
while True:
    b = c.recv(1 << 20)
    start = start or time.perf_counter()
    if not b:
        break
    got += len(b)
print(got * 8 / (time.perf_counter() - start))
"""
CLIENT = """
import socket, sys, time
for _ in range(100):
    try:
        c = socket.create_connection((sys.argv[1], 5201)); break
    except OSError:
        time.sleep(0.05)
buf = b"x" * (1 << 20)
for _ in range(int(sys.argv[2])):
    c.sendall(buf)
c.close()
"""


def tool(*args, check=True, timeout=60):
    proc = subprocess.run([sys.executable, TOOL, *args], env={**os.environ, "TFGPU_NETEM_PREFIX": PREFIX},
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    if check and proc.returncode:
        raise AssertionError(f"netem_cluster {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}")
    return proc


def host_links():
    return sorted(line.split(":")[1].strip() for line in subprocess.run(
        ["ip", "-o", "link", "show"], stdout=subprocess.PIPE, text=True, check=True).stdout.splitlines())


def our_namespaces():
    listed = subprocess.run(["ip", "netns", "list"], stdout=subprocess.PIPE, text=True).stdout.split()
    return [n for n in listed if n.startswith(f"{PREFIX}-")]


@pytest.fixture
def cluster():
    if os.geteuid() != 0 or not (shutil.which("ip") and shutil.which("tc")):
        pytest.skip("needs root and iproute2 (ip, tc) to make network namespaces")
    probe = subprocess.run(["ip", "netns", "add", f"{PREFIX}-probe"], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    if probe.returncode:
        pytest.skip(f"this host cannot make network namespaces: {probe.stdout.strip()}")
    subprocess.run(["ip", "netns", "del", f"{PREFIX}-probe"], check=True)
    before = host_links()
    try:
        yield before
    finally:
        tool("down", check=False)


def test_a_link_carries_its_bandwidth_and_down_leaves_nothing(cluster):
    tool("up", "--workers=2", "--bandwidth=40mbit")
    status = json.loads(tool("status").stdout)
    assert status["workers"] == 2 and status["bandwidth_bits"] == 40_000_000
    assert host_links() == cluster, "an interface appeared in the host's own network stack"
    for name in (f"{PREFIX}-w0", f"{PREFIX}-w1"):
        routes = subprocess.run(["ip", "netns", "exec", name, "ip", "route"], stdout=subprocess.PIPE,
                                text=True, check=True).stdout
        assert "default" not in routes and "10.233.0.0/24 dev eth0" in routes, routes

    server = subprocess.Popen(["ip", "netns", "exec", f"{PREFIX}-w1", sys.executable, "-c", SERVER, "10.233.0.2"],
                              stdout=subprocess.PIPE, text=True)
    try:
        subprocess.run(["ip", "netns", "exec", f"{PREFIX}-w0", sys.executable, "-c", CLIENT, "10.233.0.2", "12"],
                       check=True, timeout=60)
        bits_per_s = float(server.communicate(timeout=30)[0])
    finally:
        server.kill()
    # 12 MiB at 40 Mbit/s take 2.5 s: TCP reaches 90-96% of a tbf link here; unshaped veth does >1 Gbit/s.
    assert 0.6 * 40e6 < bits_per_s < 1.1 * 40e6, bits_per_s

    sleeper = subprocess.Popen(["ip", "netns", "exec", f"{PREFIX}-w0", "sleep", "300"])
    assert "removed" in tool("down").stdout
    assert sleeper.wait(timeout=10) != 0, "a process inside a namespace outlived down"
    assert our_namespaces() == [] and host_links() == cluster
    assert not os.path.exists(f"/run/{PREFIX}.json")
    assert "nothing" in tool("down").stdout  # down twice is harmless


def test_run_gives_each_worker_its_tf_config_and_a_timeout_kills_every_worker(cluster, tmp_path):
    tool("up", "--workers=3", "--bandwidth=1gbit")
    show = "import json, os; t = json.loads(os.environ['TF_CONFIG']); print(t['task']['index'], t['cluster']['worker'])"
    tool("run", "--timeout_s=60", f"--output_dir={tmp_path}", "--", sys.executable, "-c", show)
    for index in range(3):
        line = (tmp_path / f"worker{index}.log").read_text().strip()
        assert line == f"{index} ['10.233.0.1:23456', '10.233.0.2:23456', '10.233.0.3:23456']"

    start = time.monotonic()
    proc = tool("run", "--timeout_s=2", "--", "sleep", "300", check=False)
    assert proc.returncode == 1 and "exit codes: [-9, -9, -9]" in proc.stdout
    assert time.monotonic() - start < 20
    for index in range(3):
        pids = subprocess.run(["ip", "netns", "pids", f"{PREFIX}-w{index}"], stdout=subprocess.PIPE,
                              text=True).stdout.split()
        assert pids == [], f"worker {index} left {pids} running after the timeout"


def test_bad_requests_are_one_line(cluster):
    assert "no emulated cluster" in tool("shape", "--bandwidth=1gbit", check=False).stdout
    proc = tool("up", "--workers=2", "--bandwidth=fast", check=False)
    assert proc.returncode == 1 and proc.stdout.strip() == \
        "netem_cluster: --bandwidth: 'fast' is not a rate like 100mbit, 1gbit or 10gbit"
    assert our_namespaces() == []
    tool("up", "--workers=2")
    assert "up already" in tool("up", "--workers=2", check=False).stdout
