"""Multi-worker scaling on one host, measured in one run: 1 worker vs N workers, one core each.

    python tools/bench_scaling.py [--workers=2] [--model=resnet20] [--per_worker_batch=64] [--steps=60]

Each case trains on synthetic data through ``tfgpu.launch --cpu_cores_per_worker=1`` with the same
per-worker batch, so the global batch grows with the workers (weak scaling). Prints examples/sec of
each case and the ratio N-worker / 1-worker with its efficiency (ratio / N). The two cases run back to
back in the same invocation; the machine must have at least N free cores for the ratio to mean much.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_case(num_workers: int, args) -> float:
    """examples/sec of one launch: median over its loops after the first (tfgpu's metrics.json)."""
    with tempfile.TemporaryDirectory(prefix=f"tfgpu-scaling-{num_workers}w-") as model_dir:
        command = [sys.executable, "-m", "tfgpu.launch", f"--num_workers={num_workers}", "--cpu_cores_per_worker=1",
                   "--", "--dataset=synthetic", f"--image_size={args.image_size}", "--num_classes=10",
                   f"--model={args.model}", f"--global_batch_size={args.per_worker_batch * num_workers}",
                   f"--train_steps={args.steps}", f"--steps_per_loop={args.steps_per_loop}",
                   f"--precision={args.precision}", "--eval_split=none", "--checkpoint_every_steps=0",
                   "--tensorboard=false", "--verbose=0", f"--model_dir={model_dir}"]
        proc = subprocess.run(command, cwd=REPO, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if proc.returncode:
            sys.exit(f"case with {num_workers} worker(s) failed ({proc.returncode}):\n{proc.stdout[-3000:]}")
        with open(os.path.join(model_dir, "metrics.json")) as f:
            return json.load(f)["examples_per_sec"]


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
    ratio = many / one
    result = {"model": args.model, "per_worker_batch": args.per_worker_batch, "precision": args.precision,
              "examples_per_sec": {"1_worker": one, f"{args.workers}_workers": many},
              "ratio": ratio, "efficiency": ratio / args.workers}
    print(f"{args.model} per-worker batch {args.per_worker_batch} {args.precision}, one core per worker")
    print(f"  1 worker : {one:9.1f} examples/sec")
    print(f"  {args.workers} workers: {many:9.1f} examples/sec")
    print(f"  ratio {ratio:.2f} (scaling efficiency {ratio / args.workers:.0%})")
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
