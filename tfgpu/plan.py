"""How a run would scale past one machine: measured single-replica step and host costs, predicted N-worker steps
(over 400 lines) because the command, its validation on the emulated cluster and its report read as one story.

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
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tfgpu import cli  # noqa: E402
from tfgpu.bench import cores  # noqa: E402
from tfgpu.bench import scaling  # noqa: E402
from tfgpu.config import ConfigError  # noqa: E402
from tfgpu.runtime import failures  # noqa: E402
from tfgpu.runtime import run_dir  # noqa: E402

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


def _train_command(argv_flags: list, model_dir: str, steps: int, global_batch: int, loop: int) -> list:
    return [sys.executable, "-m", "tfgpu.train", *argv_flags, f"--model_dir={model_dir}", f"--train_steps={steps}",
            f"--global_batch_size={global_batch}", f"--steps_per_loop={loop}"]


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
            _train_command(argv_flags + MEASURE_FLAGS, model_dir, steps, config.global_batch_size, loop),
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


UNLIMITED = "100gbit"  # a link no all-reduce here comes near: the host's cores, not the wire, decide
BLOCK_LOOPS = 3  # loops per stretch of one link setting; the first after a change is not timed


def _train_records(model_dir: str) -> list:
    from tfgpu.metrics import history

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


def validate_row(argv_flags: list, config, num_workers: int, bandwidth: str, latency_ms: float, steps: int,
                 workdir: str, cores_per_worker: int) -> dict:
    """One run of ``num_workers`` workers on the emulated cluster, each on its own ``cores_per_worker`` cores
    (per-replica batch kept), whose link alternates, every ``BLOCK_LOOPS`` loops, between no limit and
    ``bandwidth``, for about ``steps`` steps of each. Returns the median step at the link (``measured_step_s``)
    and, taken in the same seconds and so under the same load, with no link limit (``unlimited_step_s``)."""
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
                          timeout_s=1800, output_dir=workdir, cores_per_worker=cores_per_worker)
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


def judge(rows: list, unlimited: dict) -> None:
    """Adds to each measured row its ``error`` (``predicted_step_s`` against ``measured_step_s``) and the term
    that missed: per worker count, the term that scaled alone best explains the misses of its rows and of the
    same runs' loops with no link limit (``unlimited``: the prediction at no limit with its measured step, one
    per worker count), which set the compute and host terms apart from the wire's."""
    for row in rows:
        row["error"] = row["predicted_step_s"] / row["measured_step_s"] - 1
    for n in sorted({r["workers"] for r in rows}):
        same = [r for r in rows if r["workers"] == n] + unlimited.get(n, [])
        term = scaling.missed_term(same)
        for row in rows:
            if row["workers"] == n:
                row["missed_term"] = term


def validate(flags: list, config, opts, measured: scaling.Measured, host: scaling.HostCost, rows: list,
             plan: dict, workdir: str) -> list:
    """Runs every row of the worker counts ``plan["validate"]`` on the emulated cluster, each worker on its core
    share (``validate_row``), adds the measured step to each and judges it (``judge``); the rows' predictions
    were made before and are not changed. Returns the rows validated."""
    checked, unlimited = [], {}
    for row in rows:
        n = row["workers"]
        if n not in plan["validate"]:
            continue
        run = validate_row(flags, config, n, row["bandwidth"], opts.latency_ms, opts.validate_steps or
                           opts.measure_steps, workdir, plan["cores_per_host"])
        row["measured_step_s"] = run["measured_step_s"]
        row["unlimited_step_s"] = run["unlimited_step_s"]  # a diagnostic: no pass or fail depends on it
        free = scaling.predict(measured, n, scaling.parse_bandwidth(UNLIMITED), 0.0, opts.link_efficiency, host)
        unlimited.setdefault(n, []).append({**free, "measured_step_s": run["unlimited_step_s"]})
        print(f"{n} workers on the emulated cluster at {row['bandwidth']}: {_ms(row['measured_step_s'])}/step "
              f"measured, {_ms(row['predicted_step_s'])} predicted "
              f"({row['predicted_step_s'] / row['measured_step_s'] - 1:+.0%}); with no link limit in the same run "
              f"{_ms(run['unlimited_step_s'])} ({_ms(free['predicted_step_s'])} predicted)", flush=True)
        checked.append(row)
    judge(checked, unlimited)
    return checked


def print_validation(rows: list, tolerance: float, cores_per_host: int) -> int:
    """The validation table (every row: the prediction's terms, predicted, measured, error; the same run's step
    with no link limit as a diagnostic); 1 when a row is off by more than ``tolerance``, naming the term that
    missed, else 0."""
    print(f"\nvalidation on the emulated cluster (each worker a host of {cores_per_host} core(s); within "
          f"{tolerance:.0%} passes):")
    print("| workers | link | compute | host all-reduce | wire | of these streaming together | predicted step | "
          "measured step | error | measured, no link limit |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    failed = []
    for row in rows:
        t = row["terms_s"]
        print(f"| {row['workers']} | {row['bandwidth']} | {_ms(t['compute'])} | {_ms(t['host all-reduce'])} | "
              f"{_ms(t['wire'])} | -{_ms(row.get('overlapped_s', 0.0))} | {_ms(row['predicted_step_s'])} | "
              f"{_ms(row['measured_step_s'])} | {row['error']:+.0%} | "
              f"{_ms(row['unlimited_step_s']) if 'unlimited_step_s' in row else '-'} |")
        if abs(row["error"]) > tolerance:
            failed.append(row)
    for row in failed:
        direction = "fast" if row["error"] < 0 else "slow"
        print(f"error: {row['workers']} workers at {row['bandwidth']}: predicted {row['error']:+.0%} off (too "
              f"{direction}); the term that missed: {row['missed_term']} "
              f"({_ms(row['terms_s'][row['missed_term']])} predicted, "
              f"{_ms(row['measured_step_s'] - row['predicted_step_s'])} unexplained)", file=sys.stderr)
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
            print(f"all-reduce host cost (2 workers, {cores.describe(pair)}, no link limit): {_ms(probe.fixed_s)} "
                  f"fixed + {probe.per_byte_s * 1e9:.2f} ns/byte sent: "
                  f"{_ms(probe.seconds(scaling.bytes_sent(2, measured.wire_bytes)))} for these gradients"
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
                      f"({_terms_text(row['terms_s'])}: {row['dominant']} dominates), "
                      f"{row['predicted_examples_per_sec']:9.1f} examples/s, efficiency {row['efficiency']:.0%}; "
                      f"with {best['remedy']}: {best['efficiency']:.0%}", flush=True)
        if opts.validate:
            checked = validate(flags, config, opts, measured, host, rows, plan, workdir)
            code = print_validation(checked, opts.tolerance, per)
    if opts.output_json:
        tmp = opts.output_json + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"one_replica": one, "cores_per_host": per, "link_efficiency": opts.link_efficiency,
                       "host_probe": dataclasses.asdict(probe) if probe else None, "rows": rows}, f, indent=2)
        os.replace(tmp, opts.output_json)
    return code


if __name__ == "__main__":
    sys.exit(main())
