"""How a run would scale past one machine: measured single-replica step and host costs, predicted N-worker steps
with ``--validate``, checked on the emulated cluster (``tfgpu.bench.plan_validation``).

    python -m tfgpu.plan --flagfile=configs/quickstart.flags --num_workers=2,4,8 \\
        --bandwidth=100mbit,1gbit,10gbit --latency_ms=0.5 --output_json=plan.json [--validate]

Each worker is a host of ``--cores_per_host`` cores (by default: every core this process may use; with
``--validate``, an equal share of them per worker of the largest count validated, as the emulated cluster gives
its workers: ``tfgpu.bench.cores``). On one such share it trains the flags' run for ``--measure_steps`` steps on
one replica in a child process (or reads a finished run's ``--from_model_dir``), takes its step time (median over
the loops after the first) and its trainable parameters (the gradient bytes), probes what an all-reduce of those
gradients costs two such hosts with no link limit (``tfgpu.bench.allreduce_probe``: two local workers, each on its
share, a few seconds, in this run, so the host's load now is in it), and prints, per (workers, bandwidth), the
step time with its three terms (compute, the hosts' all-reduce, the wire) and which dominates, examples/s and
scaling efficiency (``tfgpu.bench.scaling``'s model), with the remedy that helps most. The per-replica batch stays
the run's ``--global_batch_size`` on N workers (weak scaling).

``--validate`` then runs each row of up to ``--validate_max_workers`` workers (fewer when the host's cores do not
give each its share: said in one line) on the emulated cluster network (``tfgpu.bench.netem``: root, network
namespaces, each worker on its core share) and compares every row's ``predicted_step_s``, the figure printed
above and made before any validation run, with the step measured there; it exits 1 when a row is off by more
than ``--tolerance``, naming the term that missed. The same runs also time their loops with no link limit; that
figure only helps name the term, no pass or fail depends on it.
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
from tfgpu.bench import cores  # noqa: E402
from tfgpu.bench import plan_validation  # noqa: E402
from tfgpu.bench import scaling  # noqa: E402
from tfgpu.config import ConfigError  # noqa: E402
from tfgpu.runtime import failures, fileio  # noqa: E402
from tfgpu.runtime import run_dir  # noqa: E402

USAGE = ("python -m tfgpu.plan --flagfile=F [train flags] --num_workers=2,4,8 --bandwidth=100mbit,1gbit "
         "[--latency_ms=0.5] [--output_json=F] [--validate]")


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
    p.add_argument("--cores_per_host", type=int, default=0, help="Cores one worker's host has: the "
                   "single-replica measurement, each probe worker and each emulated worker run on a share this "
                   "size; 0 = every core this process may use, or with --validate an equal share per worker of "
                   "the largest count validated.")
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
    from tfgpu.metrics import results

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


def measure_one(argv_flags: list, config, steps: int, workdir: str, shares=(None,)) -> dict:
    """Trains ``steps`` steps on one replica in a child process per share of ``shares`` (one host's cores each,
    its thread pools sized to them; None: this process's cores), all at once, and reads the runs back. With more
    than one share the hosts' neighbours are busy as the emulated cluster's workers keep them (cores of one
    machine share caches, memory and, as vCPUs, often a physical core: two single-replica runs on two cores of this
    project's machines took 1.45x one alone); the step is the slowest run's, as N workers in lockstep go at the
    slowest one's pace. The runs' own steps are kept in ``runs``."""
    loop = max(1, min(config.steps_per_loop, steps // 4))
    procs = []
    for index, share in enumerate(shares):
        model_dir = os.path.join(workdir, f"one-replica-{index}")
        log = open(os.path.join(workdir, f"one-replica-{index}.log"), "w+")
        procs.append((model_dir, log, subprocess.Popen(
            plan_validation.train_command(argv_flags + plan_validation.MEASURE_FLAGS, model_dir, steps,
                                          config.global_batch_size, loop),
            env={**os.environ, **cores.env(share)}, preexec_fn=cores.pin(share), stdout=log,
            stderr=subprocess.STDOUT)))
    runs = []
    for (model_dir, log, proc), share in zip(procs, shares):
        code = proc.wait()
        log.seek(0)
        output = log.read()
        log.close()
        if code:
            raise RuntimeError(f"the single-replica measurement failed (exit {code}):\n{output[-3000:]}")
        runs.append({**read_run(model_dir), "cores": list(share) if share else None})
    slowest = max(runs, key=lambda r: r["step_s"])
    return {**slowest, "runs": [{"cores": r["cores"], "step_s": r["step_s"]} for r in runs]}


def hosts(workers: list, validate: bool, max_workers: int, cores_per_host: int, usable: int) -> dict:
    """The host every worker is, in cores, and the worker counts ``--validate`` runs: each row's count up to
    ``max_workers``, lowered to the largest count whose hosts fit in the ``usable`` cores (``note`` says so in
    one line). Without ``cores_per_host`` a host is every usable core, or with ``validate`` an equal share per
    worker of the largest count validated. ConfigError when the hosts cannot be given their cores."""
    if cores_per_host > usable:
        raise ConfigError("cores_per_host", f"{cores_per_host} cores asked; this process may use {usable}")
    wanted = sorted({min(n, max_workers) for n in workers if n > 1}) if validate else []
    if not wanted:
        return {"cores_per_host": cores_per_host or usable, "validate": [], "note": ""}
    per = cores_per_host or max(1, usable // wanted[-1])
    fit = usable // per
    if fit < 2:
        raise ConfigError("cores_per_host" if cores_per_host else "validate",
                          f"two emulated hosts of {per} core(s) need {2 * per} cores; this process may use {usable}")
    counts = sorted({min(n, fit) for n in wanted})
    note = ""
    if wanted[-1] > fit:
        note = (f"validation: {wanted[-1]} workers of {per} core(s) each do not fit in this host's {usable} "
                f"core(s); validating {fit} workers, the largest count that fits")
    return {"cores_per_host": per, "validate": counts, "note": note}


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
        if opts.cores_per_host < 0:
            raise ConfigError("cores_per_host", f"must be >= 0, got {opts.cores_per_host}")
        if opts.validate and opts.probe_repeats == 0:
            raise ConfigError("probe_repeats", "--validate needs the host probe (a positive --probe_repeats)")
        if opts.validate and opts.from_model_dir:
            raise ConfigError("from_model_dir", "--validate measures one replica on the emulated host's cores; "
                              "drop --from_model_dir")
        plan = hosts(workers, opts.validate, opts.validate_max_workers, opts.cores_per_host, len(cores.usable()))
        config = cli.resolve(opts, "", model_dir="plan")
    except ConfigError as e:
        return failures.report(e)
    flags = [a for a in cli.expand_flagfiles(argv) if a.split("=")[0].lstrip("-") in opts.config_flags]
    per = plan["cores_per_host"]
    if plan["note"]:
        print(plan["note"], flush=True)
    workers = sorted(set(workers) | set(plan["validate"]))  # a count validated in place of one that did not fit
    # The emulated hosts: as many as the largest count validated (their neighbours busy as in the validation), or
    # one host of this machine's cores; two of them, where they fit, run the probe.
    shares = cores.shares(max(plan["validate"] or [1]), per)
    pair = shares[:2] if len(shares) >= 2 else cores.shares(min(2, cores.fitting(per)), per)
    code = 0
    with tempfile.TemporaryDirectory(prefix="tfgpu-plan-") as workdir:
        if opts.from_model_dir:
            one = read_run(opts.from_model_dir)
        else:
            one = measure_one(flags, config, opts.measure_steps, workdir, shares)
        measured = scaling.Measured(one["step_s"], one["global_batch_size"], one["trainable"],
                                    config.allreduce_dtype)
        where = f"from {opts.from_model_dir}" if opts.from_model_dir else f"on a host of {per} core(s)"
        if len(one.get("runs", ())) > 1:
            where += (", one run per host at once (" + ", ".join(f"{r['step_s'] * 1000:.1f} ms on "
                      f"{cores.describe([r['cores']])}" for r in one["runs"]) + "; the slowest counts)")
        print(f"one replica {where}: "
              f"{measured.step_s * 1000:.1f} ms/step at batch {measured.per_replica_batch}, "
              f"{measured.trainable_parameters:,} trainable parameters: {measured.wire_bytes / 1e6:.1f} MB of "
              f"{config.allreduce_dtype} gradients per all-reduce")
        host, probe = scaling.HostCost(), None
        if opts.probe_repeats and any(n > 1 for n in workers):
            from tfgpu.bench import allreduce_probe

            pair = pair if len(pair) == 2 else pair * 2  # one host's cores only: the pair shares them
            probe = allreduce_probe.measure(2, measured.wire_bytes, repeats=opts.probe_repeats, shares=pair)
            host = probe.cost
            ms = plan_validation.ms
            print(f"all-reduce host cost (2 workers, {cores.describe(pair)}, no link limit): {ms(probe.fixed_s)} "
                  f"fixed + {probe.per_byte_s * 1e9:.2f} ns/byte sent: "
                  f"{ms(probe.seconds(scaling.bytes_sent(2, measured.wire_bytes)))} for these gradients"
                  f"{'' if pair[0] != pair[1] else ' (both on one host: the cores give no second one)'}")
        rows = []
        latency = opts.latency_ms / 1000
        for n in workers:
            for name, bandwidth in bandwidths:
                row = {"workers": n, "bandwidth": name, "latency_ms": opts.latency_ms, "cores_per_host": per,
                       **scaling.predict(measured, n, bandwidth, latency, opts.link_efficiency, host),
                       "remedies": scaling.remedies(measured, n, bandwidth, latency, opts.link_efficiency, host)}
                rows.append(row)
                best = next(r for r in row["remedies"] if r["keeps_recipe"])
                print(f"{n:3d} workers {name:>8}: {row['predicted_step_s'] * 1000:8.1f} ms/step "
                      f"({plan_validation.terms_text(row['terms_s'])}: {row['dominant']} dominates), "
                      f"{row['predicted_examples_per_sec']:9.1f} examples/s, efficiency {row['efficiency']:.0%}; "
                      f"with {best['remedy']}: {best['efficiency']:.0%}", flush=True)
        if opts.validate:
            checked = plan_validation.validate(flags, config, opts, measured, host, rows, plan, workdir)
            code = plan_validation.print_validation(checked, opts.tolerance, per)
    if opts.output_json:
        fileio.atomic_write_bytes(opts.output_json, json.dumps(  # a tempfile name beside it, then a rename
            {"one_replica": one, "cores_per_host": per, "link_efficiency": opts.link_efficiency,
             "host_probe": dataclasses.asdict(probe) if probe else None, "rows": rows}, indent=2).encode())
    return code


if __name__ == "__main__":
    sys.exit(main())
