"""Where a run's Config comes from, and the checks of what its values name.

``tfgpu.config`` holds and checks values and imports nothing from tfgpu; this module reads its sources (field
defaults < a YAML file on any fileio scheme < flagfile and command line), writes the effective config.yaml, and
checks the files, models, user code and --target metric the values name (``check_references``), the step that
imports the model registry and with it Keras and TensorFlow.
"""
import yaml

from tfgpu import durations
from tfgpu.config import Config, ConfigError, coerce


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
    from tfgpu.models import user  # a relative path/to/file.py:FUNCTION is saved absolute, to load from anywhere

    for name in user.FLAGS:
        if name in values:
            values[name] = user.absolute(values[name])
    config = durations.check(Config(**values).check_values())
    return check_references(config) if references else config


def check_references(config: Config) -> Config:
    """Checks what the values name: file system schemes, the --target metric's form, the model (a user's
    MODULE:FUNCTION is imported) and GAN builders. Imports TensorFlow; raises ConfigError naming the flag."""
    from tfgpu.runtime import fileio  # a scheme the installed TensorFlow lacks fails here, in one line

    fileio.check_schemes({f: getattr(config, f) for f in ("model_dir", "data_dir", "data_cache_dir")})
    if config.target:  # the metric is checked against the task's declarations when the trainer is built
        from tfgpu.training import target

        target.parse(config.target)
    from tfgpu.models.registry import get_spec  # cheap: no TensorFlow work
    try:
        get_spec(config.model)  # a user's MODULE:FUNCTION is imported here (tfgpu.models.user)
    except ConfigError:
        raise
    except ValueError as e:
        raise ConfigError("model", str(e)) from None
    for flag in ("generator", "discriminator"):
        if getattr(config, flag):
            if config.task != "gan":
                raise ConfigError(flag, f"is for --task=gan; this run is --task={config.task}")
            from tfgpu.models import user

            user.load(getattr(config, flag), flag)
    return config


def save_yaml(config: Config, path: str) -> None:
    """Writes the effective config so ``--config=<model_dir>/config.yaml`` repeats the run."""
    from tfgpu.runtime.fileio import atomic_write_bytes

    text = "# Effective tfgpu config; rerun with --config=<this file>.\n" + yaml.safe_dump(
        config.to_dict(), sort_keys=False)
    atomic_write_bytes(path, text.encode())
