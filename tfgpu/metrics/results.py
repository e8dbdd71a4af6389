"""The run's results, ``metrics.json``: the one owner of its keys, of writing it and of reading it.

The trainer builds a ``RunResult`` at the end of a run (the task adds its own through
``Task.extend_result``), ``experiment.run`` adds what the run ran on, and the chief ``write``s it. Resume
(whether --target was already reached), the report, the GAN's FID (a feature classifier's record), ``plan`` and
the tools ``read`` it. The keys and what each means are ``KEYS`` below, the one place they are named: renaming
a key is an edit of this file (``tests/metrics/test_results.py`` renames every key here and checks that each
reader answers the same, and that no other module names the file).

On disk metrics.json stays one flat JSON object, so a user's ``json.load(...)["examples_per_sec"]`` keeps
working; ``format_version`` says which layout wrote it. A file without it is from before the field (version 1,
the same keys) and reads the same.

``read`` trusts nothing in the file: it must be a JSON object, its version no newer than this tfgpu's, each key of
``KEYS`` of its type, and every other key (the task's values) a number, a string, a boolean or null. Anything else
stops in one line naming the file (a ``ConfigError`` naming the caller's flag). It costs parsing one small file.
"""
import dataclasses
import json
import math

from tfgpu.config import ConfigError
from tfgpu.runtime import fileio, run_dir

FILE = run_dir.METRICS_FILE
VERSION = 2  # 1: the files written before format_version existed (the same flat keys)


@dataclasses.dataclass(frozen=True)
class TargetOutcome:
    """--target's outcome. ``seconds``: wall time from the process's start to the evaluation that reached it."""
    target: str
    reached: bool
    seconds: float | None = None
    step: int | None = None
    epochs: float | None = None

    @classmethod
    def of(cls, target, hit: dict | None) -> "TargetOutcome":
        """From the resolved ``target`` and its ``hit`` (None, or the ``step``, ``epochs`` and ``seconds`` of the
        evaluation that reached it), rounded as the file records them."""
        hit = hit or {}
        return cls(str(target), bool(hit),
                   round(hit["seconds"], 1) if hit.get("seconds") is not None else None, hit.get("step"),
                   round(hit["epochs"], 2) if hit.get("epochs") is not None else None)


@dataclasses.dataclass(frozen=True)
class RunFacts:
    """What the run was and ran on, as ``experiment.run`` resolved it."""
    task: str | None = None
    model: str | None = None
    precision: str | None = None
    strategy: str | None = None
    num_replicas: int | None = None
    num_workers: int | None = None
    global_batch_size: int | None = None


@dataclasses.dataclass(frozen=True)
class ParameterCounts:
    """The trained model's parameters, as the task counts them (``Task.extend_result``)."""
    total: int | None = None
    trainable: int | None = None
    trainable_before_unfreeze: int | None = None


@dataclasses.dataclass(frozen=True)
class RunResult:
    """One run's results. ``values``: what the task names (its declared train metrics as ``train_<name>``, its
    eval metrics, its state such as learning rates and loss scales, what ``Task.extend_result`` adds such as
    ``model_facts``); the other fields are tfgpu's own (``KEYS``)."""
    step: int | None = None
    examples_per_sec: float | None = None
    values: dict = dataclasses.field(default_factory=dict)
    skipped_records: dict | None = None
    target: TargetOutcome | None = None
    facts: RunFacts | None = None
    parameters: ParameterCounts | None = None
    wall_time_s: float | None = None
    trained: bool | None = None
    untrained_reason: str | None = None
    version: int = VERSION

    def __post_init__(self):
        taken = sorted(set(self.values) & {key.name for key in KEYS})
        if taken:
            raise ValueError(f"the task's values {', '.join(taken)} are named like tfgpu's own keys of {FILE}")

    def to_dict(self) -> dict:
        """metrics.json's object: every field set under its key, ``values`` after the first (the step), a
        section's nullable fields as null (a target not reached says so in each of its keys)."""
        out = {}
        for index, key in enumerate(KEYS):
            value = key.get(self)
            if value is not None or (key.nullable and key.section and getattr(self, key.section) is not None):
                out[key.name] = value
            if index == 0:  # the step leads (the console's "final: step=..." line), then the task's values
                out.update(self.values)
        return out


