"""What one training step's all-reduce costs the hosts themselves, apart from any wire: N local workers
(MultiWorkerMirroredStrategy, CollectiveOps over localhost gRPC, no link limit) run a step's collectives (the
one-float finiteness flag and the gradients, as ``precision.apply_if_finite`` does) for a few sizes, and a line
``t = fixed + bytes_sent · per_byte`` is fitted to the medians.

    python -m tfgpu.bench.allreduce_probe --workers=2 --sizes_bytes=4096,550000,1100000 --repeats=5

``tfgpu.plan`` runs it in its own run, each worker on the core share an emulated host gets
(``tfgpu.bench.cores``), so the host's load at that moment and the hosts' size are in the figures. The same worker
times the emulated cluster's all-reduce in ``tools/allreduce_bench.py``.
"""
import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from tfgpu.bench import scaling
from tfgpu.bench.scaling import bytes_sent


@dataclasses.dataclass(frozen=True)
class Probe:
    """A step's all-reduce among ``num_workers`` workers on this host with no link limit: the fitted line
    ``fixed_s + bytes_sent · per_byte_s`` and the (bytes_sent, seconds) rows it was fitted to. ``cost`` is the
    line per (N−1), as ``scaling.host_allreduce_s`` takes it."""
    num_workers: int
    fixed_s: float
    per_byte_s: float
    rows: tuple = ()

    def seconds(self, sent: float) -> float:
        return self.fixed_s + sent * self.per_byte_s

    @property
    def cost(self) -> scaling.HostCost:
        return scaling.HostCost(self.fixed_s / max(1, self.num_workers - 1), self.per_byte_s)


