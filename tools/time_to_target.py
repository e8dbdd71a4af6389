"""Time to a target: tfgpu against plain Keras ``fit`` on the same data, same machine, same run.

    python tools/time_to_target.py --target=val_accuracy:0.97 --repeats=3 [--output_json=F]
    python tools/time_to_target.py --target=val_accuracy:0.97 --flagfile=configs/mnist5k.flags --repeats=3

Each repeat runs both sides once, alternating which goes first (tfgpu, fit; then fit, tfgpu; ...), so a
change in the machine's load falls on both alike:

- tfgpu: ``python -m tfgpu.train --flagfile=configs/quickstart.flags --target=T --model_dir=D`` (plus any
  ``--tfgpu_flag``), read back from ``D/metrics.json`` (``time_to_target_s``: wall time from the process's
  start to the evaluation that reached the target);
- fit: ``python tools/keras_fit_to_target.py --target=T --dataset=D`` (the same built-in dataset D as the
  flagfile's ``--dataset``, or ``--dataset`` here for both sides; ResNet-20, float32 unless ``--fit_precision``,
  batch 128, cosine, SGD with momentum, ``model.fit`` stopped by a callback at the first epoch that reaches the
  target; time from that script's first line).

Prints each run (with the host's load average before it), the median time to target of each side with its
min-max, and the ratio tfgpu/fit: the median of the per-repeat ratios with their min-max, so one run cannot
be mistaken for a trend. A run that does not reach the target is reported and left out of the ratios. The user
waits for the process, not for the evaluation: each side's process wall time (this tool's clock, from the
launch to the exit) and the part of it after the target (``after_target_s``: what the process still does
once it got there: tfgpu's export, metrics.json and report, both sides' teardown) are printed too, with the
ratio of the process wall times.
"""
import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)  # tfgpu from this checkout
from tfgpu.metrics import results  # noqa: E402 (after the checkout is on the path)

SIDES = ("tfgpu", "fit")


def _load_fit_script():
    """tools/keras_fit_to_target.py, whose recipe flags this tool offers with a fit_ prefix (stdlib at import)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("keras_fit_to_target",
                                                  os.path.join(REPO, "tools", "keras_fit_to_target.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fit_script = _load_fit_script()


class UsageError(ValueError):
    """A bad flag: one line naming it, exit 1, before any run starts."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python tools/time_to_target.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True, help="METRIC:VALUE, e.g. val_accuracy:0.97 (both sides).")
    p.add_argument("--repeats", type=int, default=3, help="Paired runs (tfgpu and fit each once per repeat).")
    p.add_argument("--flagfile", default="configs/quickstart.flags", help="tfgpu's recipe (relative to the "
                   "repository root or absolute).")
    p.add_argument("--dataset", default="", help="A built-in dataset (digits, mnist5k) for both sides; empty = "
                   "the flagfile's --dataset.")
    p.add_argument("--tfgpu_flag", action="append", default=[], help="An extra flag for tfgpu.train, e.g. "
                   "--tfgpu_flag=--precision=float32 (repeatable).")
    fit_script.add_recipe_flags(p, prefix="fit_")  # fit as users write it unless told otherwise
    p.add_argument("--timeout_s", type=float, default=1800, help="Kill one run that takes longer.")
    p.add_argument("--output_json", default="", help="Write every run and the summary here.")
    return p


def check(args: argparse.Namespace) -> None:
    """Every flag checked before the first run; raises UsageError naming the flag."""
    from tfgpu.config import ConfigError
    from tfgpu.metrics.target import parse

    try:
        parse(args.target)
    except ConfigError as e:
        raise UsageError(str(e)) from None
    if args.repeats <= 0:
        raise UsageError(f"--repeats: must be positive, got {args.repeats}")
    if not args.timeout_s > 0:
        raise UsageError(f"--timeout_s: must be positive, got {args.timeout_s}")
    error = fit_script.recipe_error(args, prefix="fit_")
    if error:
        raise UsageError(error)
    if not os.path.isfile(flagfile_path(args.flagfile)):
        raise UsageError(f"--flagfile: {args.flagfile} does not exist")
    for flag in args.tfgpu_flag:
        if not flag.startswith("--") or flag.split("=")[0] in ("--target", "--model_dir", "--flagfile", "--dataset"):
            raise UsageError(f"--tfgpu_flag: expected a tfgpu.train flag other than --target, --model_dir, "
                             f"--flagfile and --dataset (e.g. --precision=float32), got {flag!r}")
    from tfgpu.data.sources.builtin import BUILTIN

    try:
        dataset = race_dataset(args)
    except ConfigError as e:
        raise UsageError(str(e)) from None
    if dataset not in BUILTIN:
        name, value = ("dataset", args.dataset) if args.dataset else ("flagfile", f"{args.flagfile}'s --dataset")
        raise UsageError(f"--{name}: {value} is {dataset or 'not set'}; the race needs a built-in "
                         f"dataset that both sides load ({', '.join(BUILTIN)})")
    if args.output_json:
        directory = os.path.dirname(os.path.abspath(args.output_json))
        if not os.path.isdir(directory) or not os.access(directory, os.W_OK):
            raise UsageError(f"--output_json: directory {directory!r} does not exist or is not writable")