@dataclasses.dataclass(frozen=True)
class Key:
    """A key of metrics.json: its ``name`` there, the ``section`` of RunResult holding it ("" = RunResult itself)
    and the ``attribute``, the JSON types it may hold (``nullable``: null too) and what it means. ``earlier``:
    the names it had in earlier versions, which files of those versions are read by (a rename adds one here and
    raises VERSION)."""
    name: str
    section: str
    attribute: str
    types: tuple
    meaning: str
    nullable: bool = False
    earlier: tuple = ()

    def get(self, result: RunResult | None):
        holder = getattr(result, self.section) if self.section and result is not None else result
        return None if holder is None else getattr(holder, self.attribute)


_INT, _NUMBER, _STR, _BOOL, _OBJECT = (int,), (int, float), (str,), (bool,), (dict,)

KEYS = (
    Key("step", "", "step", _INT, "the step the run ended at"),
    Key("examples_per_sec", "", "examples_per_sec", _NUMBER,
        "training throughput: the median over the loops after the first (the first traces and compiles)"),
    Key("wall_time_s", "", "wall_time_s", _NUMBER, "seconds from the start of experiment.run to the end of training"),
    Key("skipped_records", "", "skipped_records", _OBJECT,
        "with --skip_corrupt_records: {split: unreadable records read around}"),
    Key("target", "target", "target", _STR, "--target as METRIC:VALUE, the metric resolved (e.g. val_accuracy:0.9)"),
    Key("target_reached", "target", "reached", _BOOL, "whether an evaluation reached --target"),
    Key("time_to_target_s", "target", "seconds", _NUMBER,
        "wall time from the process's start to the evaluation that reached --target; null if not reached", True),
    Key("step_at_target", "target", "step", _INT, "the step of that evaluation; null if not reached", True),
    Key("epochs_at_target", "target", "epochs", _NUMBER, "epochs trained at that evaluation; null if not reached",
        True),
    Key("task", "facts", "task", _STR, "--task"),
    Key("model", "facts", "model", _STR, "--model (for a FID feature classifier: its network's name)"),
    Key("precision", "facts", "precision", _STR, "the precision policy run (--precision=auto resolved)"),
    Key("strategy", "facts", "strategy", _STR, "the distribution strategy (one_device, mirrored, multi_worker)"),
    Key("num_replicas", "facts", "num_replicas", _INT, "replicas over all workers"),
    Key("num_workers", "facts", "num_workers", _INT, "workers (hosts)"),
    Key("global_batch_size", "facts", "global_batch_size", _INT, "--global_batch_size"),
    Key("parameters", "parameters", "total", _INT, "the model's parameters"),
    Key("trainable_parameters", "parameters", "trainable", _INT, "of them trainable at the end of the run"),
    Key("trainable_parameters_before_unfreeze", "parameters", "trainable_before_unfreeze", _INT,
        "with --unfreeze_at_step: trainable before that step"),
    Key("trained", "", "trained", _BOOL, "a FID feature classifier's record only: false when it was exported "
        "untrained (fewer than two classes to learn)", True),
    Key("reason", "", "untrained_reason", _STR, "why it was not trained (with trained: false)", True),
    Key("format_version", "", "version", _INT, f"the layout of this file ({VERSION}); absent in files written "
        "before it existed (version 1, the same keys)"),
)
_SECTIONS = {"target": TargetOutcome, "facts": RunFacts, "parameters": ParameterCounts}
_IN_FIRST_LINES = ("version", "step", "wall_time_s")  # RunResult's own, that the report says in its first lines
_NAMED_APART = ("task", "model")  # RunFacts the report names the run by


def placement_facts(result: RunResult | None) -> list:
    """(key, RunFacts attribute, value or None) of what the run ran on, its task and model aside: the report's
    first line (the attribute names the config option it falls back on, where there is one)."""
    return [(key.name, key.attribute, key.get(result)) for key in KEYS
            if key.section == "facts" and key.attribute not in _NAMED_APART]


def final_metrics(result: RunResult | None) -> dict:
    """The values a report tables as the run's final metrics: the task's and tfgpu's measured ones (throughput,
    parameters, the target's outcome), what the first lines say and what it ran on aside."""
    if result is None:
        return {}
    shown = {key.name for key in KEYS if key.section == "facts" or (not key.section and key.attribute in
                                                                     _IN_FIRST_LINES)}
    return {name: value for name, value in result.to_dict().items() if name not in shown}


