"""How a run would scale past one machine: measured single-replica step and host costs, predicted N-worker steps.

    python -m tfgpu.plan --flagfile=configs/quickstart.flags --num_workers=2,4,8 \\
        --bandwidth=100mbit,1gbit,10gbit --latency_ms=0.5 --output_json=plan.json [--validate]

It trains the flags' run for ``--measure_steps`` steps on one replica in a child process (or reads a finished
run's ``--from_model_dir``), takes its step time (median over the loops after the first) and its trainable
parameters (the float32 gradient bytes), probes what an all-reduce of those gradients costs this host with no
link limit (``tfgpu.bench.allreduce_probe``: two local workers, a few seconds, in this run, so the host's load
now is in it), and prints, per (workers, bandwidth), the step time with its three terms (compute, the hosts'
all-reduce, the wire) and which dominates, examples/s and scaling efficiency (``tfgpu.bench.scaling``'s model),
with the remedy that helps most. The per-replica batch stays the run's ``--global_batch_size`` on N workers
(weak scaling). ``--validate`` also runs each row of up to ``--validate_max_workers`` workers on the emulated
cluster network (``tfgpu.bench.netem``: root, network namespaces) and prints every row's prediction for this
host, measured step and error; it exits 1 when a row is off by more than ``--tolerance``, naming the term that
missed. There the N workers share one host's cores, so the compute term is measured in the same run: the same
N workers over localhost with no link limit, less the probe's all-reduce for N workers.
"""
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tfgpu import cli  # noqa: E402
from tfgpu.bench import scaling  # noqa: E402
from tfgpu.config import ConfigError  # noqa: E402
from tfgpu.training import failures  # noqa: E402

USAGE = ("python -m tfgpu.plan --flagfile=F [train flags] --num_workers=2,4,8 --bandwidth=100mbit,1gbit "
         "[--latency_ms=0.5] [--output_json=F] [--validate]")
# The child runs train only: no evaluation, checkpoint, summaries or report in the measurement.
MEASURE_FLAGS = ["--eval_split=none", "--checkpoint_every_steps=0", "--tensorboard=false", "--verbose=0",
                 "--distribution_strategy=one_device", "--cpu_logical_devices=0"]


def parser() -> cli.ArgumentParser:
    p = cli.ArgumentParser(prog="python -m tfgpu.plan", usage=USAGE, description=__doc__.split("\n\n")[0])
    p.add_argument("--num_workers", default="2,4,8", help="Worker counts to predict, comma separated.")
    p.add_argument("--bandwidth", default="1gbit,10gbit", help="Link bandwidths, comma separated (100mbit, 1gbit).")
    p.add_argument("--latency_ms", type=float, default=0.0, help="One-way latency between two workers.")
    p.add_argument("--link_efficiency", type=float, default=scaling.LINK_EFFICIENCY,
                   help="Share of the bandwidth a ring all-reduce gets (measured on the emulated cluster).")
    p.add_argument("--measure_steps", type=int, default=60, help="Steps the single-replica measurement trains.")
    p.add_argument("--from_model_dir", default="", help="Take the single-replica step from this finished run "
                   "(its history.jsonl and metrics.json) instead of measuring.")
    p.add_argument("--validate", action="store_true", help="Also run rows on the emulated cluster network.")
    p.add_argument("--validate_max_workers", type=int, default=3)
    p.add_argument("--validate_steps", type=int, default=0, help="Steps of each validation run; 0 = "
                   "--measure_steps.")
    p.add_argument("--probe_repeats", type=int, default=9, help="Repeats of each size of the all-reduce probe "
                   "(the host's own cost of the collective, measured in this run); 0 = no probe (a fixed 2 ms).")
    p.add_argument("--tolerance", type=float, default=0.2, help="--validate exits 1 when a row's prediction is off "
                   "by more than this share of the measured step.")
    p.add_argument("--output_json", default="")
    p.add_config_flags(exclude=("model_dir",))
    return p


def _split(flag: str, text: str, parse) -> list:
    try:
        values = [parse(v) for v in text.split(",") if v.strip()]
    except ValueError as e:
        raise ConfigError(flag, str(e)) from None
    if not values:
        raise ConfigError(flag, "needs at least one value")
    return values


