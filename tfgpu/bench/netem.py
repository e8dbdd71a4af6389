"""An emulated cluster network on one host: N worker network namespaces joined by a bridge, each link limited in
bandwidth and latency by ``tc``, so multi-worker runs cross a real (emulated) wire.

    python tools/netem_cluster.py up --workers=3 --bandwidth=1gbit --latency_ms=0.5
    python tools/netem_cluster.py run --timeout_s=600 -- python -m tfgpu.train --flagfile=... --model_dir=...
    python tools/netem_cluster.py shape --bandwidth=100mbit --latency_ms=2
    python tools/netem_cluster.py status
    python tools/netem_cluster.py down

Layout (every name starts with ``tfgpu-nc``, or ``$TFGPU_NETEM_PREFIX``, so ``down`` finds all of it and nothing
else): a hub namespace ``tfgpu-nc-hub`` holds the bridge; worker namespace ``tfgpu-nc-wI`` holds ``eth0``
(10.233.0.(I+1)/24), the worker end of a veth pair whose other end is a port of the bridge; the bridge itself
has 10.233.0.254 inside the hub, where a service every worker must reach runs (``ip netns exec tfgpu-nc-hub
etcd ...``: the rendezvous of ``tools/heal_trials.py --failure=host``), unshaped and outside any "host". Every link is shaped
in both directions, on the worker's ``eth0`` (what it sends) and on its bridge port (what it receives): a ``tbf``
at ``--bandwidth`` and, where the kernel has netem, a ``netem`` delay of half ``--latency_ms`` each way, so two
workers are ``--latency_ms`` apart. A kernel without netem (CONFIG_NET_SCH_NETEM unset, as on this project's
machines) refuses ``--latency_ms`` > 0 in one line; bandwidth limits work everywhere ``tbf`` does. The addresses
exist only inside the namespaces this tool makes; the host's own stack has no route to them and no namespace has
a default route, so nothing a run sends leaves them. Needs root (``ip netns``, ``tc``).

``run`` starts one process per worker namespace with TF_CONFIG naming the workers' addresses (worker 0 is the
chief), bounded by ``--timeout_s``; every child is killed when it returns, and its exit code is the worst
worker's. An emulated host is a host: each worker runs on its own share of the cores (``--cores_per_worker``,
by default an equal share of the cores this process may use; ``tfgpu.bench.cores``), with TensorFlow's thread
pools sized to it, so N workers on one machine do not each compute as if they had all of its cores.
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

from tfgpu.bench import cores

# Every name this tool makes starts with PREFIX; tests set TFGPU_NETEM_PREFIX to keep theirs apart from a user's.
PREFIX = os.environ.get("TFGPU_NETEM_PREFIX", "tfgpu-nc")
HUB = f"{PREFIX}-hub"
BRIDGE = "br0"
SUBNET = "10.233.0"
HUB_ADDRESS = f"{SUBNET}.254"  # the bridge's own address in the hub: a service every worker reaches (e.g. etcd)
DEFAULT_PORT = 23456
MAX_WORKERS = 8


class ClusterError(RuntimeError):
    """A one-line reason the emulated cluster could not be made, changed or used."""


def worker_ns(index: int) -> str:
    return f"{PREFIX}-w{index}"


def worker_address(index: int) -> str:
    return f"{SUBNET}.{index + 1}"


def parse_rate(text: str) -> int:
    """A link rate (``100mbit``, ``1gbit``, ``2.5gbit``, ``500kbit``: ``scaling.parse_bandwidth``'s form) in bits
    per second, at least 100kbit."""
    from tfgpu.bench.scaling import parse_bandwidth

    try:
        bits = parse_bandwidth(text) * 8
    except ValueError:
        raise ClusterError(f"--bandwidth: {text!r} is not a rate like 100mbit, 1gbit or 10gbit") from None
    if bits < 1e5:
        raise ClusterError(f"--bandwidth: {text!r} is below 100kbit")
    return int(round(bits))


def _sh(*args, check=True, ns: str = "") -> subprocess.CompletedProcess:
    command = (["ip", "netns", "exec", ns] if ns else []) + list(args)
    proc = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=30)
    if check and proc.returncode:
        raise ClusterError(f"`{' '.join(command)}` failed: {proc.stdout.strip()}")
    return proc


def namespaces() -> list:
    """This tool's namespaces that exist now."""
    proc = _sh("ip", "netns", "list", check=False)
    names = [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]
    return sorted(n for n in names if re.fullmatch(rf"{re.escape(PREFIX)}-(hub|w\d+)", n))


def workers() -> list:
    return sorted((n for n in namespaces() if n != HUB), key=lambda n: int(n.rsplit("w", 1)[1]))


def check_host() -> None:
    if os.geteuid() != 0:
        raise ClusterError("needs root (ip netns and tc change the host's network configuration)")
    for tool in ("ip", "tc"):
        if not shutil.which(tool):
            raise ClusterError(f"`{tool}` not found; install iproute2 (apt-get install -y iproute2)")


def _burst_bytes(rate_bits: int) -> int:
    # 1 ms of traffic, at least 64 KiB (one GSO segment): tbf's watchdog is an hrtimer, so a small bucket keeps the
    # rate; a larger one lets a whole message through at the veth's speed (10 ms at 1 Gbit/s is 1.25 MB: a
    # 1.1 MB gradient crossed such a "1 Gbit/s" link as if unlimited).
    return max(64 * 1024, rate_bits // 8 // 1000)


def _shape_device(ns: str, device: str, rate_bits: int, delay_ms: float) -> None:
    _sh("tc", "qdisc", "del", "dev", device, "root", ns=ns, check=False)
    tbf = ["tbf", "rate", f"{rate_bits}bit", "burst", str(_burst_bytes(rate_bits)), "latency", "1s"]
    if not delay_ms:
        _sh("tc", "qdisc", "add", "dev", device, "root", "handle", "10:", *tbf, ns=ns)
        return
    added = _sh("tc", "qdisc", "add", "dev", device, "root", "handle", "1:", "netem", "delay", f"{delay_ms}ms",
                "limit", "100000", ns=ns, check=False)
    if added.returncode:
        if "unknown" in added.stdout.lower():
            raise ClusterError("--latency_ms: this kernel has no netem qdisc (CONFIG_NET_SCH_NETEM is not set), so "
                               "latency cannot be emulated here; use --latency_ms=0 (bandwidth limits work)")
        raise ClusterError(f"tc netem on {ns}/{device} failed: {added.stdout.strip()}")
    _sh("tc", "qdisc", "add", "dev", device, "parent", "1:1", "handle", "10:", *tbf, ns=ns)


def shape(bandwidth: str, latency_ms: float) -> None:
    """Sets every link to ``bandwidth`` each way and ``latency_ms`` one way between two workers (each of the two
    hops, the sender's egress and the receiver's bridge port, carries half of it)."""
    rate = parse_rate(bandwidth)
    if latency_ms < 0:
        raise ClusterError(f"--latency_ms: must be >= 0, got {latency_ms}")
    names = workers()
    if not names:
        raise ClusterError("no emulated cluster: run `up` first")
    for name in names:
        index = int(name.rsplit("w", 1)[1])
        _shape_device(name, "eth0", rate, latency_ms / 2)
        _shape_device(HUB, f"port{index}", rate, latency_ms / 2)
    _write_state({"workers": len(names), "bandwidth": bandwidth, "bandwidth_bits": rate, "latency_ms": latency_ms})


def _state_path() -> str:
    return os.path.join("/run", f"{PREFIX}.json")


def _write_state(state: dict) -> None:
    with open(_state_path(), "w") as f:
        json.dump(state, f)


def read_state() -> dict:
    try:
        with open(_state_path()) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def up(num_workers: int, bandwidth: str, latency_ms: float) -> None:
    """Makes the hub and ``num_workers`` worker namespaces, links them and shapes every link."""
    check_host()
    if not 2 <= num_workers <= MAX_WORKERS:
        raise ClusterError(f"--workers: between 2 and {MAX_WORKERS}, got {num_workers}")
    parse_rate(bandwidth)
    if namespaces():
        raise ClusterError(f"an emulated cluster is up already ({', '.join(namespaces())}); run `down` first")
    try:
        _sh("ip", "netns", "add", HUB)
        _sh("ip", "link", "set", "lo", "up", ns=HUB)
        _sh("ip", "link", "add", BRIDGE, "type", "bridge", ns=HUB)
        _sh("ip", "addr", "add", f"{HUB_ADDRESS}/24", "dev", BRIDGE, ns=HUB)
        _sh("ip", "link", "set", BRIDGE, "up", ns=HUB)
        for index in range(num_workers):
            name = worker_ns(index)
            _sh("ip", "netns", "add", name)
            _sh("ip", "link", "set", "lo", "up", ns=name)
            # Both ends are made inside the hub and one is moved, so no interface ever exists in the host's stack.
            _sh("ip", "link", "add", f"port{index}", "type", "veth", "peer", "name", "eth0", "netns", name, ns=HUB)
            _sh("ip", "link", "set", f"port{index}", "master", BRIDGE, ns=HUB)
            _sh("ip", "link", "set", f"port{index}", "up", ns=HUB)
            _sh("ip", "addr", "add", f"{worker_address(index)}/24", "dev", "eth0", ns=name)
            _sh("ip", "link", "set", "eth0", "up", ns=name)
        shape(bandwidth, latency_ms)
    except BaseException:
        down()
        raise


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for its parent to read its status."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _kill_namespace_processes(name: str, grace_s: float = 3.0) -> int:
    pids = [int(p) for p in _sh("ip", "netns", "pids", name, check=False).stdout.split()]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while pids and time.monotonic() < deadline:
            pids = [p for p in pids if _alive(p)]
            time.sleep(0.05)
    return len(pids)


def down() -> list:
    """Stops every process inside the tool's namespaces and deletes them (their links and qdiscs go with them);
    returns what was removed."""
    removed = namespaces()
    for name in removed:
        _kill_namespace_processes(name)
    for name in removed:
        _sh("ip", "netns", "del", name, check=False)
    try:
        os.remove(_state_path())
    except FileNotFoundError:
        pass
    left = namespaces()
    if left:
        raise ClusterError(f"could not delete {', '.join(left)}")
    return removed


def status() -> dict:
    names = workers()
    links = {}
    for name in names:
        qdiscs = _sh("tc", "qdisc", "show", "dev", "eth0", ns=name, check=False).stdout.strip().splitlines()
        links[name] = {"address": worker_address(int(name.rsplit("w", 1)[1])), "qdiscs": qdiscs,
                       "processes": len(_sh("ip", "netns", "pids", name, check=False).stdout.split())}
    return {"up": bool(names), **read_state(), "namespaces": namespaces(), "links": links}


def tf_configs(num_workers: int, port: int = DEFAULT_PORT) -> list:
    """One TF_CONFIG per worker namespace: a workers-only cluster at the namespaces' addresses, worker 0 chief."""
    cluster = {"worker": [f"{worker_address(i)}:{port}" for i in range(num_workers)]}
    return [json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}}) for i in range(num_workers)]


