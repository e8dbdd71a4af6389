"""Where a run's Config comes from, and the checks of what its values name.

``tfgpu.config`` holds and checks values and imports nothing from tfgpu; this module reads its sources (field
defaults < a YAML file on any fileio scheme < flagfile and command line), writes the effective config.yaml, and
checks the files, models, user code and --target metric the values name (``check_references``), the step that
imports the model registry and with it Keras and TensorFlow. Options are flat everywhere a user sees them (flags,
config.yaml); ``build`` puts a task's own options (``tasks/options.py``) into the run's section.
"""
import dataclasses
import functools
import typing

import yaml

from tfgpu import config as config_lib
from tfgpu import durations
from tfgpu.config import Config, ConfigError
from tfgpu.tasks import options as task_options


@dataclasses.dataclass(frozen=True)
class Option:
    """One flat option: its field (default, help, group, choices), its type, and the task it is for ("" = all)."""
    field: dataclasses.Field
    kind: type
    task: str


@functools.cache
def options() -> dict:
    """Every option by flat name: the shared ones (``Config``), then each task's section (``tasks/options.py``)."""
    found = {f.name: Option(f, config_lib.field_type(f), "") for f in config_lib.fields()}
    for task, section in task_options.SECTIONS.items():
        hints = typing.get_type_hints(section)
        found.update({f.name: Option(f, hints[f.name], task) for f in dataclasses.fields(section)})
    return found


def coerce(name: str, value):
    """Converts a YAML/flag value to option ``name``'s type; ConfigError naming an unknown option or a mismatch."""
    known = options()
    if name not in known:
        close = [n for n in known if n.split("_")[0] == name.split("_")[0]]
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise ConfigError(name, f"unknown option{hint}")
    return config_lib.coerce_to(name, known[name].kind, value)


def _other_task(name: str, task: str) -> ConfigError:
    return ConfigError(name, f"is for --task={options()[name].task}; this run is --task={task}")


def build(**values) -> Config:
    """An unchecked Config from flat option values (as flags and config.yaml name them): the shared ones as its
    fields, the run's task's own into its section (``task_options``). An option of another task is
    ConfigError naming it and the task it is for. Tests build a GAN config this way:
    ``build(task="gan", n_critic=2, ...)``."""
    task = values.get("task", Config.task)
    shared, own = {}, {}
    for name, value in values.items():
        if name not in options():
            coerce(name, value)  # raises: unknown option, with the close names
        owner = options()[name].task
        if owner and owner != task:
            raise _other_task(name, task)
        (own if owner else shared)[name] = value
    section = task_options.SECTIONS.get(task)
    return Config(**shared, task_options=section(**own) if section else None)