def fit_line(points):
    """Least squares ``t = a + x / B`` over (x bytes, t seconds): (a, B bytes/s)."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    mt = sum(t for _, t in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    slope = sum((x - mx) * (t - mt) for x, t in points) / sxx if sxx else float("nan")
    return mt - slope * mx, (1 / slope if slope > 0 else float("inf"))


def fit(num_workers: int, rows) -> Probe:
    """The host cost line through (bytes_sent, seconds) rows; neither term below zero (noise can tilt a line)."""
    a, b = fit_line(rows)
    per_byte = 0.0 if b == float("inf") or b != b else 1 / b
    if a < 0:  # the line through the origin instead
        per_byte = sum(x * t for x, t in rows) / max(sum(x * x for x, _ in rows), 1e-30)
        a = 0.0
    return Probe(num_workers, a, per_byte, tuple(rows))


def worker(sizes_bytes: list, repeats: int, out_path: str, dtype_name: str = "float32", flag: bool = True) -> None:
    """One worker: all-reduce each size ``repeats`` times (after one warm-up) and, on the chief, write the
    median, min and max seconds per size to ``out_path``. ``flag``: a one-float all-reduce beside it, as a
    tfgpu training step does (its finiteness check)."""
    import tensorflow as tf

    dtype = tf.as_dtype(dtype_name)
    from tfgpu.config import RuntimeConfig
    from tfgpu.runtime import cluster, distribute

    settings = RuntimeConfig.defaults(distribution_strategy="multi_worker_mirrored", all_reduce_alg="ring")
    strategy = distribute.build_strategy(settings, cluster.resolve_cluster("tf_config")).strategy
    functions = []
    for size in sizes_bytes:
        n = max(1, int(size) // 4)

        def reduce_one(n=n):
            # The float32 "gradient" is made inside the replica function (filling n floats costs little next to
            # the wire) and cast to the wire dtype and back around the all-reduce, as --allreduce_dtype does.
            ctx = tf.distribute.get_replica_context()
            grad = tf.fill([n], 1.0)
            summed = tf.cast(ctx.all_reduce("SUM", tf.cast(grad, dtype)), tf.float32)
            if flag:
                summed = summed + 0.0 * ctx.all_reduce("SUM", tf.constant(0.0))
            return summed

        @tf.function
        def all_reduce(fn=reduce_one):
            return strategy.run(fn)

        result = all_reduce()  # warm-up: traces, and the first collective sets up the ring
        expected = float(strategy.num_replicas_in_sync)
        assert float(strategy.experimental_local_results(result)[0][0].numpy()) == expected
        functions.append((n, all_reduce))
    times = [[] for _ in functions]
    for _ in range(repeats):  # the sizes take turns, so a change in the host's load reaches all of them alike
        for (n, all_reduce), spent in zip(functions, times):
            start = time.perf_counter()
            result = all_reduce()
            strategy.experimental_local_results(result)[0][-1].numpy()  # wait for the values, not only the op
            spent.append(time.perf_counter() - start)
    rows = [{"size_bytes": n * 4, "dtype": dtype_name, "wire_bytes": n * dtype.size,
             "median_s": statistics.median(spent), "mean_s": statistics.mean(spent), "min_s": min(spent),
             "max_s": max(spent), "repeats": repeats} for (n, _), spent in zip(functions, times)]
    if strategy.cluster_resolver.task_id == 0:
        tmp = out_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(rows, f)
        os.replace(tmp, out_path)


def _worker_command(sizes_bytes, repeats: int, out: str, dtype: str) -> list:
    return [sys.executable, "-m", "tfgpu.bench.allreduce_probe", "--worker",
            f"--sizes_bytes={','.join(str(int(s)) for s in sizes_bytes)}", f"--repeats={repeats}", f"--out={out}",
            f"--dtype={dtype}"]


def run_local(num_workers: int, sizes_bytes, repeats: int = 5, dtype: str = "float32",
              timeout_s: float = 180, shares=None) -> list:
    """Runs the probe's workers on this host over localhost (free ports, no root, no link limit), worker i on
    ``shares[i]`` (``tfgpu.bench.cores``; None: the caller's cores), and returns the chief's rows; RuntimeError
    with worker 0's last lines if they fail or pass ``timeout_s``."""
    from tfgpu.bench import cores

    from tfgpu.runtime.launcher import free_ports, tf_configs

    with tempfile.TemporaryDirectory(prefix="tfgpu-probe-") as tmp:
        out = os.path.join(tmp, "rows.json")
        configs = tf_configs("localhost", free_ports(num_workers))
        logs = [open(os.path.join(tmp, f"worker{i}.log"), "w+") for i in range(num_workers)]
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
        shares = shares or [None] * num_workers
        procs = [subprocess.Popen(_worker_command(sizes_bytes, repeats, out, dtype),
                                  env={**env, **cores.env(share), "TF_CONFIG": c}, preexec_fn=cores.pin(share),
                                  stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
                 for c, log, share in zip(configs, logs, shares)]
        deadline = time.monotonic() + timeout_s
        try:
            while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
                if any(p.poll() not in (None, 0) for p in procs):
                    break
                time.sleep(0.1)
        finally:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, 9)
                    p.wait()
        codes = [p.returncode for p in procs]
        if any(codes) or not os.path.exists(out):
            logs[0].seek(0)
            raise RuntimeError(f"the all-reduce probe's {num_workers} local workers exited {codes}:\n"
                               f"{logs[0].read()[-2000:]}")
        for log in logs:
            log.close()
        with open(out) as f:
            return json.load(f)


def probe_sizes(wire_bytes: float) -> list:
    """A tiny all-reduce (the fixed cost), half and all of ``wire_bytes`` (the per-byte cost)."""
    return [4096, max(8192, int(wire_bytes) // 2), max(16384, int(wire_bytes))]


def measure(num_workers: int, wire_bytes: float, repeats: int = 5, dtype: str = "float32",
            timeout_s: float = 180, shares=None) -> Probe:
    """This host's cost line for ``num_workers`` workers (worker i on ``shares[i]``, as ``run_local``), probed
    around a gradient of ``wire_bytes``."""
    rows = run_local(num_workers, probe_sizes(wire_bytes), repeats, dtype, timeout_s, shares)
    return fit(num_workers, [(bytes_sent(num_workers, r["wire_bytes"]), r["median_s"]) for r in rows])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tfgpu.bench.allreduce_probe", description=__doc__.split("\n\n")[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default="", help=argparse.SUPPRESS)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--sizes_bytes", default="4096,1000000,4000000")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--dtype", default="float32")
    args = p.parse_args(argv)
    sizes = [int(float(s)) for s in args.sizes_bytes.split(",") if s.strip()]
    if args.worker:
        worker(sizes, args.repeats, args.out, args.dtype)
        return 0
    if args.workers < 2:
        print("error: --workers: at least 2", file=sys.stderr)
        return 1
    rows = run_local(args.workers, sizes, args.repeats, args.dtype)
    cost = fit(args.workers, [(bytes_sent(args.workers, r["wire_bytes"]), r["median_s"]) for r in rows])
    for r in rows:
        print(f"N={args.workers} S={r['wire_bytes'] / 1e6:8.3f} MB  t={r['median_s'] * 1e3:7.1f} ms "
              f"(min {r['min_s'] * 1e3:.1f}, max {r['max_s'] * 1e3:.1f})")
    print(f"fit: fixed {cost.fixed_s * 1e3:.2f} ms + {cost.per_byte_s * 1e9:.2f} ns/byte sent "
          f"({1 / cost.per_byte_s / 1e6 * 8 if cost.per_byte_s else float('inf'):.0f} Mbit/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
