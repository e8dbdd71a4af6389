"""The parent side of a benchmark: runs each measurement in its own child process, alternates runners over
``--repeats`` rounds, searches the largest batch that fits (``--batch_size=auto``) and assembles the report."""
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from tfgpu.bench.plan import Plan, case_config
from tfgpu.bench.stats import (ONE_DEVICE_BASELINES, add_mfu, devices_note, examples_per_cpu_second, pool_rounds,
                               ratio_spread, ratios)
from tfgpu.config import ConfigError


class Runner:
    """Runs measurements in child processes under one scratch directory; prints progress to stderr."""

    def __init__(self, p: Plan, workdir: str):
        self.plan, self.workdir, self.count = p, workdir, 0
        self.environment = None

    def run(self, runner: str, batch: int, precision: str, jit: bool, per_replica: int = 0,
            probe: bool = False) -> dict:
        o = self.plan.opts
        self.count += 1
        model_dir = os.path.join(self.workdir, f"run{self.count}")
        case = {"runner": runner, "config": case_config(self.plan, batch or per_replica, precision, jit, model_dir),
                "per_replica_batch_size": per_replica, "probe": probe, "untimed_steps": o.untimed_steps,
                "steps_per_window": o.steps_per_window, "windows": o.windows,
                "keras_steps_per_execution": o.keras_steps_per_execution,
                "keras_one_device_strategy": o.keras_one_device_strategy}
        if runner == "tfgpu_one_device":  # tfgpu on the one device the one-device baselines use (case.one_device)
            case["config"].update(distribution_strategy="one_device", cpu_logical_devices=0)
        if probe:
            case["config"].update(train_steps=2, steps_per_loop=1)
        if runner == "synthetic":  # tfgpu again, on one random batch of the real data's shape
            case["config"].pop("data_dir", None)
            case["config"].update(dataset="synthetic", image_size=self.plan.data_shape[0],
                                  num_classes=self.plan.num_classes, augment="none")
        what = f"{runner} " + (f"per-replica batch {per_replica}" if per_replica else f"batch {batch}") + \
               f" {precision} xla={'on' if jit else 'off'}" + (" (fits?)" if probe else "")
        print(f"[{self.count}] {what} ...", file=sys.stderr, flush=True)
        started = time.time()
        result = self._child(case, os.path.join(self.workdir, f"run{self.count}"))
        result.update(name=runner, precision=precision, jit_compile=jit, model=self.plan.shared.get("model"),
                      image_size=self.plan.image_size or self.plan.data_shape[0],
                      dataset=case["config"].get("data_dir") or case["config"]["dataset"],
                      steps_per_window=o.steps_per_window, windows=o.windows, untimed_steps=o.untimed_steps)
        result.setdefault("batch_size", batch)
        self.environment = result.pop("environment", None) or self.environment
        shutil.rmtree(model_dir, ignore_errors=True)
        status = (f"{result['examples_per_sec']:.1f} examples/sec" if result.get("examples_per_sec") else
                  "fits" if result["status"] == "ok" else f"{result['status']}: {result.get('reason', '')}")
        print(f"[{self.count}] {what}: {status} ({time.time() - started:.0f}s)", file=sys.stderr, flush=True)
        return result

    def _child(self, case: dict, stem: str) -> dict:
        import tfgpu

        result_path, log_path = stem + ".json", stem + ".log"
        env = dict(os.environ)
        env.pop("TF_CONFIG", None)  # one process: a cluster description would make it wait for peers
        package_root = os.path.dirname(os.path.dirname(os.path.abspath(tfgpu.__file__)))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
        cmd = [sys.executable, "-m", "tfgpu.benchmark", "--_case=" + json.dumps({**case, "result": result_path})]
        with open(log_path, "w") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
            try:
                returncode = proc.wait(timeout=self.plan.opts.case_timeout_s)
            except subprocess.TimeoutExpired:
                return {"status": "failed", "reason": f"timed out after {self.plan.opts.case_timeout_s:.0f}s"}
            finally:
                if proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        if os.path.exists(result_path):
            with open(result_path) as f:
                return json.load(f)
        with open(log_path, errors="replace") as f:
            tail = [line.strip() for line in f if line.strip()][-3:]
        killed = returncode < 0 and -returncode == signal.SIGKILL
        return {"status": "oom" if killed or any(_looks_oom(t) for t in tail) else "failed",
                "reason": f"child exited {returncode}: " + " | ".join(tail)[-600:]}


def _looks_oom(line: str) -> bool:
    return "RESOURCE_EXHAUSTED" in line or "out of memory" in line.lower()


def _fail_on_config_error(result: dict) -> None:
    if result.get("config_error"):
        flag, _, message = result["reason"].partition(": ")
        flag = flag.lstrip("-")
        raise ConfigError({"global_batch_size": "batch_size"}.get(flag, flag), message)


def _skip(mine: dict, name: str, reason: str) -> dict:
    """A baseline not run, with why, in the shape of a result."""
    return {**{k: mine.get(k) for k in ("precision", "jit_compile", "model", "image_size", "dataset", "batch_size")},
            "name": name, "status": "skipped", "reason": reason}


