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
import logging
import math
import time

from tfgpu.config import ConfigError
from tfgpu.metrics import results

log = logging.getLogger("tfgpu")

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
    from tfgpu.metrics.metric_specs import LOOP_METRICS

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
    from tfgpu.metrics.metric_specs import Declarations

    shown = Target(metric, value, lower_is_better(metric, declarations or Declarations())).describe()
    if outcome.reached:
        where = f"reached at step {outcome.step}"
        if is_number(outcome.epochs):
            where += f" ({outcome.epochs:g} epochs)"
        return f"target {shown} {where}" + (f" in {outcome.seconds:.1f} s" if is_number(outcome.seconds) else "")
    steps = result.step
    line = f"target {shown} not reached" + (f" in {steps} steps" if isinstance(steps, int) else "")
    return line + (f" (best {best:.4g})" if is_number(best) else "")


class Tracker:
    """--target and owed evaluations in a run: whether an evaluation reaches the target (and when it first did),
    the best value so far, and what a resumed run evaluates before it trains on. ``target``: the resolved
    ``Target`` or None; ``started_at``: when time_to_target_s counts from; ``chief``, ``model_dir``, ``history``:
    whose metrics.json and history.jsonl decide for every worker; ``any_worker(flag)``: a vote all workers take
    alike; ``epochs_at(step)``: the epochs trained by ``step``. Reads the time only (no TensorFlow here)."""

    def __init__(self, target, started_at: float, chief: bool, model_dir: str, history, any_worker, epochs_at):
        self.target = target
        self.started_at = started_at
        self.chief = chief
        self.model_dir = model_dir
        self.history = history
        self.any_worker = any_worker
        self.epochs_at = epochs_at
        self.hit = None  # step, epochs and seconds of the evaluation that reached the target
        self.best = None  # the best value of the target's metric evaluated so far
        self.resumed_eval = {}  # the evaluation of a checkpoint resumed from that already reaches the target

    def reaches(self, step: int, metrics: dict, progress=None, timed: bool = True) -> bool:
        """Whether the evaluation ``metrics`` at ``step`` reaches --target, decided together by all workers
        (a GAN scores FID on the chief alone, so the others have no value to compare); records when it did, with
        the time from this process's start unless the evaluation is not ``timed`` (it reran one of an earlier
        process, whose time is unknown)."""
        if self.target is None or self.hit is not None:
            return False
        value = metrics.get(self.target.metric)
        self.best = self.target.better(value, self.best)
        if progress is not None:
            progress.set_best(self.best)
        if not self.any_worker(self.target.reached(value)):
            return False
        self.hit = {"step": step, "seconds": time.time() - self.started_at if timed else None,
                    "epochs": self.epochs_at(step)}
        return True

    def resume(self, step: int, evaluate, at_evaluation: bool, startup=None) -> bool:
        """What a run resumed at ``step`` owes before it trains on; returns True when it trains no further.
        ``evaluate(step, record=)``: the run's evaluation; ``at_evaluation``: ``step`` is one the run evaluates at
        before its last; ``startup``: the startup timer, which marks an owed evaluation as its own phase.

        A target metrics.json records as reached at this step keeps its time, step and epochs: the checkpoint
        is evaluated for the final metrics but not recorded again. An evaluation step whose record is missing
        from history.jsonl (a preemption saved the checkpoint before it ran) is evaluated and recorded now, as
        an uninterrupted run would have; with a target, a recorded one is evaluated again (not recorded) to see
        whether it reached the target."""
        recorded = self._recorded(step)
        if recorded is not None:
            self.hit = recorded
            self.resumed_eval = evaluate(step, record=False)
            self.best = self.target.better(self.resumed_eval.get(self.target.metric), None)
            log.info("target %s already reached at step %d (the checkpoint resumed from): not training further",
                     self.target.describe(), step)
            return True
        if not at_evaluation:
            return False
        owed = self.owes_evaluation(step)
        if not owed and self.target is None:
            return False
        if owed:
            log.info("evaluating step %d first: the run that saved its checkpoint stopped before evaluating it", step)
        self.resumed_eval = evaluate(step, record=owed)
        if owed and startup:
            startup.mark("owed_evaluation")  # its own phase of the startup record, not the first loop's
        return self.reaches(step, self.resumed_eval, timed=owed)

    def owes_evaluation(self, step: int) -> bool:
        """Whether history.jsonl lacks the evaluation of ``step``; the chief's record decides for every worker."""
        return self.any_worker(self.chief and step not in self.history.steps("eval"))

    def _recorded(self, step: int) -> dict | None:
        """The target's hit (step, epochs, seconds) as metrics.json records it, when it records this --target as
        reached at ``step``; the chief's file decides for every worker. A metrics.json that does not read
        records nothing (said in the log): the evaluation of the checkpoint then decides."""
        if self.target is None:
            return None
        outcome = None
        if self.chief:
            try:
                before = results.read(self.model_dir)
            except ConfigError as e:
                log.warning("%s: whether the target was reached is decided by evaluating the checkpoint", e.reason)
                before = None
            outcome = before.target if before is not None else None
        reached = (outcome is not None and outcome.target == str(self.target) and outcome.reached
                   and outcome.step == step)
        if not self.any_worker(reached):
            return None
        return {"step": step, "seconds": outcome.seconds if outcome else None,
                "epochs": outcome.epochs if outcome else None}

    def outcome(self):
        """What metrics.json records of the target (None without one)."""
        return results.TargetOutcome.of(self.target, self.hit) if self.target else None
