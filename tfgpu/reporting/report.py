"""The run report: ``<model_dir>/report.md`` and PNG plots from what a run leaves behind.

The command ``python -m tfgpu.report`` (``tfgpu/report.py``) calls ``write_report``.

Reads ``history.jsonl`` (through ``tfgpu.metrics.history``), ``metrics.json`` (through
``tfgpu.metrics.results``), ``config.yaml``, ``metric_specs.json`` and, after ``--profile_input``,
``input_profile.json``; any of them may be missing or partial (a run still going, a crashed one). The
report names no task and no metric: its plots, image links, best scores, task
sections and task options come from the declarations the trainer wrote to
``metric_specs.json`` (``tfgpu.metrics.metric_specs``); for a run older than that file
they come from the registered task named in ``config.yaml``. The plots are
drawn by ``tfgpu.reporting.plots``; ``TFGPU_REPORT_PLOTS=0`` leaves them out (a second of CPU a run: the test
suite sets it, its tests of the plots unset it). The chief writes the report at the end of every run.
``model_dir`` may be any path TensorFlow opens (``gs://``, ``ram://``: ``tfgpu.runtime.fileio``).
"""
import importlib
import json
import math
import os
import statistics

from tfgpu.config import ConfigError
from tfgpu.reporting.plots import series, write_plots
from tfgpu.runtime import fileio
from tfgpu.runtime.fileio import atomic_write_bytes
from tfgpu.metrics import metric_specs, results
from tfgpu.metrics import history as history_lib
from tfgpu.runtime import run_dir
from tfgpu.metrics import target as target_lib

INPUT_BOUND_FRACTION = 0.1  # share of step time waiting for data above which a run is input-bound

# Config keys worth seeing in a report, in this order (only those present are shown), before the task's own
# (``Task.report_options``).
KEY_CONFIG = ("task", "model", "dataset", "data_dir", "image_size", "augment", "global_batch_size", "precision",
              "distribution_strategy", "num_gpus", "steps_per_loop", "train_steps", "epochs", "data_workers",
              "cache", "seed", "deterministic")


# -- reading what the run left --------------------------------------------------------------------------------------
def _read_json(path: str):
    try:
        value = json.loads(fileio.read_bytes(path))
        return value if isinstance(value, dict) else None
    except (OSError, ValueError):
        return None


def _read_yaml(path: str):
    import yaml

    try:
        value = yaml.safe_load(fileio.read_text(path))
        return value if isinstance(value, dict) else None
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# -- the verdicts -----------------------------------------------------------------------------------------------------
def _outruns_step(profile) -> bool:
    """The pipeline alone is clearly faster than the step alone (input_profile.json rates)."""
    input_rate, step_rate = profile.get("input_examples_per_sec"), profile.get("compute_examples_per_sec")
    return _finite(input_rate) and _finite(step_rate) and step_rate > 0 and input_rate > 1.2 * step_rate


def input_verdict(profile) -> str:
    """One line on whether the run waited for data, from input_profile.json (written with --profile_input)."""
    if not profile:
        return ("input-bound: not measured; rerun with --profile_input to time the input pipeline alone against "
                "the training step")
    wait = profile.get("input_wait_fraction")
    if not _finite(wait):
        return profile.get("verdict") or "input-bound: not measured (input_profile.json has no input_wait_fraction)"
    if wait <= INPUT_BOUND_FRACTION:  # the trainer's rule
        return f"not input-bound: {wait:.0%} of step time waiting for data"
    if _outruns_step(profile):
        ratio = profile["input_examples_per_sec"] / profile["compute_examples_per_sec"]
        return (f"input-bound: {wait:.0%} of step time waiting for data, although the pipeline alone is "
                f"{ratio:.1f}x faster than the step; try --cache or a larger --steps_per_loop before more "
                "--data_workers")
    return (f"input-bound: {wait:.0%} of step time waiting for data; raise --data_workers or use --cache "
            "(or store smaller images)")


def contention_note(profile) -> str:
    """Why a pipeline faster than the step can still cost time; "" unless that is the case."""
    if not profile or not _finite(profile.get("input_wait_fraction")) or \
            profile["input_wait_fraction"] <= INPUT_BOUND_FRACTION or not _outruns_step(profile):
        return ""
    return (f"The pipeline alone delivers {profile['input_examples_per_sec']:,.0f} examples/sec and the step alone "
            f"consumes {profile['compute_examples_per_sec']:,.0f}, so the pipeline is fast enough by itself; the "
            "time goes to running both at once (they share the CPU cores, all of them when the step also runs on "
            "the CPU) or to host work between loops.")