def read_run(model_dir: str, skip_loops: int = 1) -> dict:
    """Step time (median of the train loops after the first ``skip_loops``), per-replica batch and trainable
    parameters of a finished run in ``model_dir``."""
    from tfgpu.training import results

    result = results.read(model_dir, flag="from_model_dir")
    try:
        if result is None:
            raise FileNotFoundError(f"no {results.FILE}")
        with open(os.path.join(model_dir, "history.jsonl")) as f:
            loops = [r for r in map(json.loads, f) if r.get("kind") == "train" and "step_time_ms" in r]
        with open(os.path.join(model_dir, "config.yaml")) as f:
            import yaml

            config = yaml.safe_load(f)
    except (OSError, ValueError) as e:
        raise ConfigError("from_model_dir", f"{model_dir} is not a finished tfgpu run: {e}") from None
    timed = loops[skip_loops:] or loops
    trainable = result.parameters.trainable if result.parameters else None
    if not timed or trainable is None:
        raise ConfigError("from_model_dir", f"{model_dir} has no timed train loop or parameter count")
    return {"step_s": statistics.median(r["step_time_ms"] for r in timed) / 1000,
            "global_batch_size": int(config["global_batch_size"]),
            "trainable": trainable,
            "allreduce_dtype": config.get("allreduce_dtype", "float32"), "loops": len(timed)}


def _train_command(argv_flags: list, model_dir: str, steps: int, global_batch: int, loop: int) -> list:
    return [sys.executable, "-m", "tfgpu.train", *argv_flags, f"--model_dir={model_dir}", f"--train_steps={steps}",
            f"--global_batch_size={global_batch}", f"--steps_per_loop={loop}"]