def measure(runner: Runner, batch: int, precision: str, jit: bool, per_replica: int = 0) -> list:
    """tfgpu then each baseline on the same case, ``--repeats`` rounds in alternation (so a change in machine
    load hits every runner alike); each runner's windows from all rounds are pooled. When tfgpu runs on more
    devices than the one-device baselines, each round also runs tfgpu on one device (``tfgpu_one_device``):
    tfgpu/keras_fit is only taken between runs on the same devices."""
    o = runner.plan.opts
    rounds = {name: [] for name in ("tfgpu",) + runner.plan.baselines}
    skipped, steps_per_loop = {}, runner.plan.shared["steps_per_loop"]
    for _ in range(o.repeats):
        mine = runner.run("tfgpu", batch, precision, jit, per_replica=per_replica)
        _fail_on_config_error(mine)
        rounds["tfgpu"].append(mine)
        if (mine.get("num_replicas") or 1) > 1 and set(runner.plan.baselines) & set(ONE_DEVICE_BASELINES):
            one = runner.run("tfgpu_one_device", mine.get("batch_size") or batch, precision, jit)
            rounds.setdefault("tfgpu_one_device", []).append(one)
        for baseline in runner.plan.baselines:
            if baseline == "keras_fit_strategy" and mine.get("strategy") == "one_device":
                skipped[baseline] = _skip(mine, baseline, "the strategy is one_device: keras_fit measures the same "
                                                          "thing")
            elif baseline == "keras_fit_spe" and o.keras_steps_per_execution == steps_per_loop:
                skipped[baseline] = _skip(mine, baseline, f"--steps_per_loop={steps_per_loop} "
                                                          "equals keras_fit's steps_per_execution: keras_fit measures "
                                                          "the same thing")
            else:
                rounds[baseline].append(runner.run(baseline, mine.get("batch_size") or batch, precision, jit))
    return [skipped.get(name) or pool_rounds(results) for name, results in rounds.items()]


def auto_batch(runner: Runner, precision: str, jit: bool) -> dict:
    """Largest per-replica batch (a multiple of --batch_granularity) whose real training step fits in memory:
    doubling until a step runs out of memory (or --max_batch_size), then binary search."""
    o = runner.plan.opts
    unit, probes, cap = o.batch_granularity, [], o.max_batch_size

    def fits(b):
        r = runner.run("tfgpu", 0, precision, jit, per_replica=b, probe=True)
        _fail_on_config_error(r)
        if r["status"] not in ("ok", "oom"):
            raise RuntimeError(f"--batch_size=auto: the probe at per-replica batch {b} failed: {r.get('reason')}")
        probes.append({"per_replica_batch_size": b, "fits": r["status"] == "ok",
                       "peak_memory_bytes": r.get("peak_memory_bytes"), "reason": r.get("reason")})
        return r

    first = fits(unit)
    if first["status"] != "ok":
        raise RuntimeError(f"--batch_size=auto: even a per-replica batch of {unit} does not fit: {first['reason']}")
    if not cap:
        cap = 256 if first.get("memory_kind") == "host_peak_rss_bytes" else 1 << 16
        print(f"--batch_size=auto: searching up to a per-replica batch of {cap} (--max_batch_size)",
              file=sys.stderr)
    cap = max(unit, cap // unit * unit)
    good, bad, doublings = unit, None, [unit]
    while good < cap and bad is None:
        b = min(2 * good, cap)
        if fits(b)["status"] == "ok":
            good = b
            doublings.append(b)
        else:
            bad = b
    while bad is not None and bad - good > unit:
        mid = (good + bad) // 2 // unit * unit
        if fits(mid)["status"] == "ok":
            good = mid
        else:
            bad = mid
    table = [d for d in doublings if d < good][-3:] + [good]  # the largest and up to three below it
    return {"precision": precision, "jit_compile": jit, "max_per_replica_batch_size": good,
            "limited_by": "memory" if bad is not None else "max_batch_size", "probes": probes,
            "table_per_replica_batch_sizes": table, "replicas": first.get("num_replicas")}


def run_benchmark(p: Plan) -> dict:
    """Every measurement of the plan; returns the report (results, ratios, auto search, environment)."""
    workdir = tempfile.mkdtemp(prefix="tfgpu-benchmark-")
    runner = Runner(p, workdir)
    results, searches = [], []
    try:
        for precision in p.precisions:
            for jit in p.jits:
                if p.batches:
                    for batch in p.batches:
                        results += measure(runner, batch, precision, jit)
                    continue
                search = auto_batch(runner, precision, jit)
                searches.append(search)
                for per_replica in search["table_per_replica_batch_sizes"]:
                    results += measure(runner, 0, precision, jit, per_replica=per_replica)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    for r in results:
        add_mfu(r)
        r.setdefault("examples_per_sec", None)
    if any(r.get("step_time_ms") and r["step_time_ms"] * p.opts.steps_per_window < 200 for r in results):
        print("note: some timed windows were shorter than 0.2 s, so timer resolution and scheduling noise weigh "
              "on them; raise --steps_per_window for stable numbers", file=sys.stderr)
    report = {"command": "python -m tfgpu.benchmark " + " ".join(p.opts.command),
              "time": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "environment": runner.environment,
              "results": results, "ratios": ratios(results), "ratio_spread": ratio_spread(results),
              # Examples per CPU-second of the process: on a shared host these move far less than wall clock.
              "cpu_time_ratios": ratios(results, examples_per_cpu_second),
              "cpu_time_ratio_spread": ratio_spread(results, examples_per_cpu_second),
              "notes": devices_note(results)}
    if p.precision_auto:
        report["precision_auto"] = p.precision_auto
    if searches:
        report["auto_batch_size"] = searches
    return report