def throughput(train: list, specs) -> tuple:
    """([(unit, median)] of each train metric declared a rate (style ``rate``: examples/sec, ms/step), loops):
    medians over the loops after the first (which includes tracing and compilation), in declaration order."""
    steady = train[1:] if len(train) > 1 else train
    medians, loops = [], 0
    for spec in specs:
        if spec.kind == "train" and spec.style == "rate":
            values = [r[spec.name] for r in steady if _finite(r.get(spec.name))]
            if values:
                medians.append((spec.panel or spec.name, statistics.median(values)))
                loops = max(loops, len(values))
    return medians, loops


def _number(value: float) -> str:
    return f"{value:,.1f}" if abs(value) >= 100 else f"{value:,.3g}"


# -- the markdown -----------------------------------------------------------------------------------------------------
def _fmt(value) -> str:
    if isinstance(value, bool) or value is None:
        return str(value).lower() if value is not None else "-"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if value != 0 and (abs(value) >= 1e5 or abs(value) < 1e-3):
            return f"{value:.4g}"
        return f"{value:,.4f}".rstrip("0").rstrip(".") if abs(value) < 1000 else f"{value:,.1f}"
    if isinstance(value, (list, tuple)):
        return ", ".join(_fmt(v) for v in value) or "-"
    return str(value)


def _best(specs, evals: list) -> list:
    """Markdown lines with the best value of each eval metric declared lower- or higher-is-better, and its step."""
    rows = []
    for spec in specs:
        if spec.kind != "eval" or spec.lower_is_better is None:
            continue
        steps, values = series(evals, spec.name)
        if values:
            best = (min if spec.lower_is_better else max)(range(len(values)), key=values.__getitem__)
            better = "lower" if spec.lower_is_better else "higher"
            rows.append(f"| {spec.name} | {_fmt(values[best])} | {steps[best]} | {better} |")
    if not rows:
        return []
    return ["## Best evaluation", "", "| metric | best | step | better |", "| --- | --- | --- | --- |", *rows, ""]


def _images(specs, history: dict, model_dir: str) -> list:
    """Markdown for each metric declared as an image: the latest record's image under the declared title."""
    lines = []
    for spec in specs:
        if spec.style != "image":
            continue
        path = next((r[spec.name] for r in reversed(history.get(spec.kind, []))
                     if isinstance(r.get(spec.name), str)), None)
        if path:
            relative = os.path.relpath(path, model_dir) if os.path.isabs(path) else path
            if fileio.has_scheme(path) and path.startswith(model_dir.rstrip("/") + "/"):
                relative = path[len(model_dir.rstrip("/")) + 1:]
            lines += [f"## {spec.title or spec.name}", "", f"![{spec.label or spec.name}]({relative})", ""]
    return lines


def _sections(names, metrics: dict, evals: list, notes: list, model_dir: str = "") -> list:
    """The markdown lines of the task's declared report sections ("module:function"); one that fails to load
    or run becomes a note instead of costing the report, and so does one whose module is a file inside the run
    directory (metric_specs.json names it: whoever can write the run directory could have put both there)."""
    from tfgpu.models import user

    lines = []
    for name in names:
        inside = user.file_inside(name, model_dir) if model_dir else ""
        if inside:
            notes.append(f"report section {name} not run: its module is a file inside the run directory ({inside})")
            continue
        try:
            module, function = name.split(":")
            lines += getattr(importlib.import_module(module), function)(metrics, evals)
        except Exception as e:  # a section is the task's code: it must not cost the user the report
            notes.append(f"report section {name} failed: {type(e).__name__}: {e}")
    return lines


def declarations(model_dir: str, config, needed: bool = True):
    """The run's Declarations: from ``metric_specs.json``; for a run from before that file, from the task
    named in config.yaml (which imports the task, and TensorFlow, so only when ``needed``); else the loop's."""
    declared = metric_specs.read(model_dir)
    if declared is not None:
        return declared
    if needed and config and isinstance(config.get("task"), str):
        try:
            from tfgpu.tasks.registry import get_task

            return metric_specs.of_task(get_task(config["task"]))
        except (ImportError, ValueError):
            pass
    return metric_specs.Declarations(metric_specs.LOOP_METRICS)