def load_yaml(path: str) -> dict:
    """The option: value mapping of a YAML config file; ConfigError(config) naming the file when it is missing,
    unreadable, not YAML or not a mapping of option names."""
    from tfgpu.runtime import fileio  # a run's config.yaml may be on gs://, ram://

    if not fileio.exists(path):
        raise ConfigError("config", f"file {path!r} does not exist")
    try:
        data = yaml.safe_load(fileio.read_text(path))
    except OSError as e:
        raise ConfigError("config", f"cannot read {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ConfigError("config", f"{path} is not a UTF-8 text file") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or type(e).__name__
        raise ConfigError("config", f"{path} is not valid YAML: {problem}{where}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError("config", f"{path} must hold a mapping of option: value, got {type(data).__name__}")
    for name in data:
        if not isinstance(name, str):
            raise ConfigError("config", f"{path}: option names must be strings, got {name!r}")
    return data


def resolve(explicit: dict, yaml_path: str = "", references: bool = True) -> Config:
    """Builds the checked Config: defaults < YAML < ``explicit`` (flagfile + command line). ``references``
    False checks the values alone (``Config.check_values`` and ``durations.check``: no TensorFlow); call
    ``check_references`` after."""
    values = {}
    if yaml_path:
        for name, value in load_yaml(yaml_path).items():
            try:
                values[name] = coerce(name, value)
            except ConfigError as e:
                raise ConfigError("config", f"{yaml_path}: {name}: {e.reason}") from None
    for name, value in explicit.items():
        values[name] = coerce(name, value)
    if yaml_path:
        _drop_other_tasks_defaults(values, explicit, yaml_path)
    from tfgpu.models import user  # a relative path/to/file.py:FUNCTION is saved absolute, to load from anywhere

    for name in user.FLAGS:
        if name in values:
            values[name] = user.absolute(values[name])
    config = durations.check(build(**values).check_values())
    return check_references(config) if references else config


def _drop_other_tasks_defaults(values: dict, explicit: dict, yaml_path: str) -> None:
    """Removes the YAML's options of another task that hold their defaults (a config.yaml written before tasks had
    sections records every option); one set to anything else is ConfigError naming the file and the option."""
    task = values.get("task", Config.task)
    for name in [n for n in values if n not in explicit and options()[n].task not in ("", task)]:
        if values[name] != options()[name].field.default:
            raise ConfigError("config", f"{yaml_path}: {name}: {_other_task(name, task).reason}")
        del values[name]


def check_names(config: Config) -> Config:
    """What the values name, as far as it is known without TensorFlow (milliseconds, so a typo is one line in well
    under a second): registered model names (``models.names``; MODULE:FUNCTION builders are imported later), the
    file of a file.py:FUNCTION builder, a local --data_dir, --dataset, and --target's form and metric
    (``tasks.eval_metrics``). ``check_references`` checks the rest once TensorFlow is imported. ConfigError naming
    the flag."""
    import os

    from tfgpu.models import names, user

    named = config.options()
    for flag in user.FLAGS:
        reference = named.get(flag, "")
        if not reference or reference in names.known():
            continue
        if not user.is_reference(reference):
            raise ConfigError(flag, f"unknown model {reference!r}; known models: {', '.join(names.known())}; or your "
                              "own builder as MODULE:FUNCTION or path/to/file.py:FUNCTION")
        target = reference.rpartition(":")[0]
        if target.endswith(".py") and "://" not in target and not os.path.isfile(target):
            raise ConfigError(flag, f"file {os.path.abspath(target)!r} does not exist")
    data_dir = config.data_dir
    if data_dir and "://" not in data_dir:
        directory = os.path.dirname(data_dir) if any(c in data_dir for c in "*?[") else data_dir
        if not os.path.isdir(directory):
            raise ConfigError("data_dir", f"{directory!r} does not exist (a directory tfgpu.convert wrote, with its "
                              "dataset.json)")
    elif not data_dir and config.dataset != "synthetic" and not config.dataset.startswith("tfds:"):
        from tfgpu.data.sources import builtin  # numpy only

        if config.dataset not in builtin.BUILTIN:
            raise ConfigError("dataset", f"unknown dataset {config.dataset!r}; use one of "
                              f"{', '.join(builtin.BUILTIN + ('synthetic',))}, tfds:NAME, or --data_dir")
    if config.target:
        from tfgpu.tasks.eval_metrics import EVAL_METRICS
        from tfgpu.metrics import target

        metric, _ = target.parse(config.target)
        if config.task in EVAL_METRICS:
            target.named_metric(metric, EVAL_METRICS[config.task])
    return config


def check_references(config: Config) -> Config:
    """Checks what the values name: file system schemes, the --target metric's form, the model (a user's
    MODULE:FUNCTION is imported) and GAN builders. Imports TensorFlow; raises ConfigError naming the flag."""
    from tfgpu.runtime import fileio  # a scheme the installed TensorFlow lacks fails here, in one line

    fileio.check_schemes({f: getattr(config, f) for f in ("model_dir", "data_dir", "data_cache_dir")})
    if config.target:  # the metric is checked against the task's declarations when the trainer is built
        from tfgpu.metrics import target

        target.parse(config.target)
    from tfgpu.models.registry import get_spec  # cheap: no TensorFlow work
    try:
        get_spec(config.model)  # a user's MODULE:FUNCTION is imported here (tfgpu.models.user)
    except ConfigError:
        raise
    except ValueError as e:
        raise ConfigError("model", str(e)) from None
    from tfgpu.models import user

    named = config.options()
    for flag in user.FLAGS:
        if flag != "model" and named.get(flag):  # a task's own builders (the GAN's --generator, --discriminator)
            user.load(named[flag], flag)
    return config


def save_yaml(config: Config, path: str) -> None:
    """Writes the effective config so ``--config=<model_dir>/config.yaml`` repeats the run."""
    from tfgpu.runtime.fileio import atomic_write_bytes

    text = "# Effective tfgpu config; rerun with --config=<this file>.\n" + yaml.safe_dump(
        config.to_dict(), sort_keys=False)
    atomic_write_bytes(path, text.encode())
