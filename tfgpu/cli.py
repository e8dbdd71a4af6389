"""Command-line parsing for every tfgpu command: one parser class, one error style, one ``--help`` style.

Every command (train, evaluate, export, sample, benchmark, audit_input, launch, convert, doctor, report)
builds a ``cli.ArgumentParser``:

- a bad flag is one line, ``error: --flag: reason`` (a ``ConfigError``), exit 1, before any heavy work;
  flags are never abbreviated, and an unknown flag suggests the close names;
- ``--flagfile=F`` (one ``--flag=value`` per line, ``#`` comments, nested flagfiles resolved next to the
  including file, an include cycle named by its files) is expanded before the command line, so the command
  line always wins;
- ``add_config_flags`` declares ``Config`` fields as flags from ``config.py``'s own metadata (type, help,
  choices, group), so a shared option is declared once: train takes all of them, evaluate/export/sample/
  audit_input take them as overrides of a run's config, benchmark takes the model, data, precision and
  strategy ones. Booleans read ``--flag``, ``--noflag`` and ``--flag=true|false``; lists are comma separated.

Precedence of a Config value: field default < YAML (``--config`` or a run's ``config.yaml``) < flagfiles <
command line. argparse rather than absl because most commands have options that are not Config fields
(``--format``, ``--batch_size=auto``); one library for all keeps errors and help alike.
"""
import argparse
import difflib
import os
import re
import sys

from tfgpu import config as config_lib
from tfgpu import config_sources
from tfgpu.config import ConfigError

__all__ = ["ArgumentParser", "ConfigError", "expand_flagfiles", "resolve", "wants_help"]

HELP_FLAGS = ("-h", "--help", "--helpfull", "--helpshort", "-help")
_FIELDS = {f.name: f for f in config_lib.fields()}
# The recipes that ship with the package: the repository's configs/ (tfgpu/recipes links to it; a wheel holds
# the files themselves).
RECIPES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "recipes")


def recipes() -> dict:
    """Installed recipe name -> its summary: the first sentence of its header comment, cut to one line."""
    found = {}
    for name in sorted(os.listdir(RECIPES_DIR)) if os.path.isdir(RECIPES_DIR) else ():
        if name.endswith(".flags"):
            header = []
            with open(os.path.join(RECIPES_DIR, name), encoding="utf-8") as f:
                for line in f:
                    if not line.startswith("#") or not line.lstrip("#").strip():
                        break
                    header.append(line.lstrip("#").strip())
            sentence = re.split(r"(?<=\.)\s(?=[A-Z(])", " ".join(header), maxsplit=1)[0]
            found[name[:-len(".flags")]] = sentence if len(sentence) <= 100 else sentence[:97].rstrip() + "..."
    return found


def recipe_path(name: str) -> str:
    """The installed recipe ``name``'s flagfile; ConfigError naming --recipe and the recipes there are."""
    known = recipes()
    if name not in known:
        close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ConfigError("recipe", f"unknown recipe {name!r}{hint}; installed: {', '.join(known) or 'none'} "
                          "(--list_recipes says what each trains)")
    return os.path.join(RECIPES_DIR, f"{name}.flags")


def format_recipes() -> str:
    """``--list_recipes``: one line per installed recipe."""
    known = recipes()
    width = max(map(len, known), default=0)
    return "\n".join(f"{name.ljust(width)}  {summary}" for name, summary in known.items()) or "no recipes installed"


def _read_flagfile(path: str, chain: tuple = (), named: str = "") -> list:
    """Arguments of a flagfile, nested flagfiles expanded in place. ``chain`` holds the (real path, path) of the
    files that include this one, outermost first, ``named`` what the including line wrote. Files are compared
    by real path, so ``./a.flags``, ``../dir/a.flags`` and a symlink to it are one file and an include cycle is
    named, not recursed into; a file included twice but not inside itself (a diamond) is read twice."""
    real = os.path.realpath(path)
    for index, (included_real, included) in enumerate(chain):
        if included_real == real:
            through = [os.path.normpath(p) for _, p in chain[index + 1:]] + [os.path.normpath(path)]
            cycle = f" through {' -> '.join(through)}" if len(through) > 1 else f" (--flagfile={named})"
            raise ConfigError("flagfile", f"{included} includes itself{cycle}")
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
            args += _read_flagfile(_nested_path(path, number, nested), chain + ((real, path),), nested)
        elif line.startswith("--recipe="):
            name = line.split("=", 1)[1]
            try:
                args += _read_flagfile(recipe_path(name), chain + ((real, path),), f"recipe {name}")
            except ConfigError as e:
                raise ConfigError(e.flag, f"{path} line {number}: {e.reason}") from None
        else:
            args.append(line)
    return args


