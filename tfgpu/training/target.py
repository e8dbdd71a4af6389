"""``--target=METRIC:VALUE``: which evaluation metric a run trains to, how it compares, and what the run says.

A target names an eval metric the task declares (``Task.metrics``, kind ``eval``), with or without the eval
prefix ``val_`` (``accuracy`` means ``val_accuracy`` when the task evaluates no ``accuracy`` of its own). The
declaration decides the direction: lower-is-better metrics must fall to VALUE (``<=``), others rise to it
(``>=``); a metric declared neither way is lower-is-better when its name ends in ``loss``, ``fid`` or ``kid``.
The trainer stops at the first evaluation that reaches it; ``metrics.json`` records the outcome
(``results.TargetOutcome``), and the console and the report say it in one line (``sentence``).

No TensorFlow here: ``config_sources.check_references`` parses with it and the report reads it in a light process.
"""
import dataclasses
import math

from tfgpu.config import ConfigError

LOWER_IS_BETTER_SUFFIXES = ("loss", "fid", "kid")
EVAL_PREFIX = "val_"


@dataclasses.dataclass(frozen=True)
class Target:
    """A resolved target: the eval metric's key in the evaluation's results, the value, and the direction."""
    metric: str
    value: float
    lower_is_better: bool

    @property
    def op(self) -> str:
        return "<=" if self.lower_is_better else ">="

    def reached(self, value) -> bool:
        """Whether an evaluation's value of the metric reaches the target (a missing or non-finite one never)."""
        if not is_number(value):
            return False
        return value <= self.value if self.lower_is_better else value >= self.value

    def better(self, value, best):
        """The better of ``value`` and ``best`` (either may be None or non-finite)."""
        if not is_number(value):
            return best
        if not is_number(best):
            return value
        return min(value, best) if self.lower_is_better else max(value, best)

    def __str__(self) -> str:
        """The flag's own syntax with the resolved metric, as metrics.json records it."""
        return f"{self.metric}:{self.value:g}"

    def describe(self) -> str:
        return f"{self.metric} {self.op} {self.value:g}"


def is_number(value) -> bool:
    """A finite int or float (not a bool): what a metric value or a recorded time must be."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def parse(text: str) -> tuple:
    """(METRIC, VALUE) of ``--target``'s text; ConfigError(target) when it is not METRIC:VALUE with a finite
    number."""
    metric, colon, value = text.strip().rpartition(":")
    metric = metric.strip()
    try:
        number = float(value)
    except ValueError:
        number = None
    if not colon or not metric or number is None or not math.isfinite(number):
        raise ConfigError("target", f"expected METRIC:VALUE with a number (e.g. val_accuracy:0.97, fid:20), "
                          f"got {text!r}")
    return metric, number


def eval_metrics(declarations) -> list:
    """Names of the task's eval metrics a target can name: numbers the task declares for its evaluations (not
    images, example counts or the loop's evaluation time)."""
    from tfgpu.training.metric_specs import LOOP_METRICS

    loop = {s.name for s in LOOP_METRICS}
    return [s.name for s in declarations.metrics
            if s.kind == "eval" and s.style != "image" and not s.counts_examples and s.name not in loop]


def lower_is_better(name: str, declarations) -> bool:
    """The direction of metric ``name``: its declaration when it has one, else the name's suffix."""
    spec = next((s for s in declarations.metrics if s.name == name), None)
    if spec is not None and spec.lower_is_better is not None:
        return spec.lower_is_better
    return name.lower().endswith(LOWER_IS_BETTER_SUFFIXES)


def resolve(text: str, declarations) -> Target:
    """The Target ``text`` names among the task's declared eval metrics; ConfigError(target) listing them
    when it names none."""
    metric, value = parse(text)
    metric = named_metric(metric, eval_metrics(declarations))
    return Target(metric, value, lower_is_better(metric, declarations))


def named_metric(metric: str, known) -> str:
    """``metric`` among the task's eval metrics ``known`` (``val_`` may be left out); ConfigError(target) listing
    them when it names none."""
    if metric not in known and EVAL_PREFIX + metric in known:
        metric = EVAL_PREFIX + metric
    if metric not in known:
        raise ConfigError("target", f"{metric!r} is not an eval metric of this task; it evaluates "
                          f"{', '.join(known) or 'no metric a target can name'}")
    return metric


def sentence(result, declarations=None, best=None) -> str:
    """One line on the target from a run's ``results.RunResult`` (``declarations`` give the direction; without them
    the name's suffix does); "" when the run had no target. ``best``: the best value evaluated, for a target not
    reached."""
    outcome = result.target if result is not None else None
    if outcome is None or not outcome.target:
        return ""
    try:
        metric, value = parse(outcome.target)
    except ConfigError:
        return f"target {outcome.target}: unreadable"
    from tfgpu.training.metric_specs import Declarations

    shown = Target(metric, value, lower_is_better(metric, declarations or Declarations())).describe()
    if outcome.reached:
        where = f"reached at step {outcome.step}"
        if is_number(outcome.epochs):
            where += f" ({outcome.epochs:g} epochs)"
        return f"target {shown} {where}" + (f" in {outcome.seconds:.1f} s" if is_number(outcome.seconds) else "")
    steps = result.step
    line = f"target {shown} not reached" + (f" in {steps} steps" if isinstance(steps, int) else "")
    return line + (f" (best {best:.4g})" if is_number(best) else "")