def _topology_changes(history: dict) -> list:
    """The resumes on another topology or global batch (history.jsonl's ``topology`` records), one line each."""

    def describe(t):
        return (f"{t['num_workers']} worker(s) x {t['replicas_per_worker']} replica(s), global batch "
                f"{t['global_batch_size']}")

    lines = [f"- step {r['step']}: {describe(r['before'])} -> {describe(r['after'])}; epoch {r['epoch']} resumed at "
             f"record {r['records_consumed_in_epoch']:,} of {r['records']:,}, the rest of it read once"
             for r in history.get("topology", [])]
    return ["## Topology changes", "", *lines, ""] if lines else []


def _restarts(history: dict) -> list:
    """The worker groups tfgpu.launch restarted (history.jsonl's ``restart`` records), one line each."""
    lines = []
    for r in history.get("restart", []):
        lost = r.get("steps_lost")
        lines.append(f"- restart {r.get('restart')}: worker {r.get('worker')} {r.get('reason')}"
                     f"{'' if r.get('last_step') is None else ' after step ' + str(r['last_step'])}; "
                     f"{r.get('workers_before')} -> {r.get('workers_after')} workers, resumed from step {r['step']}"
                     f"{'' if lost is None else f' ({lost} steps lost)'}")
    return ["## Restarts", "", *lines, ""] if lines else []


def _config_changes(records: list) -> list:
    """The section listing each change --allow_config_change let a resume make, by the step it took effect."""
    if not records:
        return []
    lines = ["## Config changes", "", "Resumed with --allow_config_change; config.yaml holds the latest values.", "",
             "| step | option | before | after |", "| --- | --- | --- | --- |"]
    for r in records:
        cells = [_fmt(r.get(key)).replace("|", "/").replace("\n", " ") for key in ("step", "field", "old", "new")]
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]


def _table(rows: list, header=("", "")) -> list:
    lines = [f"| {header[0]} | {header[1]} |", "| --- | --- |"]
    lines += [f"| {k} | {_fmt(v).replace('|', '/')} |" for k, v in rows]
    return lines


