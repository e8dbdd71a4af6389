"""``tfgpu.plan --validate``: the plan's rows run on the emulated cluster network (``tfgpu.bench.netem``), each
worker on its share of the host's cores, the link alternating between no limit and the row's bandwidth; every row's
prediction, made before, is judged against the step measured at the link, naming the term that missed."""
import os
import statistics
import sys
import time

from tfgpu.bench import scaling

# The child runs train only: no evaluation, checkpoint, summaries or report in the measurement.
MEASURE_FLAGS = ["--eval_split=none", "--checkpoint_every_steps=0", "--tensorboard=false", "--verbose=0",
                 "--distribution_strategy=one_device", "--cpu_logical_devices=0"]


def train_command(argv_flags: list, model_dir: str, steps: int, global_batch: int, loop: int) -> list:
    return [sys.executable, "-m", "tfgpu.train", *argv_flags, f"--model_dir={model_dir}", f"--train_steps={steps}",
            f"--global_batch_size={global_batch}", f"--steps_per_loop={loop}"]


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
        codes = netem.run(train_command(flags + MEASURE_FLAGS[:4], model_dir, loop * (1 + blocks * BLOCK_LOOPS),
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


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def terms_text(terms: dict) -> str:
    return ", ".join(f"{name} {ms(value)}" for name, value in terms.items())


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
        print(f"{n} workers on the emulated cluster at {row['bandwidth']}: {ms(row['measured_step_s'])}/step "
              f"measured, {ms(row['predicted_step_s'])} predicted "
              f"({row['predicted_step_s'] / row['measured_step_s'] - 1:+.0%}); with no link limit in the same run "
              f"{ms(run['unlimited_step_s'])} ({ms(free['predicted_step_s'])} predicted)", flush=True)
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
        print(f"| {row['workers']} | {row['bandwidth']} | {ms(t['compute'])} | {ms(t['host all-reduce'])} | "
              f"{ms(t['wire'])} | -{ms(row.get('overlapped_s', 0.0))} | {ms(row['predicted_step_s'])} | "
              f"{ms(row['measured_step_s'])} | {row['error']:+.0%} | "
              f"{ms(row['unlimited_step_s']) if 'unlimited_step_s' in row else '-'} |")
        if abs(row["error"]) > tolerance:
            failed.append(row)
    for row in failed:
        direction = "fast" if row["error"] < 0 else "slow"
        print(f"error: {row['workers']} workers at {row['bandwidth']}: predicted {row['error']:+.0%} off (too "
              f"{direction}); the term that missed: {row['missed_term']} "
              f"({ms(row['terms_s'][row['missed_term']])} predicted, "
              f"{ms(row['measured_step_s'] - row['predicted_step_s'])} unexplained)", file=sys.stderr)
    return 1 if failed else 0
