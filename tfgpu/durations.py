"""Durations like big_vision's: a length of training given in optimizer steps, epochs or examples, turned into
steps in one place.

A duration flag (--train, --warmup, --eval_every, --checkpoint_every, and each point of --lr_decay_at) takes
``N`` or ``Nsteps`` (steps), ``Nep``/``Nepochs`` or ``Nex``/``Nexamples``; --checkpoint_every also a time,
``Ns``, ``Nmin`` or ``Nh`` (``seconds``; the trainer saves at the first loop end after it). Left empty, the older flags that spell the
same duration in one unit (--train_steps, else --epochs; --warmup_steps, else --warmup_epochs; ...) keep their
meaning. Parsing is pure Python, so a bad value is one line before TensorFlow is imported.
"""
import dataclasses
import math
import re

from tfgpu.config import Config, ConfigError

STEPS, EPOCHS, EXAMPLES, SECONDS = "steps", "epochs", "examples", "seconds"
UNITS = {"": STEPS, "steps": STEPS, "ep": EPOCHS, "epochs": EPOCHS, "ex": EXAMPLES, "examples": EXAMPLES,
         "s": SECONDS, "sec": SECONDS, "min": SECONDS, "h": SECONDS}
SECONDS_PER = {"s": 1.0, "sec": 1.0, "min": 60.0, "h": 3600.0}
# The flags whose duration may be a time: a checkpoint interval bounds the work a lost worker costs in seconds;
# a length of training or a schedule's points must be the same steps on every rerun, so they stay in steps.
TIMED_FLAGS = ("checkpoint_every",)

# Each duration flag and the older flags that give it in one unit, in the order they win (a flag counts when > 0).
OLDER_FLAGS = {
    "train": (("train_steps", STEPS), ("epochs", EPOCHS)),
    "warmup": (("warmup_steps", STEPS), ("warmup_epochs", EPOCHS)),
    "eval_every": (("eval_every_steps", STEPS),),
    "checkpoint_every": (("checkpoint_every_steps", STEPS),),
    "lr_decay_at": (("lr_decay_epochs", EPOCHS),),
}
_FORM = re.compile(r"^(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)$")
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Config)}


@dataclasses.dataclass(frozen=True)
class Duration:
    amount: float
    unit: str  # steps | epochs | examples

    def __str__(self):
        return f"{self.amount:g}{'' if self.unit == STEPS else ' ' + self.unit}"


def parse(text: str, flag: str) -> Duration:
    """``N``/``Nsteps``, ``Nep``/``Nepochs`` or ``Nex``/``Nexamples`` (and for TIMED_FLAGS ``Ns``/``Nmin``/``Nh``, kept
    in seconds); ConfigError(flag) for anything else."""
    match = _FORM.match(text.strip().lower())
    unit = UNITS.get(match.group(2)) if match else None
    if unit is None:
        timed = " or a time (Ns, Nmin, Nh)" if flag in TIMED_FLAGS else ""
        raise ConfigError(flag, f"{text!r} is not a duration: N or Nsteps (optimizer steps), Nep (epochs), Nex "
                          f"(examples){timed}, e.g. 500, 2ep, 50000ex")
    amount = float(match.group(1))
    if unit == SECONDS:
        if flag not in TIMED_FLAGS:
            raise ConfigError(flag, f"{text!r} is a time; only --{', --'.join(TIMED_FLAGS)} takes one (Ns, Nmin, Nh): "
                              "give N steps, Nep or Nex")
        amount *= SECONDS_PER[match.group(2)]
        if amount <= 0:
            raise ConfigError(flag, f"{text!r}: a time must be positive")
    if unit == STEPS and not amount.is_integer():
        raise ConfigError(flag, f"{text!r}: steps are whole numbers (use Nep for a fraction of an epoch)")
    return Duration(amount, unit)


def parse_points(text: str, flag: str) -> tuple:
    """A comma-separated list of durations (e.g. ``30ep,60ep``)."""
    return tuple(parse(part, flag) for part in text.split(",") if part.strip())


def of(options, name: str) -> Duration:
    """The duration ``--name`` gives, else the first of its older flags that is > 0, else 0 steps. ``options`` is
    the Config or the section that holds these flags."""
    if getattr(options, name):
        return parse(getattr(options, name), name)
    for flag, unit in OLDER_FLAGS[name]:
        if getattr(options, flag):
            return Duration(float(getattr(options, flag)), unit)
    return Duration(0.0, STEPS)


def points(options, name: str) -> tuple:
    """The durations a list flag (--lr_decay_at) gives, else its older flag's values in that flag's unit."""
    if getattr(options, name):
        return parse_points(getattr(options, name), name)
    (flag, unit), = OLDER_FLAGS[name]
    return tuple(Duration(float(v), unit) for v in getattr(options, flag))


def to_steps(duration: Duration, steps_per_epoch: float, examples_per_step: int, round_up: bool = False) -> int:
    """Optimizer steps in ``duration``: epochs and examples are rounded to the nearest step, or up with
    ``round_up`` (a training length then covers its last partial epoch); a positive duration is at least one step
    (an interval of a few examples must not become 0, which means "at the end only")."""
    if duration.unit == SECONDS:
        raise ValueError(f"{duration} is a time, not a number of steps (durations.seconds gives it)")
    if duration.unit == STEPS:
        return int(duration.amount)
    steps = duration.amount * steps_per_epoch if duration.unit == EPOCHS else duration.amount / examples_per_step
    steps = math.ceil(steps) if round_up else int(round(steps))
    return max(steps, 1) if duration.amount > 0 else 0


