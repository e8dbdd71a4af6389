"""``tfgpu.fit``'s arguments: Keras' ``fit`` arguments, and the few options of tfgpu's loop, checked before any work.

Pure logic (no TensorFlow). Keras' arguments keep Keras' meaning and are checked by Keras where Keras checks them;
what is checked here is what would otherwise fail late (a bad ``epochs`` after the first epoch) or is tfgpu's own.
An unknown keyword gets a did-you-mean over both; ``compile()``'s arguments given to fit are sent to ``compile()``.
"""
import dataclasses
import difflib
import os
import time

from tfgpu import durations
from tfgpu.config import ConfigError

KERAS_ARGUMENTS = ("x", "y", "batch_size", "epochs", "verbose", "callbacks", "validation_split", "validation_data",
                   "shuffle", "class_weight", "sample_weight", "initial_epoch", "steps_per_epoch",
                   "validation_steps", "validation_batch_size", "validation_freq")
SET_IN_COMPILE = ("optimizer", "loss", "metrics", "loss_weights", "weighted_metrics", "steps_per_execution",
                  "jit_compile", "run_eagerly", "learning_rate")
DEFAULT_RUNS_DIR = "tfgpu_runs"
DEFAULT_STEPS_PER_LOOP = 100
_CALLS = [0]  # tfgpu.fit calls without model_dir in this process (the same count on every worker)


class FitError(ConfigError):
    """A bad argument of ``tfgpu.fit``: ``flag`` names it; the message reads ``tfgpu.fit: NAME: why``."""

    def __init__(self, flag: str, message: str):
        ValueError.__init__(self, f"tfgpu.fit: {flag}: {message}")
        self.flag, self.reason = flag, message


@dataclasses.dataclass(frozen=True)
class LoopOptions:
    """What tfgpu's loop adds to Keras' ``fit``, each a keyword argument of ``tfgpu.fit``."""
    model_dir: str = ""  # checkpoints of the run (a rerun with the same model_dir resumes); "" -> a new directory
    steps_per_loop: int = DEFAULT_STEPS_PER_LOOP  # steps per host call when no callback asks for every batch
    checkpoint_every_s: float = 0.0  # seconds between timed checkpoints; 0 -> as often as costs 2% of the time
    seed: int = None  # the arrays' shuffling order; None -> drawn from numpy's global generator (one per job)


OPTIONS = {
    "model_dir": "a directory path every worker sees (any TensorFlow file system): checkpoints; a rerun resumes",
    "steps_per_loop": "a positive integer: steps per host call when no callback acts on every batch",
    "checkpoint_every": "seconds between timed checkpoints (a number, or Ns, Nmin, Nh)",
    "seed": "an integer: the order arrays are shuffled in, the same on every worker and on resume",
}


def check_names(names) -> None:
    """FitError for the first keyword argument that is neither Keras' nor tfgpu's, with a did-you-mean."""
    known = set(KERAS_ARGUMENTS) | set(OPTIONS)
    for name in names:
        if name in SET_IN_COMPILE:
            raise FitError(name, f"is compile()'s: model.compile({name}=...) before tfgpu.fit, as before model.fit")
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=3, cutoff=0.6)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise FitError(name, f"unknown argument{hint}; tfgpu.fit takes keras.Model.fit's arguments and "
                           f"{', '.join(OPTIONS)}")


def loop_options(options: dict) -> LoopOptions:
    """tfgpu's options from ``tfgpu.fit``'s keyword arguments, checked."""
    check_names(options)
    model_dir = options.get("model_dir")
    if model_dir is not None and (not isinstance(model_dir, (str, os.PathLike)) or not os.fspath(model_dir)):
        raise FitError("model_dir", f"must be a directory path, got {model_dir!r}")
    steps = options.get("steps_per_loop", DEFAULT_STEPS_PER_LOOP)
    if not _positive_int(steps):
        raise FitError("steps_per_loop", f"must be a positive integer, got {steps!r}")
    every = options.get("checkpoint_every", 0)
    if isinstance(every, str):
        try:
            parsed = durations.parse(every, "checkpoint_every")
        except (ConfigError, ValueError):
            parsed = None
        if parsed is None or parsed.unit != durations.SECONDS:
            raise FitError("checkpoint_every", f"must be seconds (a number, or Ns, Nmin, Nh), got {every!r}")
        every = durations.seconds(parsed)
    if isinstance(every, bool) or not isinstance(every, (int, float)) or every < 0:
        raise FitError("checkpoint_every", f"must be seconds >= 0, got {every!r}")
    seed = options.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise FitError("seed", f"must be an integer, got {seed!r}")
    return LoopOptions(os.fspath(model_dir) if model_dir is not None else "", int(steps), float(every), seed)


def _positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def check_keras_arguments(args: dict) -> None:
    """The scalar arguments, in Keras' words, before any work (Keras would fail on some only at an epoch's end)."""
    for name in ("epochs", "validation_freq"):
        if not _positive_int(args[name]):
            raise FitError(name, f"must be a positive integer, got {args[name]!r}")
    initial = args["initial_epoch"]
    if not isinstance(initial, int) or isinstance(initial, bool) or initial < 0:
        raise FitError("initial_epoch", f"must be a non-negative integer, got {initial!r}")
    for name in ("batch_size", "steps_per_epoch", "validation_steps", "validation_batch_size"):
        if args[name] is not None and not _positive_int(args[name]):
            raise FitError(name, f"must be a positive integer or None, got {args[name]!r}")
    if args["shuffle"] not in (True, False):
        raise FitError("shuffle", f"tfgpu.fit takes True or False (it draws the arrays' order itself), got "
                       f"{args['shuffle']!r}")
    split = args["validation_split"]
    if not isinstance(split, (int, float)) or not 0.0 <= split < 1.0:
        raise FitError("validation_split", f"must be in [0, 1), got {split!r}")


def new_run_dir(cluster_json: str = "", root: str = "") -> str:
    """A new directory for a call without ``model_dir``: ``tfgpu_runs/<time>-<pid>-<n>``; in a multi-worker job a
    name every worker derives alike (the job's cluster spec and this call's count), so all write the same run."""
    import hashlib

    root = root or DEFAULT_RUNS_DIR
    _CALLS[0] += 1
    if cluster_json:
        job = hashlib.sha256(cluster_json.encode()).hexdigest()[:10]
        return os.path.join(root, f"job-{job}-{_CALLS[0]}")
    while True:
        path = os.path.join(root, f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{_CALLS[0]}")
        if not os.path.exists(path):
            return path
        _CALLS[0] += 1