def flagfile_path(flagfile: str) -> str:
    return flagfile if os.path.isabs(flagfile) else os.path.join(REPO, flagfile)


def flagfile_dataset(flagfile: str) -> str:
    """The ``--dataset`` a flagfile sets, read by tfgpu.train's own reader (nested flagfiles resolved next to
    their file, the last one wins), or ""."""
    from tfgpu.cli import expand_flagfiles

    expanded = expand_flagfiles([f"--flagfile={flagfile_path(flagfile)}"])
    return ([arg.split("=", 1)[1] for arg in expanded if arg.startswith("--dataset=")] or [""])[-1]


def race_dataset(args: argparse.Namespace) -> str:
    """The built-in dataset both sides train on: ``--dataset``, else the flagfile's."""
    return args.dataset or flagfile_dataset(args.flagfile)


def order(repeat: int) -> tuple:
    """Which side runs first in a repeat: alternating, so neither always gets the quieter slot."""
    return SIDES if repeat % 2 == 0 else SIDES[::-1]


def commands(args: argparse.Namespace, workdir: str, repeat: int) -> dict:
    """Each side's command line for one repeat, and where its result is read from."""
    model_dir = os.path.join(workdir, f"tfgpu{repeat}")
    fit_json = os.path.join(workdir, f"fit{repeat}.json")
    return {
        "tfgpu": ([sys.executable, "-m", "tfgpu.train", f"--flagfile={flagfile_path(args.flagfile)}",
                   f"--target={args.target}", f"--model_dir={model_dir}",
                   *([f"--dataset={args.dataset}"] if args.dataset else []), *args.tfgpu_flag],
                  results.path(model_dir)),
        "fit": ([sys.executable, os.path.join(REPO, "tools", "keras_fit_to_target.py"), f"--target={args.target}",
                 f"--dataset={race_dataset(args)}", *fit_script.recipe_args(args, prefix="fit_"),
                 f"--output_json={fit_json}"], fit_json),
    }


def read_outcome(side: str, path: str) -> dict:
    """The fields both sides share, under this tool's names, from a finished run's result file (tfgpu: its
    metrics.json, read through ``tfgpu.metrics.results``; fit: keras_fit_to_target.py's JSON, in these names)."""
    if side == "tfgpu":
        result = results.read(os.path.dirname(path))
        outcome = result.target or results.TargetOutcome("", False)
        return {"target": outcome.target, "target_reached": outcome.reached, "time_to_target_s": outcome.seconds,
                "epochs_at_target": outcome.epochs, "step_at_target": outcome.step,
                "precision": result.facts.precision if result.facts else None}
    with open(path) as f:
        result = json.load(f)
    return {k: result.get(k) for k in ("target", "target_reached", "time_to_target_s", "epochs_at_target",
                                       "precision")}


def run_side(side: str, cmd: list, result_path: str, timeout_s: float, log_path: str) -> dict:
    """Runs one side to its end (bounded by ``timeout_s``); its outcome, process wall time and the load average
    (1 minute) before it started."""
    load = round(os.getloadavg()[0], 2)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("TF_CONFIG", None)
    started = time.time()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    run = {"side": side, "load_before": load, "process_wall_s": round(time.time() - started, 1),
           "command": " ".join(cmd), "exit_code": code}
    if code == 0 and os.path.exists(result_path):
        run.update(read_outcome(side, result_path))
        if run.get("target_reached") and run.get("time_to_target_s") is not None:
            run["after_target_s"] = round(run["process_wall_s"] - run["time_to_target_s"], 1)
    else:
        with open(log_path, errors="replace") as f:
            tail = [line.strip() for line in f if line.strip()][-2:]
        run.update(target_reached=False, time_to_target_s=None,
                   error=("timed out" if code is None else f"exit {code}") + (": " + " | ".join(tail) if tail else ""))
    return run


def _spread(values: list) -> dict:
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3), "n": len(values)} if values else None


