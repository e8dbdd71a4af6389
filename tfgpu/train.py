"""Entrypoint: ``python -m tfgpu.train --flagfile=configs/<job>.flags --model_dir=DIR [--flag=value ...]``.

The only module that reads flags. Every ``Config`` field is a flag of the same
name. Sources, lowest precedence first: field defaults, ``--config`` YAML,
flagfiles, the command line. Flagfiles may nest (a relative path inside a
flagfile is resolved against that file's directory first).
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow is imported anywhere

from absl import flags  # noqa: E402

from tfgpu import logs  # noqa: E402
from tfgpu import config as config_lib  # noqa: E402
from tfgpu.config import ConfigError  # noqa: E402

USAGE = "python -m tfgpu.train --flagfile=configs/<job>.flags --model_dir=DIR [--flag=value ...]"


def define_flags(flag_values: flags.FlagValues) -> None:
    """One absl flag per Config field, grouped by module in --helpfull."""
    flags.DEFINE_string("config", "", "YAML file of option: value pairs (e.g. a run's config.yaml); flagfiles and "
                        "the command line override it.", flag_values=flag_values, module_name="tfgpu.experiment")
    for f in config_lib.fields():
        kind = config_lib.field_type(f)
        help_text = f.metadata["help"]
        if f.metadata.get("choices"):
            help_text += f" One of: {', '.join(str(c) or repr(c) for c in f.metadata['choices'])}."
        kwargs = dict(flag_values=flag_values, module_name=f"tfgpu.{f.metadata['group']}")
        if kind is bool:
            flags.DEFINE_boolean(f.name, f.default, help_text, **kwargs)
        elif kind is int:
            flags.DEFINE_integer(f.name, f.default, help_text, **kwargs)
        elif kind is float:
            flags.DEFINE_float(f.name, f.default, help_text, **kwargs)
        elif kind is tuple:
            flags.DEFINE_list(f.name, [str(v) for v in f.default], help_text, **kwargs)
        else:
            flags.DEFINE_string(f.name, f.default, help_text, **kwargs)


def _read_flagfile(path: str, seen: tuple) -> list:
    """Arguments of a flagfile, nested flagfiles expanded in place."""
    if path in seen:
        raise ConfigError("flagfile", f"{path} includes itself")
    if not os.path.isfile(path):
        raise ConfigError("flagfile", f"file {path!r} does not exist")
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise ConfigError("flagfile", f"cannot read {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ConfigError("flagfile", f"{path} is not a UTF-8 text file") from None
    args = []
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith(("#", "//")):
            continue
        if not line.startswith("-"):
            raise ConfigError("flagfile", f"{path} line {number}: {line[:80]!r} is not a --flag=value line")
        if line.startswith("--flagfile="):
            nested = line.split("=", 1)[1]
            local = os.path.join(os.path.dirname(path), nested)
            args += _read_flagfile(local if os.path.isfile(local) else nested, seen + (path,))
        else:
            args.append(line)
    return args


def expand_flagfiles(argv: list) -> list:
    """Moves every flagfile's contents before the command-line flags, so the command line always wins."""
    from_files, command_line = [], []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("--flagfile", "-flagfile") and i + 1 < len(argv):
            from_files += _read_flagfile(argv[i + 1], ())
            i += 2
            continue
        if arg.startswith(("--flagfile=", "-flagfile=")):
            from_files += _read_flagfile(arg.split("=", 1)[1], ())
        else:
            command_line.append(arg)
        i += 1
    return from_files + command_line


def parse(argv: list) -> config_lib.Config:
    """argv (without the program name) → validated Config; raises ConfigError naming the flag."""
    flag_values = flags.FlagValues()
    define_flags(flag_values)
    args = expand_flagfiles(list(argv))
    try:
        rest = flag_values(["tfgpu.train"] + args, known_only=False)
    except flags.Error as e:
        name = getattr(e, "flag", None) or _flag_in_message(str(e))
        raise ConfigError(name or "flags", str(e).split("\n")[0]) from None
    if len(rest) > 1:
        raise ConfigError(rest[1].lstrip("-").split("=")[0] or "flags", f"unexpected argument {rest[1]!r}")
    explicit = {}
    for name in flag_values:
        if name != "config" and flag_values[name].present and name in {f.name for f in config_lib.fields()}:
            explicit[name] = flag_values[name].value
    return config_lib.resolve(explicit, flag_values["config"].value)


def _flag_in_message(message: str) -> str:
    for token in message.replace("'", " ").replace('"', " ").split():
        if token.startswith("--"):
            return token[2:].split("=")[0]
    return ""


def help_text() -> str:
    flag_values = flags.FlagValues()
    define_flags(flag_values)
    return f"usage: {USAGE}\n\n" + flag_values.get_help(include_special_flags=False)


RESTARTS_ENV = "TFGPU_RESTARTS"
RESTART_DELAY_S = 5.0


def _restart_if_allowed(max_restarts: int, argv: list) -> None:
    """Re-executes this worker (same PID, fresh TensorFlow runtime) to resume from the last checkpoint.

    A failed collective leaves TensorFlow's collective runtime unusable, so the retry replaces the process
    image instead of looping inside it. Returns only when no restart is left."""
    done = int(os.environ.get(RESTARTS_ENV, "0"))
    if done >= max_restarts:
        return
    print(f"restarting this worker ({done + 1} of --max_restarts={max_restarts}) in {RESTART_DELAY_S:.0f} s",
          file=sys.stderr, flush=True)
    import time

    time.sleep(RESTART_DELAY_S)
    os.environ[RESTARTS_ENV] = str(done + 1)
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, "-m", "tfgpu.train", *argv])


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(a in ("--help", "-h", "--helpfull", "-help", "--helpshort") for a in argv):
        print(help_text())
        return 0
    logs.setup()
    try:
        config = parse(argv)
        from tfgpu import cluster

        cluster.resolve_for_run(config.cluster, config.distribution_strategy)  # before TensorFlow is imported
        from tfgpu import experiment, trainer

        try:
            metrics = experiment.run(config)
        except trainer.NonFiniteError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        except trainer.WorkerLost as e:
            print(f"error: {e}", file=sys.stderr)
            _restart_if_allowed(config.max_restarts, argv)
            return trainer.WORKER_LOST_EXIT_CODE
        except trainer.KernelFailed as e:
            print(f"error: {e}", file=sys.stderr)
            return trainer.KERNEL_FAILED_EXIT_CODE
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print("final: " + " ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}"
                               for k, v in metrics.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
