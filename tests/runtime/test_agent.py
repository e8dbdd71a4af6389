"""Agents of a job across hosts (``tfgpu.launch --rendezvous``), each a real ``python -m tfgpu.launch`` process
against a real etcd on localhost (``etcd_url``), with stand-in workers that record the TF_CONFIG they were given
and run until told to finish: a host killed with its agent, and a host that comes back, re-form the group."""
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = """
import json, os, sys, time
out = sys.argv[1]
path = os.path.join(out, f"worker-{os.getpid()}.json")
with open(path + ".tmp", "w") as f:  # whole or absent: the test reads the directory while workers start
    json.dump({"tf_config": json.loads(os.environ["TF_CONFIG"]), "time": time.time()}, f)
os.replace(path + ".tmp", path)
deadline = time.time() + 120
while not os.path.exists(os.path.join(out, "finish")) and time.time() < deadline:
    time.sleep(0.05)
"""


def _start_agent(etcd_url, out, name, *flags, prefix=(), host="127.0.0.1", query="", env=None):
    endpoint = "etcd://" + etcd_url.split("//", 1)[1] + "/job1" + query
    log = open(os.path.join(out, f"agent-{name}.log"), "wb")
    worker = os.path.join(out, "worker.py")
    with open(worker, "w") as f:
        f.write(WORKER)
    command = [*prefix, sys.executable, "-m", "tfgpu.launch", f"--rendezvous={endpoint}", "--num_workers=2",
               "--min_workers=1", "--max_restarts=3", f"--host={host}", "--rendezvous_ttl_s=2", "--stop_grace_s=1",
               "--join_grace_s=10", *flags, "--", sys.executable, worker, out]
    return subprocess.Popen(command, cwd=REPO, env={**os.environ, "PYTHONPATH": REPO, **(env or {})}, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)


def _groups(out):
    """The worker groups started so far, in order: each a list of (task index, cluster size)."""
    records = []
    for path in glob.glob(os.path.join(out, "worker-*.json")):
        with open(path) as f:
            records.append(json.load(f))
    records.sort(key=lambda r: r["time"])
    groups = {}
    for r in records:
        cluster = tuple(r["tf_config"]["cluster"]["worker"])
        groups.setdefault(cluster, []).append(r["tf_config"]["task"]["index"])
    return [sorted(v) for v in groups.values()]


def _clusters(out):
    """The worker addresses of each group started so far, in order."""
    records = []
    for path in glob.glob(os.path.join(out, "worker-*.json")):
        with open(path) as f:
            records.append(json.load(f))
    clusters = []
    for r in sorted(records, key=lambda r: r["time"]):
        if r["tf_config"]["cluster"]["worker"] not in clusters:
            clusters.append(r["tf_config"]["cluster"]["worker"])
    return clusters


