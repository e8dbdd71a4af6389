"""Times one MultiWorkerMirroredStrategy all-reduce of S bytes across the workers of an emulated cluster, and checks
the ring model ``t = a·(N−1) + 2(N−1)/N · S / B_eff`` against it.

    python tools/allreduce_bench.py --workers=2,3 --bandwidth=100mbit,1gbit --sizes_mb=1,4,16 \\
        --output_json=/tmp/allreduce.json

For each (workers, bandwidth) it brings the emulated cluster up (``tools/netem_cluster.py``), runs one worker per
namespace (``--worker`` mode: CollectiveOps over gRPC, RING), which all-reduces float32 tensors of each size
``--repeats`` times after a warm-up and reports the median, then takes the cluster down. Per row it reports the
median time, the bytes each worker sends (``2(N−1)/N · S``), the effective bandwidth that implies
(``B_eff``), and B_eff / B; per (workers, bandwidth) a least-squares fit of ``t = a + bytes_sent / B_eff`` over
the sizes. All workers run on this host's cores: the wire decides only while ``bytes_sent / B`` is well above
the time the same all-reduce takes unlimited (``--bandwidth=unlimited`` measures that floor).
"""
import argparse
import itertools
import json
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from tfgpu.bench import allreduce_probe  # noqa: E402
from tfgpu.bench import netem as netem_cluster  # noqa: E402
from tfgpu.bench.allreduce_probe import fit_line  # noqa: E402


def worker(sizes_mb: list, repeats: int, out_path: str, dtype_name: str = "float32") -> None:
    """One worker: all-reduce each size ``repeats`` times (after one warm-up; the sizes take turns) and, on the
    chief, write the median seconds per size to ``out_path`` (``tfgpu.bench.allreduce_probe``'s worker, without the
    training step's one-float flag beside it)."""
    allreduce_probe.worker([int(s * 1e6) for s in sizes_mb], repeats, out_path, dtype_name, flag=False)


def measure(num_workers: int, bandwidth: str, sizes_mb: list, repeats: int, timeout_s: float,
            dtype: str = "float32") -> dict:
    netem_cluster.down()
    rate = "100gbit" if bandwidth == "unlimited" else bandwidth
    netem_cluster.up(num_workers, rate, 0.0)
    logs = tempfile.mkdtemp(prefix="allreduce-")
    out = os.path.join(logs, "result.json")
    try:
        codes = netem_cluster.run(
            [sys.executable, os.path.abspath(__file__), "--worker", f"--sizes_mb={','.join(map(str, sizes_mb))}",
             f"--repeats={repeats}", f"--out={out}", f"--dtype={dtype}"], timeout_s,
            env={"TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}, output_dir=logs)
        if any(codes) or not os.path.exists(out):
            with open(os.path.join(logs, "worker0.log")) as f:
                tail = f.read()[-2000:]
            raise RuntimeError(f"workers exited {codes} ({num_workers} workers, {bandwidth}); worker 0:\n{tail}")
        with open(out) as f:
            rows = json.load(f)
    finally:
        netem_cluster.down()
        shutil.rmtree(logs, ignore_errors=True)
    link = None if bandwidth == "unlimited" else netem_cluster.parse_rate(bandwidth) / 8
    for row in rows:
        row["bytes_sent"] = 2 * (num_workers - 1) / num_workers * row["wire_bytes"]
        row["b_eff_bytes_per_s"] = row["bytes_sent"] / row["median_s"]
        if link:
            row["b_eff_over_b"] = row["b_eff_bytes_per_s"] / link
            row["wire_s"] = row["bytes_sent"] / link
    a, b_eff = fit_line([(r["bytes_sent"], r["median_s"]) for r in rows])
    return {"workers": num_workers, "bandwidth": bandwidth, "dtype": dtype, "rows": rows, "fit_a_s": a,
            "fit_b_eff_bytes_per_s": b_eff, "fit_b_eff_over_b": (b_eff / link) if link else None}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default="", help=argparse.SUPPRESS)
    parser.add_argument("--workers", default="2,3")
    parser.add_argument("--bandwidth", default="100mbit,1gbit", help="comma separated; 'unlimited' = no shaping")
    parser.add_argument("--sizes_mb", default="1,4,16")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtypes", default="float32", help="wire dtypes of the float32 gradient, comma separated: "
                        "float32, bfloat16, float16 (as --allreduce_dtype)")
    parser.add_argument("--dtype", default="float32", help=argparse.SUPPRESS)
    parser.add_argument("--timeout_s", type=float, default=300)
    parser.add_argument("--output_json", default="")
    args = parser.parse_args(argv)
    sizes = [float(s) for s in args.sizes_mb.split(",")]
    if args.worker:
        worker(sizes, args.repeats, args.out, args.dtype)
        return 0
    try:
        netem_cluster.check_host()
    except netem_cluster.ClusterError as e:
        print(f"allreduce_bench: {e}", file=sys.stderr)
        return 1
    results = []
    for n in (int(w) for w in args.workers.split(",")):
        for bandwidth, dtype in itertools.product(args.bandwidth.split(","), args.dtypes.split(",")):
            result = measure(n, bandwidth, sizes, args.repeats, args.timeout_s, dtype)
            results.append(result)
            for row in result["rows"]:
                ratio = f"{row['b_eff_over_b']:.2f}" if "b_eff_over_b" in row else "-"
                print(f"N={n} B={bandwidth:>9} {dtype:>8} S={row['size_bytes'] / 1e6:7.1f} MB  "
                      f"t={row['median_s']:.3f} s (min {row['min_s']:.3f}, max {row['max_s']:.3f})  "
                      f"B_eff={row['b_eff_bytes_per_s'] * 8 / 1e6:8.1f} Mbit/s  B_eff/B={ratio}", flush=True)
            fit = result["fit_b_eff_over_b"]
            print(f"N={n} B={bandwidth:>9} {dtype:>8} fit: a={result['fit_a_s'] * 1e3:.1f} ms, B_eff="
                  f"{result['fit_b_eff_bytes_per_s'] * 8 / 1e6:.1f} Mbit/s" + (f" ({fit:.2f} of B)" if fit else ""),
                  flush=True)
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump({"host_cpus": os.cpu_count(), "results": results}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
