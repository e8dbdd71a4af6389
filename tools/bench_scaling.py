"""Multi-worker scaling on one host, measured in one run: 1 worker vs N workers, one core each.

    python tools/bench_scaling.py [--workers=2] [--model=resnet20] [--per_worker_batch=64] [--steps=60]

Each case trains on synthetic data through ``tfgpu.launch --cpu_cores_per_worker=1`` with the same
per-worker batch, so the global batch grows with the workers (weak scaling). Prints examples/sec of
each case and the ratio N-worker / 1-worker with its efficiency (ratio / N). A third case runs N
*independent* one-worker jobs at once, each pinned to its own core, with no communication at all:
their summed throughput is what this host can give N workers (shared caches, memory bandwidth,
virtual cores), so "N workers / N independent" isolates what distribution itself costs. The cases
run back to back in the same invocation.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)  # tfgpu from this checkout
from tfgpu.metrics import results  # noqa: E402 (after the checkout is on the path)


def _train_flags(args, global_batch: int, model_dir: str) -> list:
    return ["--dataset=synthetic", f"--image_size={args.image_size}", "--num_classes=10", f"--model={args.model}",
            f"--global_batch_size={global_batch}", f"--train_steps={args.steps}",
            f"--steps_per_loop={args.steps_per_loop}", f"--precision={args.precision}", "--eval_split=none",
            "--checkpoint_every_steps=0", "--tensorboard=false", "--verbose=0", f"--model_dir={model_dir}"]


def _rate(model_dir: str) -> float:
    """examples/sec of a finished run: median over its loops after the first (tfgpu's results, metrics.json)."""
    result = results.read(model_dir)
    if result is None or result.examples_per_sec is None:
        sys.exit(f"{model_dir} has no examples/sec in its results (metrics.json)")
    return result.examples_per_sec


def run_case(num_workers: int, args) -> float:
    """examples/sec of one ``tfgpu.launch`` job with ``num_workers`` workers, one core each."""
    with tempfile.TemporaryDirectory(prefix=f"tfgpu-scaling-{num_workers}w-") as model_dir:
        command = [sys.executable, "-m", "tfgpu.launch", f"--num_workers={num_workers}", "--cpu_cores_per_worker=1",
                   "--", *_train_flags(args, args.per_worker_batch * num_workers, model_dir)]
        proc = subprocess.run(command, cwd=REPO, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if proc.returncode:
            sys.exit(f"case with {num_workers} worker(s) failed ({proc.returncode}):\n{proc.stdout[-3000:]}")
        return _rate(model_dir)


def run_independent(num_jobs: int, args) -> float:
    """Summed examples/sec of ``num_jobs`` single-worker jobs running at once, job i pinned to core i."""
    cores = sorted(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory(prefix="tfgpu-scaling-independent-") as root:
        procs = []
        for i in range(num_jobs):
            model_dir = os.path.join(root, str(i))
            procs.append((model_dir, subprocess.Popen(
                [sys.executable, "-m", "tfgpu.train", *_train_flags(args, args.per_worker_batch, model_dir)],
                cwd=REPO, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                preexec_fn=lambda core=cores[i]: os.sched_setaffinity(0, {core}))))
        total = 0.0
        for model_dir, proc in procs:
            output = proc.communicate()[0]
            if proc.returncode:
                sys.exit(f"independent job failed ({proc.returncode}):\n{output[-3000:]}")
            total += _rate(model_dir)
        return total


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--model", default="resnet20")
    parser.add_argument("--image_size", type=int, default=32)
    parser.add_argument("--per_worker_batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--steps_per_loop", type=int, default=10)
    parser.add_argument("--precision", default="float32")
    parser.add_argument("--output_json", default="")
    args = parser.parse_args(argv)
    if len(os.sched_getaffinity(0)) < args.workers:
        sys.exit(f"--workers={args.workers} needs {args.workers} cores; this process may use "
                 f"{len(os.sched_getaffinity(0))}")
    one = run_case(1, args)
    many = run_case(args.workers, args)
    independent = run_independent(args.workers, args)
    ratio = many / one
    result = {"model": args.model, "per_worker_batch": args.per_worker_batch, "precision": args.precision,
              "examples_per_sec": {"1_worker": one, f"{args.workers}_workers": many,
                                   f"{args.workers}_independent": independent},
              "ratio": ratio, "efficiency": ratio / args.workers, "host_ceiling_ratio": independent / one,
              "distribution_efficiency": many / independent}
    print(f"{args.model} per-worker batch {args.per_worker_batch} {args.precision}, one core per worker")
    print(f"  1 worker             : {one:9.1f} examples/sec")
    print(f"  {args.workers} workers            : {many:9.1f} examples/sec")
    print(f"  {args.workers} independent 1-worker jobs: {independent:9.1f} examples/sec (what the host allows)")
    print(f"  ratio {ratio:.2f} (scaling efficiency {ratio / args.workers:.0%}); host ceiling "
          f"{independent / one:.2f}; {args.workers} workers reach {many / independent:.0%} of the ceiling")
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