def _wait(condition, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _log(out, name):
    with open(os.path.join(out, f"agent-{name}.log")) as f:
        return f.read()


def _cleanup(procs):
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_a_lost_host_is_left_out_and_a_host_that_comes_back_is_taken_in(etcd_url, tmp_path):
    _lose_a_host_and_take_one_back(etcd_url, str(tmp_path))


def test_the_group_heals_the_same_with_etcd_behind_tls_and_client_certificates(tls_etcd, tmp_path):
    """The agents hold the job's certificate: a and b from the environment (as a Slurm or Kubernetes template sets
    it), the host that comes back from --rendezvous's options."""
    url, certificates = tls_etcd
    env = {"TFGPU_ETCD_CACERT": certificates.ca, "TFGPU_ETCD_CERT": certificates.client[0],
           "TFGPU_ETCD_KEY": certificates.client[1]}
    query = f"?protocol=https&cacert={certificates.ca}&cert={certificates.client[0]}&key={certificates.client[1]}"
    _lose_a_host_and_take_one_back(url, str(tmp_path), first={"env": env}, back={"query": query})


def _lose_a_host_and_take_one_back(etcd_url, out, first=None, back=None):
    """Agents a and b form a group of 2; b's host dies (a goes on alone); c comes back (a group of 2 again) and
    they finish; an agent that joins the ended job id afterwards is refused in one line. ``first``, ``back``: how
    a and b, and c and the late one, reach etcd (``_start_agent``'s query and env)."""
    first, back = first or {}, back or {}
    a = _start_agent(etcd_url, out, "a", **first)
    b = _start_agent(etcd_url, out, "b", **first)
    procs = [a, b]
    try:
        _wait(lambda: _groups(out) == [[0, 1]], 30, "the first group of 2")
        os.killpg(b.pid, signal.SIGKILL)  # the host dies: its agent at once, its worker with it (PR_SET_PDEATHSIG)
        _wait(lambda: _groups(out)[1:] == [[0]], 30, "a group of 1 on the host left")
        assert "lost with host 127.0.0.1-" in _log(out, "a") and "2 -> 1 workers" in _log(out, "a")
        c = _start_agent(etcd_url, out, "c", **back)  # the host comes back (a new agent registers)
        procs.append(c)
        _wait(lambda: _groups(out)[2:] == [[0, 1]], 30, "a group of 2 again")
        open(os.path.join(out, "finish"), "w").close()
        assert a.wait(30) == 0 and c.wait(30) == 0
        assert "joined: 1 -> 2 host(s)" in _log(out, "a") + _log(out, "c")
        late = _start_agent(etcd_url, out, "late", **back)  # the same job id once more: refused in one line
        procs.append(late)
        assert late.wait(30) == 1
        assert re.search(r"this job id already ended \(finished in round \d+\); start every agent with a new "
                         r"JOB_ID", _log(out, "late"))
    finally:
        _cleanup(procs)


def test_below_min_workers_every_agent_stops_with_the_failures_line(etcd_url, tmp_path):
    out = str(tmp_path)
    a = _start_agent(etcd_url, out, "a", "--min_workers=2")
    b = _start_agent(etcd_url, out, "b", "--min_workers=2")
    try:
        _wait(lambda: _groups(out) == [[0, 1]], 30, "the first group of 2")
        os.killpg(b.pid, signal.SIGKILL)
        assert a.wait(30) == 129
        assert "cannot restart: 1 host(s) x 1 worker(s) left, fewer than --min_workers=2" in _log(out, "a")
    finally:
        _cleanup([a, b])


NETEM_PREFIX = f"tfgpu-rdt{os.getpid() % 10000}"


def _netem(*args):
    return subprocess.run([sys.executable, os.path.join(REPO, "tools", "netem_cluster.py"), *args],
                          env={**os.environ, "TFGPU_NETEM_PREFIX": NETEM_PREFIX}, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=120)


@pytest.mark.slow
def test_hosts_as_network_namespaces_go_on_without_one_that_loses_every_process(tmp_path):
    """Three "hosts" (network namespaces of tools/netem_cluster.py), etcd in the hub: every process of one host
    killed at once; the two left re-form with their own addresses and finish."""
    from tests.runtime.conftest import require_etcd, start_etcd, stop_etcd
    from tfgpu.bench.netem import HUB_ADDRESS, worker_address

    require_etcd()
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.skip("needs root and iproute2 to make network namespaces")
    out, procs, etcd = str(tmp_path), [], None
    try:
        up = _netem("up", "--workers=3", "--bandwidth=10gbit")
        assert up.returncode == 0, up.stdout
        etcd, url = start_etcd(tmp_path / "etcd", address=HUB_ADDRESS,
                               prefix=("ip", "netns", "exec", f"{NETEM_PREFIX}-hub"))
        for i in range(3):
            procs.append(_start_agent(url, out, f"h{i}", "--num_workers=3", "--min_workers=2",
                                      prefix=("ip", "netns", "exec", f"{NETEM_PREFIX}-w{i}"),
                                      host=worker_address(i)))
        _wait(lambda: _groups(out) == [[0, 1, 2]], 60, "the first group of 3")
        first = _clusters(out)[0]
        assert sorted(a.rsplit(":", 1)[0] for a in first) == [worker_address(i) for i in range(3)]
        pids = subprocess.run(["ip", "netns", "pids", f"{NETEM_PREFIX}-w1"], stdout=subprocess.PIPE,
                              text=True).stdout.split()
        for pid in pids:  # the agent and its worker, at once
            os.kill(int(pid), signal.SIGKILL)
        _wait(lambda: _groups(out)[1:] == [[0, 1]], 60, "a group of 2 on the hosts left")
        assert sorted(a.rsplit(":", 1)[0] for a in _clusters(out)[1]) == [worker_address(0), worker_address(2)]
        open(os.path.join(out, "finish"), "w").close()
        assert procs[0].wait(30) == 0 and procs[2].wait(30) == 0
    finally:
        _cleanup(procs)
        if etcd is not None:
            stop_etcd(etcd)
        down = _netem("down")
        assert down.returncode == 0, down.stdout
