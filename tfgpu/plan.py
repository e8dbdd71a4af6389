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
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tfgpu import cli  # noqa: E402
from tfgpu.bench import scaling  # noqa: E402
from tfgpu.config import ConfigError  # noqa: E402
from tfgpu.training import failures  # noqa: E402
from tfgpu.training import run_dir  # noqa: E402

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
        with open(run_dir.history(model_dir)) as f:
            loops = [r for r in map(json.loads, f) if r.get("kind") == "train" and "step_time_ms" in r]
        with open(run_dir.config_yaml(model_dir)) as f:
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


UNLIMITED = "100gbit"  # a link no all-reduce here comes near: the host's cores, not the wire, decide
BLOCK_LOOPS = 3  # loops per stretch of one link setting; the first after a change is not timed


def _train_records(model_dir: str) -> list:
    from tfgpu.training import history

    return [r for r in history.read(model_dir) if r.get("kind") == "train" and "step_time_ms" in r]


def split_loops(records: list, changes: list, skip_loops: int = 1) -> tuple:
    """Median step (s) of the train loops run with no link limit and of those run at the limited link.
    ``changes``: (began, ended, limited) per change of the link, in order; a loop (from the previous record's time
    to its own) that overlaps a change is neither, and the first ``skip_loops`` (tracing) are left out."""
    timed = {False: [], True: []}
    for index in range(max(1, skip_loops), len(records)):
        start, end = records[index - 1]["time"], records[index]["time"]
        if any(began < end and ended > start for began, ended, _ in changes):
            continue
        limited = [lim for _, ended, lim in changes if ended <= start]
        timed[limited[-1] if limited else False].append(records[index]["step_time_ms"])
    if not timed[False] or not timed[True]:
        raise RuntimeError(f"the validation run has {len(timed[False])} timed loop(s) with no link limit and "
                           f"{len(timed[True])} at the link; raise --validate_steps")
    return statistics.median(timed[False]) / 1000, statistics.median(timed[True]) / 1000


def validate_row(argv_flags: list, config, num_workers: int, bandwidth: str, latency_ms: float, steps: int,
                 workdir: str) -> dict:
    """One run of ``num_workers`` workers on the emulated cluster (per-replica batch kept) whose link alternates,
    every ``BLOCK_LOOPS`` loops, between no limit and ``bandwidth``, for about ``steps`` steps of each. Returns the
    median step of each: the N workers' compute at once on this host's cores with their all-reduce's host cost
    (``unlimited_step_s``) and the row's measured step (``measured_step_s``), both taken in the same seconds, so
    under the same load."""
    import threading

    from tfgpu.bench import netem

    netem.down()
    netem.up(num_workers, UNLIMITED, 0.0)
    model_dir = os.path.join(workdir, f"{num_workers}w-{bandwidth}")
    loop = max(1, min(config.steps_per_loop, steps // 8))
    blocks = 2 * -(-(-(-steps // loop)) // (BLOCK_LOOPS - 1))  # each setting gets >= steps/loop timed loops
    flags = [f for f in argv_flags if not f.startswith(("--distribution_strategy", "--cpu_logical_devices"))]
    changes, done = [], threading.Event()

    def alternate():
        while not done.wait(0.05):
            if len(_train_records(model_dir)) >= 1 + (len(changes) + 1) * BLOCK_LOOPS:
                limited = len(changes) % 2 == 0
                began = time.time()
                netem.shape(bandwidth if limited else UNLIMITED, latency_ms if limited else 0.0)
                changes.append((began, time.time(), limited))

    watcher = threading.Thread(target=alternate, daemon=True)
    watcher.start()
    try:
        codes = netem.run(_train_command(flags + MEASURE_FLAGS[:4], model_dir, loop * (1 + blocks * BLOCK_LOOPS),
                                         config.global_batch_size * num_workers, loop),
                          timeout_s=1800, output_dir=workdir)
    finally:
        done.set()
        watcher.join()
        netem.down()
    if any(codes):
        with open(os.path.join(workdir, "worker0.log")) as f:
            raise RuntimeError(f"the {num_workers}-worker run at {bandwidth} failed ({codes}):\n{f.read()[-3000:]}")
    unlimited, limited = split_loops(_train_records(model_dir), changes)
    return {"unlimited_step_s": unlimited, "measured_step_s": limited}


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def _terms_text(terms: dict) -> str:
    return ", ".join(f"{name} {_ms(value)}" for name, value in terms.items())


def validate(flags: list, config, opts, measured: scaling.Measured, rows: list, workdir: str) -> list:
    """Runs every row of 2..--validate_max_workers workers on the emulated cluster (``validate_row``: first with no
    link limit, then at the row's link) and, per worker count, the all-reduce probe, all in this run; adds to each
    row the prediction for this host (compute and host all-reduce from the unlimited half, split by the probe;
    the wire from the model), the measured step, the error and the term that missed. Returns the rows validated."""
    from tfgpu.bench import allreduce_probe

    steps = opts.validate_steps or opts.measure_steps
    probes, checked = {}, []
    for row in rows:
        n = row["workers"]
        if not 1 < n <= opts.validate_max_workers:
            continue
        if n not in probes:
            probes[n] = allreduce_probe.measure(n, measured.wire_bytes, repeats=opts.probe_repeats)
        probe = probes[n]
        run = validate_row(flags, config, n, row["bandwidth"], opts.latency_ms, steps, workdir)
        local = run["unlimited_step_s"]
        host = min(probe.seconds(scaling.bytes_sent(n, measured.wire_bytes)), local)
        predicted = scaling.step_terms(local - host, host, scaling.wire_s(
            n, measured.wire_bytes, scaling.parse_bandwidth(row["bandwidth"]), opts.latency_ms / 1000,
            opts.link_efficiency), min(probe.fixed_s, host))
        row["this_host"] = {"unlimited_step_s": local, "probe": dataclasses.asdict(probe), **predicted}
        row["predicted_step_s_this_host"] = predicted["predicted_step_s"]
        row["measured_step_s"] = run["measured_step_s"]
        row["error"] = row["predicted_step_s_this_host"] / row["measured_step_s"] - 1
        print(f"{n} workers on this host at {row['bandwidth']}: {_ms(local)}/step with no link limit (the "
              f"all-reduce probe's host cost {_ms(host)}: fixed {_ms(probe.fixed_s)} + {probe.per_byte_s * 1e9:.2f} "
              f"ns/byte sent), {_ms(row['measured_step_s'])} at the link, {_ms(predicted['predicted_step_s'])} "
              f"predicted ({row['error']:+.0%})", flush=True)
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
    print("| workers | link | compute | host all-reduce | wire | of these streaming together | predicted step | "
          "measured step | error |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    failed = []
    for row in rows:
        h = row["this_host"]
        t = h["terms_s"]
        print(f"| {row['workers']} | {row['bandwidth']} | {_ms(t['compute'])} | {_ms(t['host all-reduce'])} | "
              f"{_ms(t['wire'])} | -{_ms(h.get('overlapped_s', 0.0))} | {_ms(h['predicted_step_s'])} | "
              f"{_ms(row['measured_step_s'])} | "
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
        if opts.tolerance <= 0:
            raise ConfigError("tolerance", f"must be > 0, got {opts.tolerance}")
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