def _nested_path(including: str, number: int, nested: str) -> str:
    """Where ``--flagfile=nested`` on line ``number`` of ``including`` points: next to the including file,
    else (as absl reads it) from the working directory; ConfigError naming the line when neither exists."""
    local = os.path.join(os.path.dirname(including), nested)
    if os.path.isfile(local) or os.path.isabs(nested):
        return local
    if os.path.isfile(nested):
        return nested
    raise ConfigError("flagfile", f"{including} line {number}: {nested!r} does not exist (looked next to "
                      f"{including} and in the working directory)")


def expand_flagfiles(argv: list) -> list:
    """Moves every flagfile's (and recipe's) contents before the command-line flags, in the order given, so the
    command line always wins and a later flagfile overrides an earlier recipe."""
    readers = {"flagfile": _read_flagfile, "recipe": lambda name: _read_flagfile(recipe_path(name))}
    from_files, command_line = [], []
    i = 0
    while i < len(argv):
        arg = argv[i]
        name = arg.lstrip("-").split("=", 1)[0] if arg.startswith("-") else ""
        if name not in readers:
            command_line.append(arg)
        elif "=" in arg:
            from_files += readers[name](arg.split("=", 1)[1])
        elif i + 1 >= len(argv):
            raise ConfigError(name, "expects a file: --flagfile=PATH" if name == "flagfile" else
                              "expects a name: --recipe=NAME (--list_recipes shows them)")
        else:
            from_files += readers[name](argv[i + 1])
            i += 1
        i += 1
    return from_files + command_line


def _error_from_argparse(message: str) -> ConfigError:
    """argparse's message → ConfigError naming the flag: 'argument --x: invalid int value' → '--x: invalid ...'."""
    named = re.match(r"argument (-{1,2}[\w-]+)(?:/\S+)?: (.*)", message, re.S)
    if named:
        return ConfigError(named.group(1).lstrip("-"), named.group(2))
    required = re.match(r"the following arguments are required: (-{1,2}[\w-]+)", message)
    if required:
        return ConfigError(required.group(1).lstrip("-"), "is required")
    flag = re.search(r"--?(\w+)", message)
    return ConfigError(flag.group(1) if flag else "flags", message)