def summarize(runs: list) -> dict:
    """Median time to target per side (runs that reached it) and the ratio tfgpu/fit over the repeats where
    both sides reached it: the median of per-repeat ratios, with their min and max; the same for the process
    wall times, and each side's time after the target."""
    reached = {side: [r for r in runs if r["side"] == side and r.get("target_reached")] for side in SIDES}
    by_repeat = {}
    for r in runs:
        by_repeat.setdefault(r["repeat"], {})[r["side"]] = r
    pairs = [pair for _, pair in sorted(by_repeat.items())
             if all(pair.get(s, {}).get("target_reached") for s in SIDES) and pair["fit"]["time_to_target_s"]]
    ratios = [pair["tfgpu"]["time_to_target_s"] / pair["fit"]["time_to_target_s"] for pair in pairs]
    wall_ratios = [pair["tfgpu"]["process_wall_s"] / pair["fit"]["process_wall_s"] for pair in pairs
                   if pair["fit"].get("process_wall_s")]
    return {"time_to_target_s": {side: _spread([r["time_to_target_s"] for r in reached[side]]) for side in SIDES},
            "process_wall_s": {side: _spread([r["process_wall_s"] for r in reached[side]]) for side in SIDES},
            "after_target_s": {side: _spread([r["after_target_s"] for r in reached[side] if "after_target_s" in r])
                               for side in SIDES},
            "missed": {side: sum(1 for r in runs if r["side"] == side and not r.get("target_reached"))
                       for side in SIDES},
            "ratio_tfgpu_over_fit": _spread(ratios), "ratios": [round(x, 3) for x in ratios],
            "process_wall_ratio_tfgpu_over_fit": _spread(wall_ratios)}


def describe_run(r: dict) -> str:
    if r.get("target_reached"):
        at = (f"step {r['step_at_target']}, {r['epochs_at_target']:.2f} epochs" if r["side"] == "tfgpu" else
              f"epoch {r['epochs_at_target']}")
        what = f"{r['time_to_target_s']:.1f} s to target ({at})"
        if r.get("after_target_s") is not None:
            what += f", {r['after_target_s']:.1f} s after it"
    else:
        what = "target not reached" + (f" ({r['error']})" if r.get("error") else "")
    precision = f" ({r['precision']})" if r.get("precision") else ""
    return (f"repeat {r['repeat']} {r['side']:5}{precision}: {what}; process {r['process_wall_s']:.1f} s; "
            f"load before {r['load_before']:.2f}")


def format_summary(summary: dict, target: str) -> str:
    lines = [f"time to {target}, median (min-max) over the runs that reached it:"]
    for side in SIDES:
        s, missed = summary["time_to_target_s"][side], summary["missed"][side]
        lines.append(f"  {side:5}: " + (f"{s['median']:.1f} s ({s['min']:.1f}-{s['max']:.1f}, n={s['n']})"
                                        if s else "never reached") + (f"; {missed} run(s) missed it" if missed else ""))
    r = summary["ratio_tfgpu_over_fit"]
    lines.append(f"tfgpu/fit time-to-target ratio: {r['median']:.3f} (min-max {r['min']:.3f}-{r['max']:.3f} over "
                 f"{r['n']} paired repeat{'s' if r['n'] > 1 else ''}; < 1 = tfgpu faster)" if r else
                 "tfgpu/fit time-to-target ratio: none (no repeat where both sides reached the target)")
    walls, after = summary.get("process_wall_s", {}), summary.get("after_target_s", {})
    if any(walls.values()):
        lines.append("process wall time (launch to exit), median (min-max); of it after the target:")
        for side in SIDES:
            w, a = walls.get(side), after.get(side)
            if w:
                lines.append(f"  {side:5}: {w['median']:.1f} s ({w['min']:.1f}-{w['max']:.1f})" +
                             (f"; {a['median']:.1f} s ({a['min']:.1f}-{a['max']:.1f}) after the target" if a else ""))
    w = summary.get("process_wall_ratio_tfgpu_over_fit")
    if w:
        lines.append(f"tfgpu/fit process wall-time ratio: {w['median']:.3f} (min-max {w['min']:.3f}-{w['max']:.3f})")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    try:
        check(args)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    workdir = tempfile.mkdtemp(prefix="tfgpu-time-to-target-")
    runs = []
    try:
        for repeat in range(args.repeats):
            cmds = commands(args, workdir, repeat)
            for side in order(repeat):
                cmd, result_path = cmds[side]
                run = {"repeat": repeat, **run_side(side, cmd, result_path, args.timeout_s,
                                                    os.path.join(workdir, f"{side}{repeat}.log"))}
                runs.append(run)
                print(describe_run(run), flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    summary = summarize(runs)
    print(format_summary(summary, args.target), flush=True)
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump({"command": "python tools/time_to_target.py " + " ".join(sys.argv[1:] if argv is None else argv),
                       "time": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "cpu_count": os.cpu_count(),
                       "runs": runs, "summary": summary}, f, indent=2)
            f.write("\n")
    return 0 if summary["ratio_tfgpu_over_fit"] else 2


if __name__ == "__main__":
    sys.exit(main())