def render(model_dir: str, history: dict, bad_lines: int, result, config, profile, plots: list,
           declared=None, unreadable: str = "") -> str:
    """The report's markdown from what was read (``result``: the run's ``results.RunResult``, or None) and the
    run's Declarations (no file access but the task's declared sections). ``unreadable``: why metrics.json
    could not be read, for the notes."""
    config = config or {}
    declared = declared or metric_specs.Declarations(metric_specs.LOOP_METRICS)
    notes = []
    train, evals = history.get("train", []), history.get("eval", [])
    name = os.path.basename(os.path.normpath(model_dir)) or model_dir
    lines = [f"# Run report: {name}", ""]
    ran = result.facts if result is not None and result.facts else results.RunFacts()
    what = [config.get("task") or ran.task, config.get("model") or ran.model]
    data = config.get("data_dir") or config.get("dataset")
    summary = " ".join(str(w) for w in what if w)
    if data:
        summary += f" on {data}"
    facts = []
    for key, option, value in results.placement_facts(result):
        value = config.get(option) if value is None else value
        if value is not None:
            facts.append(f"{key}={_fmt(value)}")
    lines.append(f"{summary or 'tfgpu run'}{' (' + ', '.join(facts) + ')' if facts else ''}.")
    last_step = max([r["step"] for r in train + evals] + ([result.step] if result and _finite(result.step) else []),
                    default=None)
    target = config.get("train_steps") or None
    progress = [f"last step {last_step}" + (f" of {target}" if target else "")] if last_step is not None else []
    if result is not None and _finite(result.wall_time_s):
        progress.append(f"wall time {result.wall_time_s:.0f} s")
    if result is None and not unreadable:
        progress.append("no metrics.json yet (the run is still going, or it stopped before the end)")
    sentence = "; ".join(progress)
    lines += ["", sentence[:1].upper() + sentence[1:] + "." if progress else "No steps recorded.", ""]
    reached = target_lib.sentence(result, declared)  # --target: reached at which step and time, or not
    if reached:
        lines += [reached[:1].upper() + reached[1:] + ".", ""]

    lines += _restarts(history)
    lines += _topology_changes(history)
    lines += ["## Input pipeline", "", input_verdict(profile) + ".", ""]
    caveat = contention_note(profile)
    if caveat:
        lines += [caveat, ""]
    if profile:
        rates = [(label, profile.get(key)) for label, key in (("input pipeline alone", "input_examples_per_sec"),
                                                              ("train step alone (data in place)",
                                                               "compute_examples_per_sec"),
                                                              ("training", "train_examples_per_sec"))]
        lines += ["| measured with --profile_input | examples/sec |", "| --- | --- |"]
        lines += [f"| {label} | {value:,.0f} |" for label, value in rates if _finite(value)]
        lines.append("")

    medians, loops = throughput(train, declared.metrics)
    if medians:
        lines += ["## Throughput", "",
                  "Median " + ", ".join(f"{_number(value)} {unit}" for unit, value in medians)
                  + f" over {loops} loop(s) of steps"
                  + (" (the first loop, which may include tracing and compilation, excluded)." if len(train) > 1
                     else "."), ""]

    final = [(k, v) for k, v in sorted(results.final_metrics(result).items()) if _finite(v)]
    if not final and (train or evals):  # no metrics.json: the latest logged values stand in
        latest = {**(train[-1] if train else {}), **(evals[-1] if evals else {})}
        final = [(k, v) for k, v in sorted(latest.items()) if k not in ("kind", "time") and _finite(v)]
        lines += ["## Latest logged metrics (no metrics.json)", ""]
    elif final:
        lines += ["## Final metrics", ""]
    if final:
        lines += _table(final, ("metric", "value")) + [""]

    lines += _best(declared.metrics, evals)
    lines += _sections(declared.report_sections, result.values if result is not None else {}, evals, notes,
                       model_dir)
    if plots:
        lines += ["## Plots", ""]
        for path, title in plots:
            lines += [f"![{title}]({path})", ""]
    lines += _images(declared.metrics, history, model_dir)

    lines += _config_changes(history.get(history_lib.CONFIG_CHANGE, []))
    if config:
        lines += ["## Key config", ""]
        keys = dict.fromkeys(KEY_CONFIG + tuple(declared.report_options))
        lines += _table([(k, config[k]) for k in keys if k in config and config[k] not in ("", None)],
                        ("option", "value"))
        lines += ["", "Full config: `config.yaml` (rerun with `--config=config.yaml`).", ""]
    if config and config.get("tensorboard", True):
        lines += ["TensorBoard: `tensorboard --logdir " + run_dir.summaries(model_dir) + "` (runs `train` and "
                  "`validation` share each metric's tag, so their curves overlay; a GAN's sample grids are under "
                  "`samples`).", ""]

    if not train and not evals:
        notes.append("history.jsonl is missing or empty: no curves to plot")
    if bad_lines:
        notes.append(f"history.jsonl has {bad_lines} unreadable line(s), skipped (a run killed mid-write)")
    if not config:
        notes.append("config.yaml is missing or unreadable")
    if unreadable:
        notes.append(unreadable)
    if notes:
        lines += ["## Notes", ""] + [f"- {n}." for n in notes] + [""]
    lines.append("Regenerate with `python -m tfgpu.report --model_dir=" + model_dir + "`.")
    return "\n".join(lines) + "\n"


def write_report(model_dir: str) -> str:
    """Writes ``<model_dir>/report.md`` and its plots from whatever the run has left; returns report.md's path."""
    history, bad = history_lib.read_by_kind(model_dir)
    result, unreadable = None, ""
    try:
        result = results.read(model_dir)
    except ConfigError as e:  # the report is made of whatever the run left: the note names the file instead
        unreadable = e.reason
    config = _read_yaml(run_dir.config_yaml(model_dir))
    profile = _read_json(run_dir.input_profile(model_dir))
    declared = declarations(model_dir, config, needed=bool(history or result))
    plots = write_plots(model_dir, history, declared.metrics) if _plots_wanted() else []
    text = render(model_dir, history, bad, result, config, profile, plots, declared, unreadable)
    path = run_dir.report(model_dir)
    atomic_write_bytes(path, text.encode())
    return path


def _plots_wanted() -> bool:
    """False when ``TFGPU_REPORT_PLOTS=0``; unset or 1 draws the plots."""
    value = os.environ.get("TFGPU_REPORT_PLOTS", "1")
    if value not in ("0", "1"):
        raise ValueError(f"TFGPU_REPORT_PLOTS must be 0 (no plots) or 1, got {value!r}")
    return value == "1"