def _format_default(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    return str(value)


class _ConfigFlag(argparse.Action):
    """Stores a Config field's value, coerced to the field's type, in ``namespace.config_flags``."""

    def __call__(self, parser, namespace, values, option_string=None):
        if option_string and option_string.startswith("--no") and option_string[4:] == self.dest:
            if values is not None:
                raise ConfigError(self.dest, f"{option_string} takes no value; use --{self.dest}={values}")
            value = False
        else:
            value = config_lib.coerce(self.dest, "true" if values is None else values)
        choices = _FIELDS[self.dest].metadata.get("choices")
        if choices and value not in choices:
            raise ConfigError(self.dest, f"{value!r} is not one of {', '.join(map(str, choices))}")
        namespace.config_flags[self.dest] = value


class _ListRecipes(argparse.Action):
    """``--list_recipes``: prints them and exits 0, as ``--help`` does."""

    def __call__(self, parser, namespace, values, option_string=None):
        print(format_recipes())
        parser.exit(0)


class _HelpFormatter(argparse.HelpFormatter):
    """Help lines with the default where there is one; booleans as ``--[no]name[=BOOL]``."""

    def __init__(self, prog):
        super().__init__(prog, max_help_position=36, width=min(120, max(80, _terminal_width())))

    def _get_help_string(self, action):
        text = action.help or ""
        if action.default not in (None, "", False, argparse.SUPPRESS) and "(default:" not in text and \
                action.option_strings:
            text += " (default: %(default)s)"
        return text

    def _get_default_metavar_for_optional(self, action):
        return {int: "INT", float: "FLOAT"}.get(action.type, "VALUE")

    def _format_action_invocation(self, action):
        if isinstance(action, _ConfigFlag) and len(action.option_strings) == 2:
            return f"--[no]{action.dest}[=BOOL]"
        return super()._format_action_invocation(action)


def _terminal_width() -> int:
    import shutil

    return shutil.get_terminal_size((100, 24)).columns


class ArgumentParser(argparse.ArgumentParser):
    """argparse for tfgpu commands: one-line errors naming the flag, no abbreviations, flagfiles, Config flags.

    ``parse_args`` returns a namespace whose ``config_flags`` holds the Config fields given on the command
    line or in a flagfile (coerced to their types); a command's own options are ordinary attributes.
    """

    def __init__(self, prog: str, usage: str | None = None, description: str | None = None, **kwargs):
        kwargs.setdefault("formatter_class", _HelpFormatter)
        as_run = program_name(prog)
        if usage and as_run != prog and usage.startswith(prog):
            usage = as_run + usage[len(prog):]
        prog = as_run
        super().__init__(prog=prog, usage=usage, description=description, allow_abbrev=False, add_help=False,
                         **kwargs)
        self.add_argument(*HELP_FLAGS, action="help", default=argparse.SUPPRESS, help="Show this help and exit.")
        self.add_argument("--flagfile", default=argparse.SUPPRESS, metavar="FILE",
                          help="Read --flag=value lines from FILE (nested flagfiles allowed); the command line "
                               "wins over it.")
        self.add_argument("--recipe", default=argparse.SUPPRESS, metavar="NAME",
                          help="An installed recipe's flags, read as a flagfile (a flagfile may start from one "
                               "with a --recipe=NAME line and override it).")
        self.add_argument("--list_recipes", nargs=0, action=_ListRecipes, default=argparse.SUPPRESS,
                          help="Show the installed recipes, one line each, and exit.")
        self.config_defaults = {}  # Config field -> this command's default where it differs from the field's
        self._groups = {}

    def error(self, message):
        raise _error_from_argparse(message)

    def add_config_flags(self, groups=None, names=(), exclude=(), defaults=None, helps=None,
                         config_file: bool = False, overrides: str = "") -> None:
        """Declares Config fields as flags: those of ``groups`` (all when both ``groups`` and ``names`` are
        empty) plus ``names``, less ``exclude`` (options the command declares itself). ``defaults`` are this
        command's defaults, shown in help and returned by ``config_values``; ``helps`` replaces help texts.
        ``config_file`` adds ``--config=YAML``, the lowest-precedence source. ``overrides`` names where the
        values come from otherwise (e.g. "the run's config.yaml"): help then shows that instead of defaults."""
        if config_file:
            self.add_argument("--config", default="", metavar="YAML",
                              help="YAML file of option: value pairs (e.g. a run's config.yaml); flagfiles and "
                                   "the command line override it.")
        self.config_defaults.update(defaults or {})
        every = groups is None and not names
        for f in config_lib.fields():
            group = f.metadata["group"]
            if f.name in exclude or not (every or group in (groups or ()) or f.name in names):
                continue
            kind = config_lib.field_type(f)
            default = self.config_defaults.get(f.name, f.default)
            text = (helps or {}).get(f.name, f.metadata["help"])
            if f.metadata.get("choices"):
                text += f" One of: {', '.join(str(c) or repr(c) for c in f.metadata['choices'])}."
            text = text.replace("%", "%%")
            if default not in ("", ()) and not overrides:
                text += f" (default: {_format_default(default)})"
            if group not in self._groups:
                title = f"tfgpu.{group} flags" + (f" (default: {overrides})" if overrides else "")
                self._groups[group] = self.add_argument_group(title)
            add = self._groups[group].add_argument
            if kind is bool:
                add(f"--{f.name}", f"--no{f.name}", dest=f.name, action=_ConfigFlag, nargs="?", metavar="BOOL",
                    default=argparse.SUPPRESS, help=text)
            else:
                metavar = {int: "INT", float: "FLOAT", tuple: "LIST"}.get(kind, "VALUE")
                add(f"--{f.name}", dest=f.name, action=_ConfigFlag, metavar=metavar, default=argparse.SUPPRESS,
                    help=text)

    def parse_args(self, args=None, namespace=None):
        """argv (without the program name) → namespace; raises ConfigError naming the flag."""
        args = expand_flagfiles(list(sys.argv[1:] if args is None else args))
        namespace = namespace or argparse.Namespace()
        namespace.config_flags = {}
        namespace, extra = self.parse_known_args(args, namespace)
        if extra:
            raise self._unknown(extra[0])
        return namespace

    def _unknown(self, arg: str) -> ConfigError:
        if not arg.startswith("-"):
            return ConfigError("flags", f"unexpected argument {arg!r}: every option is a --name=value flag")
        name = arg.lstrip("-").split("=")[0]
        known = [s.lstrip("-") for a in self._actions for s in a.option_strings if a.help != argparse.SUPPRESS]
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.75)
        hint = f" (did you mean {', '.join('--' + c for c in close)}?)" if close else ""
        return ConfigError(name, f"unknown flag for {self.prog}{hint}")

    def config_values(self, namespace) -> dict:
        """This command's Config values: its defaults, then the flags given (flagfile and command line)."""
        return {**self.config_defaults, **namespace.config_flags}


def resolve(namespace, yaml_path: str = "", references: bool = True, **fixed) -> config_lib.Config:
    """The validated Config of a parsed command line: defaults < YAML < flags given < ``fixed`` (``references``:
    as ``config_sources.resolve``)."""
    return config_sources.resolve({**namespace.config_flags, **fixed}, yaml_path, references)


def program_name(module_form: str) -> str:
    """The command as it was run: its console script (``tfgpu-train``, named from ``python -m tfgpu.train``) when
    ``sys.argv[0]`` is that script, else ``module_form`` itself."""
    module = module_form.removeprefix("python -m ")
    script = os.path.basename(sys.argv[0] if sys.argv else "").removesuffix(".exe")
    if module != module_form and script == module.replace(".", "-").replace("_", "-"):
        return script
    return module_form


def wants_help(argv) -> bool:
    """Whether argv asks for help; commands print ``parser.format_help()`` and return 0 instead of parsing."""
    return any(a in HELP_FLAGS for a in argv)