def worker_shares(num_workers: int, cores_per_worker: int = -1, available=None) -> list:
    """Each worker's cores: ``cores_per_worker`` each (-1: an equal share of the usable cores, or no pinning when
    there are fewer cores than workers; 0: no pinning, None per worker); ClusterError when they do not fit."""
    per = cores_per_worker if cores_per_worker >= 0 else len(cores.usable(available)) // num_workers
    if per == 0:
        return [None] * num_workers
    try:
        return cores.shares(num_workers, per, available)
    except ValueError as e:
        raise ClusterError(f"--cores_per_worker: {e}") from None


def run(command: list, timeout_s: float, port: int = DEFAULT_PORT, env: dict | None = None,
        output_dir: str = "", cores_per_worker: int = -1) -> list:
    """Runs ``command`` once in every worker namespace (TF_CONFIG set; ``{worker}`` in an argument becomes the
    worker's index), each worker on its share of the cores (``worker_shares``), and returns the exit codes; past
    ``timeout_s`` every worker is killed (code -9)."""
    names = workers()
    if not names:
        raise ClusterError("no emulated cluster: run `up` first")
    configs = tf_configs(len(names), port)
    share_list = worker_shares(len(names), cores_per_worker)
    procs = []
    try:
        for index, name in enumerate(names):
            args = [a.replace("{worker}", str(index)) for a in command]
            out = open(os.path.join(output_dir, f"worker{index}.log"), "w") if output_dir else None
            procs.append(subprocess.Popen(
                ["ip", "netns", "exec", name, *args],
                env={**os.environ, **(env or {}), **cores.env(share_list[index]), "TF_CONFIG": configs[index]},
                preexec_fn=cores.pin(share_list[index]), stdout=out or None,
                stderr=subprocess.STDOUT if out else None, start_new_session=True))
        deadline = time.monotonic() + timeout_s
        codes = [None] * len(procs)
        while any(c is None for c in codes):
            if time.monotonic() > deadline:
                break
            for i, proc in enumerate(procs):
                codes[i] = proc.poll()
            if any(c not in (None, 0) for c in codes):
                time.sleep(2)  # the others get a moment to report their own failure, then go
                break
            time.sleep(0.1)
        return [proc.poll() if proc.poll() is not None else -9 for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="netem_cluster.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_up = sub.add_parser("up", help="make the namespaces, links and limits")
    p_up.add_argument("--workers", type=int, default=2)
    p_shape = sub.add_parser("shape", help="change every link's bandwidth and latency")
    for p in (p_up, p_shape):
        p.add_argument("--bandwidth", default="1gbit", help="per link and direction: 100mbit, 1gbit, 10gbit")
        p.add_argument("--latency_ms", type=float, default=0.0, help="one-way latency between two workers")
    sub.add_parser("down", help="stop every process inside and remove everything")
    sub.add_parser("status", help="what is up (JSON)")
    p_run = sub.add_parser("run", help="run a command in every worker namespace with TF_CONFIG")
    p_run.add_argument("--timeout_s", type=float, default=600)
    p_run.add_argument("--port", type=int, default=DEFAULT_PORT)
    p_run.add_argument("--output_dir", default="", help="write each worker's output to worker<I>.log here")
    p_run.add_argument("--cores_per_worker", type=int, default=-1, help="cores each worker (an emulated host) "
                       "runs on; -1 = an equal share of the usable cores, 0 = no pinning")
    p_run.add_argument("argv", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            up(args.workers, args.bandwidth, args.latency_ms)
            print(json.dumps(status()))
        elif args.command == "shape":
            check_host()
            shape(args.bandwidth, args.latency_ms)
            print(json.dumps(read_state()))
        elif args.command == "down":
            check_host()
            print(f"removed: {', '.join(down()) or 'nothing (no emulated cluster was up)'}")
        elif args.command == "status":
            print(json.dumps(status(), indent=2))
        else:
            command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
            if not command:
                raise ClusterError("run: give the command after --")
            check_host()
            codes = run(command, args.timeout_s, args.port, output_dir=args.output_dir,
                        cores_per_worker=args.cores_per_worker)
            print(f"exit codes: {codes}")
            return max((abs(c) for c in codes), default=0) and 1
    except ClusterError as e:
        print(f"netem_cluster: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
