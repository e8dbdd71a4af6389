"""``tfgpu.fit``'s arguments as Keras' ``fit`` means them: names, refusals in Keras' words, epochs in steps.

Pure logic (no TensorFlow): which keyword arguments exist (Keras' and every tfgpu option), the did-you-mean for
one that does not, Keras' ``validation_split`` cut, the step at which each Keras epoch ends and which epochs
validate, the run directory a call without ``model_dir`` gets, and error messages turned from flags into the
Python arguments a ``tfgpu.fit`` caller writes.
"""
import difflib
import math
import os
import re
import time

from tfgpu.config import ConfigError

KERAS_ARGUMENTS = ("x", "y", "batch_size", "epochs", "verbose", "callbacks", "validation_split", "validation_data",
                   "shuffle", "class_weight", "sample_weight", "initial_epoch", "steps_per_epoch",
                   "validation_steps", "validation_freq")
ALIASES = {"train_data": "x", "eval_data": "validation_data"}  # tfgpu.fit's earlier names, still taken
# A Keras argument and the tfgpu option it sets: giving both is ambiguous.
OPTION_OF = {"batch_size": "global_batch_size", "validation_steps": "eval_steps"}
# A flag named in a message, and the argument a tfgpu.fit caller writes instead.
ARGUMENT_OF = {"global_batch_size": "batch_size", "eval_steps": "validation_steps", "data_dir": "x",
               "model": "model"}
DEFAULT_RUNS_DIR = "tfgpu_runs"
_CALLS = [0]  # tfgpu.fit calls without model_dir in this process (the same count on every worker)


# compile()'s arguments, given to fit by mistake: where they belong
SET_IN_COMPILE = {name: f"is compile()'s: model.compile({name}=...) before tfgpu.fit (tfgpu trains what compile() "
                  "says)" for name in ("optimizer", "loss", "metrics", "learning_rate", "loss_weights",
                                       "weighted_metrics", "steps_per_execution", "jit_compile")}


def check_names(names, tfgpu_names) -> None:
    """ConfigError for the first keyword argument that is neither Keras' nor a tfgpu option, with a did-you-mean
    over both (compile()'s arguments are sent to compile())."""
    known = set(KERAS_ARGUMENTS) | set(ALIASES) | set(tfgpu_names) | {"model_dir", "recipe"}
    for name in names:
        if name in SET_IN_COMPILE and name not in known:
            raise ConfigError(name, SET_IN_COMPILE[name])
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=3, cutoff=0.6)
            close += [n for n in sorted(known) if n.split("_")[0] == name.split("_")[0] and n not in close][:3]
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise ConfigError(name, f"unknown argument{hint}; tfgpu.fit takes keras.Model.fit's arguments and "
                              "tfgpu's options (python -m tfgpu.train --help lists them)")


def split_at(num_examples: int, validation_split: float) -> int:
    """Where Keras cuts arrays for ``validation_split``: the last fraction (before any shuffling) validates."""
    if not 0.0 <= validation_split < 1.0:
        raise ConfigError("validation_split", f"must be in [0, 1), got {validation_split}")
    at = int(math.floor(num_examples * (1.0 - validation_split)))
    if at in (0, num_examples):
        raise ConfigError("validation_split", f"Training data contains {num_examples} samples, which is not "
                          "sufficient to split it into a validation and training set as specified by "
                          f"`validation_split={validation_split}`. Either provide more data, or a different value "
                          "for the `validation_split` argument.")
    return at


def records_per_epoch(num_examples: int, num_workers: int) -> int:
    """Records one epoch trains on: every record, but for fewer than ``num_workers`` left out so that each input
    pipeline reads the same number (``data.pipeline.train_share``)."""
    return num_examples // num_workers * num_workers


def epoch_ends(num_examples: int, batch_size: int, num_workers: int, epochs: int, initial_epoch: int = 0,
               steps_per_epoch: int = 0) -> tuple:
    """The step at which each of epochs ``initial_epoch .. epochs-1`` ends, counted from this run's step 0.

    With ``steps_per_epoch`` an epoch is that many steps, as in Keras. Otherwise it ends at the first step whose
    batch holds the epoch's last record: tfgpu's batches run on across epochs (no partial batch), so every record
    trains once per epoch and the last step of an epoch may also start the next one."""
    if epochs <= initial_epoch:
        raise ConfigError("epochs", f"{epochs} must be greater than initial_epoch={initial_epoch}")
    count = epochs - initial_epoch
    if steps_per_epoch:
        return tuple(steps_per_epoch * (k + 1) for k in range(count))
    records = records_per_epoch(num_examples, num_workers)
    if records <= 0:
        raise ConfigError("x", f"{num_examples} examples cannot be shared by {num_workers} workers")
    return tuple(-(-(k + 1) * records // batch_size) for k in range(count))


def validates(epoch: int, validation_freq: int) -> bool:
    """Whether Keras validates after epoch ``epoch`` (0-based) with ``validation_freq``."""
    return (epoch + 1) % validation_freq == 0


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


def in_keras_words(message: str) -> str:
    """A message's flag syntax as a tfgpu.fit caller writes it: ``--input_range=0,255`` becomes
    ``input_range=(0, 255)``, ``--global_batch_size=N`` becomes ``batch_size=N``, ``--flag`` becomes ``flag``."""
    def pair(match):
        name, value = match.group(1), match.group(2)
        name = ARGUMENT_OF.get(name, name)
        if "," in value and re.fullmatch(r"[-\d.,]+", value):
            return f"{name}=({', '.join(value.split(','))})"
        return f"{name}={value}"

    message = re.sub(r"--([a-z_]+)=([^\s;,)]+(?:,[-\d.]+)*)", pair, message)
    return re.sub(r"--([a-z_]+)", lambda m: ARGUMENT_OF.get(m.group(1), m.group(1)), message)
