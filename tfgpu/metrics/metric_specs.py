"""Metric declarations: what a run logs and how the report shows it.

A task declares the metrics it logs (``Task.metrics``) and the trainer declares
its own (``LOOP_METRICS``: throughput and evaluation time). The trainer logs,
averages and counts from these declarations and writes them, with the task's
report sections, to ``<model_dir>/metric_specs.json``; the report plots and
labels from that file. So neither the trainer nor the report names a task or a
task's metric, and a new task needs no edit to either.

No TensorFlow here: the report reads this module in a light process.
"""
import dataclasses
import json

from tfgpu.runtime import run_dir

SPECS_FILE = run_dir.METRIC_SPECS_FILE
KINDS = ("train", "eval")
SCALES = ("linear", "log", "log2")
STYLES = ("line", "rate", "image")


@dataclasses.dataclass(frozen=True)
class MetricSpec:
    """One key of the ``train`` or ``eval`` records in history.jsonl.

    name: the key. kind: ``train`` (a step's value, averaged over a loop; metrics.json holds the last loop's
    as ``train_<name>``) or ``eval`` (one evaluation's value). lower_is_better: True or False for a score the
    report names the best of; None for a quantity (a learning rate, a count). plot: the figure it is drawn in,
    ``plots/<plot>.png``, "" for none; title: that figure's title (the first declaration of a figure gives it);
    panel: the y-axis label, metrics of one panel share an axis; label: the legend entry (default the name).
    scale: ``linear``, ``log`` (log axis when positive values span more than two decades) or ``log2`` (powers
    of two, such as a dynamic loss scale). style: ``line``; ``rate`` (a throughput: the first loop, which
    includes tracing and compilation, drawn apart, with the median of the rest); ``image`` (a path to an image
    the report shows, under ``title``). counts_nonfinite: the step's share is 1/replicas when the step was
    skipped for a non-finite loss or gradient; the trainer sums it per loop instead of averaging and stops
    after --max_nonfinite_steps such steps in a row. counts_examples: an eval metric holding the number of
    eval examples read; with --skip_corrupt_records the trainer reports the split's records it could not read.
    progress: shown in the progress bar.
    """
    name: str
    kind: str = "train"
    lower_is_better: bool | None = None
    plot: str = ""
    title: str = ""
    panel: str = ""
    label: str = ""
    scale: str = "linear"
    style: str = "line"
    counts_nonfinite: bool = False
    counts_examples: bool = False
    progress: bool = False

    def __post_init__(self):
        for field, value, allowed in (("kind", self.kind, KINDS), ("scale", self.scale, SCALES),
                                      ("style", self.style, STYLES)):
            if value not in allowed:
                raise ValueError(f"metric {self.name!r}: {field} {value!r} is not one of {', '.join(allowed)}")
        if self.plot and not self.panel and self.style != "image":
            raise ValueError(f"metric {self.name!r} is plotted in {self.plot!r} but names no panel")


# The loop's own metrics: every task's run has them.
LOOP_METRICS = (
    MetricSpec("examples_per_sec", plot="throughput", title="Training throughput", panel="examples/sec",
               label="examples/sec", style="rate", progress=True),
    MetricSpec("step_time_ms", plot="throughput", panel="ms/step", label="step time", style="rate", progress=True),
    MetricSpec("eval_time_s", kind="eval"),
)


@dataclasses.dataclass(frozen=True)
class Declarations:
    """What a run declares for its report: its metrics (the task's, then the loop's), the task's report
    sections ("module:function" names of functions (metrics dict, eval records) -> markdown lines) and the
    task's options worth showing in the key-config table."""
    metrics: tuple = ()
    report_sections: tuple = ()
    report_options: tuple = ()


def of_task(task) -> Declarations:
    """The declarations of a run of ``task`` (a Task class or instance)."""
    return Declarations(tuple(task.metrics) + LOOP_METRICS, tuple(task.report_sections), tuple(task.report_options))


def to_json(declarations: Declarations) -> dict:
    """The declarations as written to metric_specs.json."""
    return {"metrics": [dataclasses.asdict(s) for s in declarations.metrics],
            "report_sections": list(declarations.report_sections),
            "report_options": list(declarations.report_options)}


def from_json(value) -> Declarations:
    """Declarations from metric_specs.json's content; entries that do not parse are dropped, so a file from
    another version still gives what it can."""
    if not isinstance(value, dict):
        return Declarations()
    known = {f.name for f in dataclasses.fields(MetricSpec)}
    specs = []
    for entry in value.get("metrics") or ():
        try:
            specs.append(MetricSpec(**{k: v for k, v in entry.items() if k in known}))
        except (TypeError, ValueError, AttributeError):
            continue
    strings = {key: tuple(s for s in value.get(key) or () if isinstance(s, str))
               for key in ("report_sections", "report_options")}
    return Declarations(tuple(specs), **strings)


def write(model_dir: str, declarations: Declarations) -> str:
    """Writes ``<model_dir>/metric_specs.json`` atomically; returns its path."""
    from tfgpu.runtime.fileio import atomic_write_bytes

    path = run_dir.metric_specs(model_dir)
    atomic_write_bytes(path, json.dumps(to_json(declarations), indent=2).encode())
    return path


def read(model_dir: str):
    """The Declarations in ``<model_dir>/metric_specs.json``, or None when it is missing or not JSON (a run
    from before the file existed)."""
    from tfgpu.runtime import fileio

    try:
        return from_json(json.loads(fileio.read_bytes(run_dir.metric_specs(model_dir))))
    except (OSError, ValueError):
        return None


def counting_skips(declarations: Declarations, train_names, task) -> tuple:
    """The train-step keys of ``task`` that count skipped steps; a ValueError for a key the task does not declare."""
    declared = {s.name: s for s in declarations.metrics if s.kind == "train"}
    missing = [name for name in train_names if name not in declared]
    if missing:
        raise ValueError(f"task {task.name!r} returns train metrics {', '.join(missing)} that "
                         f"{type(task).__name__}.metrics does not declare")
    return tuple(name for name in train_names if declared[name].counts_nonfinite)