def measure_one(argv_flags: list, config, steps: int, workdir: str) -> dict:
    """Trains ``steps`` steps on one replica in a child process and reads the run back."""
    model_dir = os.path.join(workdir, "one-replica")
    loop = max(1, min(config.steps_per_loop, steps // 4))
    proc = subprocess.run(_train_command(argv_flags + MEASURE_FLAGS, model_dir, steps, config.global_batch_size,
                                         loop), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode:
        raise RuntimeError(f"the single-replica measurement failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}")
    return read_run(model_dir)


def measure_local(argv_flags: list, config, num_workers: int, steps: int, workdir: str) -> float:
    """The step of ``num_workers`` MultiWorkerMirroredStrategy workers of the flags' run on this host, over localhost
    with no link limit (``tfgpu.launch``): their compute at once on shared cores, in lockstep, plus their
    all-reduce's host cost. The compute side of a validation row on one host is this less the probe's all-reduce."""
    model_dir = os.path.join(workdir, f"local-{num_workers}")
    loop = max(1, min(config.steps_per_loop, steps // 4))
    flags = [f for f in argv_flags if not f.startswith(("--distribution_strategy", "--cpu_logical_devices"))]
    command = [sys.executable, "-m", "tfgpu.launch", f"--num_workers={num_workers}", "--worker_timeout_s=900", "--",
               *_train_command(flags + MEASURE_FLAGS[:4], model_dir, steps, config.global_batch_size * num_workers,
                               loop)[3:]]
    proc = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode:
        raise RuntimeError(f"the {num_workers}-worker run over localhost failed (exit {proc.returncode}):\n"
                           f"{proc.stdout[-3000:]}")
    return read_run(model_dir)["step_s"]


def validate_row(argv_flags: list, config, num_workers: int, bandwidth: str, latency_ms: float, steps: int,
                 workdir: str) -> float:
    """Measured step time of ``num_workers`` workers on the emulated cluster (per-replica batch kept)."""
    from tfgpu.bench import netem

    netem.down()
    netem.up(num_workers, bandwidth, latency_ms)
    model_dir = os.path.join(workdir, f"{num_workers}w-{bandwidth}")
    loop = max(1, min(config.steps_per_loop, steps // 4))
    flags = [f for f in argv_flags if not f.startswith(("--distribution_strategy", "--cpu_logical_devices"))]
    try:
        codes = netem.run(_train_command(flags + MEASURE_FLAGS[:4], model_dir, steps,
                                         config.global_batch_size * num_workers, loop),
                          timeout_s=1800, output_dir=workdir)
    finally:
        netem.down()
    if any(codes):
        with open(os.path.join(workdir, "worker0.log")) as f:
            raise RuntimeError(f"the {num_workers}-worker run at {bandwidth} failed ({codes}):\n{f.read()[-3000:]}")
    return read_run(model_dir)["step_s"]


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def _terms_text(terms: dict) -> str:
    return ", ".join(f"{name} {_ms(value)}" for name, value in terms.items())


def validate(flags: list, config, opts, measured: scaling.Measured, rows: list, workdir: str) -> list:
    """Runs every row of 2..--validate_max_workers workers on the emulated cluster and, per worker count, the same
    workers over localhost with no link limit and the all-reduce probe, all in this run; adds to each row the
    prediction for this host (its three terms), the measured step and the error. Returns the rows validated."""
    from tfgpu.bench import allreduce_probe

    steps = opts.validate_steps or opts.measure_steps
    here, checked = {}, []
    for row in rows:
        n = row["workers"]
        if not 1 < n <= opts.validate_max_workers:
            continue
        if n not in here:
            probe = allreduce_probe.measure(n, measured.wire_bytes, repeats=opts.probe_repeats)
            local = measure_local(flags, config, n, steps, workdir)
            host = min(probe.seconds(scaling.bytes_sent(n, measured.wire_bytes)), local)
            here[n] = {"local_step_s": local, "host_allreduce_s": host, "compute_s": local - host,
                       "probe": dataclasses.asdict(probe)}
            print(f"{n} workers on this host over localhost, no link limit: {_ms(local)}/step, of which the "
                  f"all-reduce probe's host cost {_ms(host)} (fixed {_ms(probe.fixed_s)} + "
                  f"{probe.per_byte_s * 1e9:.2f} ns/byte sent) and compute {_ms(local - host)}", flush=True)
        bandwidth = scaling.parse_bandwidth(row["bandwidth"])
        predicted = scaling.step_terms(here[n]["compute_s"], here[n]["host_allreduce_s"], scaling.wire_s(
            n, measured.wire_bytes, bandwidth, opts.latency_ms / 1000, opts.link_efficiency))
        row["this_host"] = {**here[n], **predicted}
        row["predicted_step_s_this_host"] = predicted["predicted_step_s"]
        row["measured_step_s"] = validate_row(flags, config, n, row["bandwidth"], opts.latency_ms, steps, workdir)
        row["error"] = row["predicted_step_s_this_host"] / row["measured_step_s"] - 1
        checked.append(row)
    for n in sorted({r["workers"] for r in checked}):
        same = [{**r["this_host"], "measured_step_s": r["measured_step_s"]} for r in checked if r["workers"] == n]
        term = scaling.missed_term(same)
        for row in checked:
            if row["workers"] == n:
                row["missed_term"] = term
    return checked


def print_validation(rows: list, tolerance: float) -> int:
    """The validation table (every row: predicted, measured, error, the prediction's terms); 1 when a row is off
    by more than ``tolerance``, naming the term that missed, else 0."""
    print(f"\nvalidation on this host (N workers share its cores; within {tolerance:.0%} passes):")
    print("| workers | link | compute | host all-reduce | wire | predicted step | measured step | error |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    failed = []
    for row in rows:
        h = row["this_host"]
        t = h["terms_s"]
        print(f"| {row['workers']} | {row['bandwidth']} | {_ms(t['compute'])} | {_ms(t['host all-reduce'])} | "
              f"{_ms(t['wire'])} | {_ms(h['predicted_step_s'])} | {_ms(row['measured_step_s'])} | "
              f"{row['error']:+.0%} |")
        if abs(row["error"]) > tolerance:
            failed.append(row)
    for row in failed:
        direction = "fast" if row["error"] < 0 else "slow"
        print(f"error: {row['workers']} workers at {row['bandwidth']}: predicted {row['error']:+.0%} off (too "
              f"{direction}); the term that missed: {row['missed_term']} "
              f"({_ms(row['this_host']['terms_s'][row['missed_term']])} predicted, "
              f"{_ms(row['measured_step_s'] - row['predicted_step_s_this_host'])} unexplained)", file=sys.stderr)
    return 1 if failed else 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = parser()
    if cli.wants_help(argv):
        print(p.format_help())
        return 0
    try:
        opts = p.parse_args(argv)
        workers = _split("num_workers", opts.num_workers, int)
        if any(n < 1 for n in workers):
            raise ConfigError("num_workers", f"must be positive, got {opts.num_workers}")
        bandwidths = _split("bandwidth", opts.bandwidth, lambda b: (b.strip(), scaling.parse_bandwidth(b)))
        if opts.latency_ms < 0:
            raise ConfigError("latency_ms", f"must be >= 0, got {opts.latency_ms}")
        if not 0 < opts.link_efficiency <= 1:
            raise ConfigError("link_efficiency", f"must be in (0, 1], got {opts.link_efficiency}")
        if opts.probe_repeats < 0:
            raise ConfigError("probe_repeats", f"must be >= 0, got {opts.probe_repeats}")
        if opts.validate and opts.probe_repeats == 0:
            raise ConfigError("probe_repeats", "--validate needs the host probe (a positive --probe_repeats)")
        config = cli.resolve(opts, "", model_dir="plan")
    except ConfigError as e:
        return failures.report(e)
    flags = [a for a in cli.expand_flagfiles(argv) if a.split("=")[0].lstrip("-") in opts.config_flags]
    code = 0
    with tempfile.TemporaryDirectory(prefix="tfgpu-plan-") as workdir:
        if opts.from_model_dir:
            one = read_run(opts.from_model_dir)
        else:
            one = measure_one(flags, config, opts.measure_steps, workdir)
        measured = scaling.Measured(one["step_s"], one["global_batch_size"], one["trainable"],
                                    config.allreduce_dtype)
        print(f"one replica: {measured.step_s * 1000:.1f} ms/step at batch {measured.per_replica_batch}, "
              f"{measured.trainable_parameters:,} trainable parameters: {measured.wire_bytes / 1e6:.1f} MB of "
              f"{config.allreduce_dtype} gradients per all-reduce")
        host, probe = scaling.HostCost(), None
        if opts.probe_repeats and any(n > 1 for n in workers):
            from tfgpu.bench import allreduce_probe

            probe = allreduce_probe.measure(2, measured.wire_bytes, repeats=opts.probe_repeats)
            host = probe.cost
            print(f"all-reduce host cost (2 workers here, no link limit): {_ms(probe.fixed_s)} fixed + "
                  f"{probe.per_byte_s * 1e9:.2f} ns/byte sent: "
                  f"{_ms(probe.seconds(scaling.bytes_sent(2, measured.wire_bytes)))} for these gradients")
        rows = []
        latency = opts.latency_ms / 1000
        for n in workers:
            for name, bandwidth in bandwidths:
                row = {"workers": n, "bandwidth": name, "latency_ms": opts.latency_ms,
                       **scaling.predict(measured, n, bandwidth, latency, opts.link_efficiency, host),
                       "remedies": scaling.remedies(measured, n, bandwidth, latency, opts.link_efficiency, host)}
                rows.append(row)
                best = next(r for r in row["remedies"] if r["keeps_recipe"])
                print(f"{n:3d} workers {name:>8}: {row['predicted_step_s'] * 1000:8.1f} ms/step "
                      f"({_terms_text(row['terms_s'])}: {row['dominant']} dominates), "
                      f"{row['predicted_examples_per_sec']:9.1f} examples/s, efficiency {row['efficiency']:.0%}; "
                      f"with {best['remedy']}: {best['efficiency']:.0%}", flush=True)
        if opts.validate:
            checked = validate(flags, config, opts, measured, rows, workdir)
            code = print_validation(checked, opts.tolerance)
    if opts.output_json:
        tmp = opts.output_json + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"one_replica": one, "link_efficiency": opts.link_efficiency,
                       "host_probe": dataclasses.asdict(probe) if probe else None, "rows": rows}, f, indent=2)
        os.replace(tmp, opts.output_json)
    return code


if __name__ == "__main__":
    sys.exit(main())