def train_steps(duration: Duration, steps_per_epoch: float, examples_per_step: int, resumed=None) -> int:
    """--train in optimizer steps, covering a last partial epoch. ``resumed``: (step, examples trained by it) of the
    checkpoint a run resumes, from its data position; a length in epochs or examples then counts what earlier
    segments trained (at their own global batch, which --allow_config_change=global_batch_size may have changed)
    and the steps left at this run's batch. A length already trained gives the resumed step."""
    if resumed is None or duration.unit == STEPS:
        return max(1, to_steps(duration, steps_per_epoch, examples_per_step, round_up=True))
    step, examples_done = resumed
    target = duration.amount * steps_per_epoch * examples_per_step if duration.unit == EPOCHS else duration.amount
    # rounded before the ceiling: 3 epochs of 4,096 records at batch 5 is 12288.000000000002 examples in floats,
    # which would ask for one step more than the records need
    return max(1, step + max(0, math.ceil(round((target - examples_done) / examples_per_step, 9))))


def _examples(duration: Duration, steps_per_epoch: float, examples_per_step: int) -> float:
    """The examples in a duration in epochs or examples (an epoch: ``steps_per_epoch`` steps of this run's batch)."""
    return duration.amount * steps_per_epoch * examples_per_step if duration.unit == EPOCHS else duration.amount


def step_at(duration: Duration, steps_per_epoch: float, examples_per_step: int, resumed=None,
            round_up: bool = False) -> int:
    """The step at which a point of training given as a duration is reached (where --warmup ends, an --lr_decay_at
    point, an evaluation every N epochs): to the nearest step, or the first step at or after it with ``round_up``.
    ``resumed``: as ``train_steps`` takes it; a point in epochs or examples then counts the examples earlier
    segments trained at their own global batch (--allow_config_change=global_batch_size): a point ahead of the
    resumed step at this run's batch, one behind it at the earlier segments' mean batch. Without a batch change
    it is the uninterrupted run's step. A positive point is at least step 1."""
    if resumed is None or duration.unit == STEPS or not resumed[1]:
        if not round_up or duration.unit == STEPS:
            return to_steps(duration, steps_per_epoch, examples_per_step)
        steps = duration.amount * steps_per_epoch if duration.unit == EPOCHS else duration.amount / examples_per_step
    else:
        step, examples_done = resumed
        wanted = _examples(duration, steps_per_epoch, examples_per_step)
        steps = (step + (wanted - examples_done) / examples_per_step if wanted >= examples_done
                 else wanted * step / examples_done)
    steps = round(steps, 9)  # float noise must not move a point that falls on a step by one
    steps = math.ceil(steps) if round_up else int(round(steps))
    return max(steps, 1) if duration.amount > 0 else 0


def every(duration: Duration, total_steps: int, steps_per_epoch: float, examples_per_step: int, resumed=None,
          round_up: bool = False) -> set:
    """The steps before ``total_steps`` at which each multiple of an interval falls (--eval_every; a --target's
    epoch ends, with ``round_up``), each placed by ``step_at``: after a batch change an evaluation every epoch
    still falls where each epoch's records end, not every (new) epoch's steps counted from step 0. An interval
    in steps, or one shorter than a step, is a plain interval of steps."""
    if duration.amount <= 0:
        return set()
    batches = [examples_per_step] + ([resumed[1] / resumed[0]] if resumed and resumed[0] and resumed[1] else [])
    if duration.unit == STEPS or _examples(duration, steps_per_epoch, examples_per_step) <= min(batches):
        interval = max(1, to_steps(duration, steps_per_epoch, examples_per_step))
        return set(range(interval, total_steps, interval))
    steps, k = set(), 1
    while True:
        step = step_at(Duration(k * duration.amount, duration.unit), steps_per_epoch, examples_per_step, resumed,
                       round_up)
        if step >= total_steps:
            return steps
        steps.add(step)
        k += 1


def epochs_at(step: int, steps_per_epoch: float, examples_per_step: int, resumed=None) -> float:
    """Epochs trained by ``step``: the examples of the resumed checkpoint (``resumed``: as ``train_steps`` takes it),
    then this run's steps at its own batch, over the epoch's examples; without one, ``step / steps_per_epoch``."""
    if resumed is None:
        return step / steps_per_epoch
    start, examples_done = resumed
    return (examples_done + (step - start) * examples_per_step) / (steps_per_epoch * examples_per_step)


def seconds(duration: Duration) -> float:
    """The seconds of a time duration; 0.0 for one in steps, epochs or examples."""
    return duration.amount if duration.unit == SECONDS else 0.0


def check(config: Config) -> Config:
    """Each duration flag parses, and is not given together with an older flag that spells it (which one would
    win is not obvious); ConfigError naming the flag. Costs microseconds, imports nothing heavy."""
    for name, older in OLDER_FLAGS.items():
        if not getattr(config, name):
            continue
        given = parse_points(getattr(config, name), name) if name == "lr_decay_at" else (of(config, name),)
        if name == "train" and given[0].amount <= 0:
            raise ConfigError(name, f"must be positive, got {getattr(config, name)!r}")
        for flag, _ in older:
            if getattr(config, flag) != _DEFAULTS[flag]:
                raise ConfigError(name, f"and --{flag} both say the same thing; set one of them (--{flag} is the "
                                  "older spelling)")
    return config