def console_values(values: dict) -> dict:
    """The values a command's ``final:`` line prints: the file's, its layout's version aside."""
    version = next(key.name for key in KEYS if key.attribute == "version")
    return {name: value for name, value in values.items() if name != version}


def path(model_dir: str) -> str:
    """Where ``model_dir``'s results are."""
    return run_dir.metrics(model_dir)


def write(model_dir: str, result: RunResult) -> None:
    """Writes ``<model_dir>/metrics.json`` atomically (a reader sees the old file or the whole new one), in this
    version's layout whatever version ``result`` was read from."""
    current = dataclasses.replace(result, version=VERSION)
    fileio.atomic_write_bytes(path(model_dir), json.dumps(current.to_dict(), indent=2, sort_keys=True).encode())


def read(model_dir: str, flag: str = "model_dir") -> RunResult | None:
    """``<model_dir>/metrics.json``, or None when there is none; a file that is not tfgpu's results stops in one
    line naming it (a ConfigError naming ``flag``)."""
    where = path(model_dir)
    try:
        text = fileio.read_bytes(where)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ConfigError(flag, f"{where} cannot be read ({e})") from None
    try:
        content = json.loads(text)
    except ValueError as e:  # UnicodeDecodeError is one
        raise ConfigError(flag, f"{where} is not a tfgpu metrics.json: not JSON ({e})") from None
    return parse(content, where, flag)


def parse(content, where: str = FILE, flag: str = "model_dir") -> RunResult:
    """The RunResult of metrics.json's object ``content`` (version 1 or this one), checked key by key."""
    def bad(message):
        return ConfigError(flag, f"{where} is not a tfgpu metrics.json: {message}")

    if not isinstance(content, dict):
        raise bad(f"it holds a {type(content).__name__}, not an object")
    version_key = next(key for key in KEYS if not key.section and key.attribute == "version")
    version = content.get(version_key.name, 1)
    if not _is(version, _INT) or version < 1:
        raise bad(f"{version_key.name} {version!r} is not a version number")
    if version > VERSION:
        raise ConfigError(flag, f"{where} has {version_key.name} {version}, newer than this tfgpu reads "
                          f"({VERSION}); upgrade tfgpu to read it")
    by_name = {name: key for key in KEYS for name in ((key.name,) + (key.earlier if version < VERSION else ()))}
    own, sections, values = {"version": version}, {name: {} for name in _SECTIONS}, {}
    for name, value in content.items():
        key = by_name.get(name)
        if key is None:
            if not (value is None or isinstance(value, (str, bool, int, float))):
                raise bad(f"{name!r} holds a {type(value).__name__}; a task's value is a number, a string or a "
                          "boolean")
            values[name] = value
        elif key is not version_key:
            if not (_is(value, key.types) or (value is None and (key.nullable or not key.section))):
                raise bad(f"{name!r} is {value!r}, not {_type_name(key.types)}")
            (sections[key.section] if key.section else own)[key.attribute] = value
    for section, fields in sections.items():
        if fields:
            missing = [key.name for key in KEYS if key.section == section and _required(section, key.attribute)
                       and key.attribute not in fields]
            if missing:
                raise bad(f"it has {section} fields without {', '.join(map(repr, missing))}")
    skipped = own.get("skipped_records")
    if skipped is not None and not all(isinstance(k, str) and _is(v, _INT) for k, v in skipped.items()):
        raise bad(f"{next(k.name for k in KEYS if k.attribute == 'skipped_records')!r} is not {{split: count}}")
    built = {name: _SECTIONS[name](**fields) if fields else None for name, fields in sections.items()}
    return RunResult(values=values, **own, **built)


def _required(section: str, attribute: str) -> bool:
    """Whether a section's dataclass needs ``attribute`` (it has no default)."""
    field = next(f for f in dataclasses.fields(_SECTIONS[section]) if f.name == attribute)
    return field.default is dataclasses.MISSING


def _is(value, types: tuple) -> bool:
    """A JSON value of ``types``: a boolean is not a number, and a number of tfgpu's own is finite."""
    if isinstance(value, bool):
        return bool in types
    if isinstance(value, float):
        return float in types and math.isfinite(value)
    return isinstance(value, types)


def _type_name(types: tuple) -> str:
    return {_INT: "an integer", _NUMBER: "a finite number", _STR: "a string", _BOOL: "true or false",
            _OBJECT: "an object"}[types]
