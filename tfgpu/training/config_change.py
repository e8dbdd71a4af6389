"""Resuming with a changed configuration: the run's recorded ``config.yaml`` against this run's Config.

When ``model_dir`` holds a checkpoint, every field that changes what is trained (``TRAINED``) is compared with
the value ``config.yaml`` recorded, before the strategy, the data or the model are built: a change stops the
run in one line naming each field with its old and new value, unless ``--allow_config_change`` lists it; an
allowed change is logged and recorded in ``history.jsonl`` (kind ``config_change``), which the report lists, once
the checkpoint has restored into the new run (``experiment.setup`` defers it and the config.yaml rewrite to then).
Every other field (``SAFE``) may change on any resume. The model a config builds can change without any field
changing (an edited model file or ``tfgpu.fit`` function): ``model_changes`` compares the built models with the
fingerprint the checkpoint recorded, under the name ``model``. Cost: one read of config.yaml and of the checkpoint
state file per run (milliseconds). Every worker reaches the same verdict from the same shared files; only the
chief writes the record.
"""
import dataclasses
import logging
import os
import re

from tfgpu import config_sources
from tfgpu.config import Config, ConfigError
from tfgpu.runtime import run_dir
from tfgpu.metrics import history as history_lib

log = logging.getLogger("tfgpu")

HISTORY_KIND = history_lib.CONFIG_CHANGE

# Fields that change what is trained, grouped by why. A change to one of them needs --allow_config_change.
TRAINED = {
    "what the model is (another one does not restore, or restores weights trained for something else)":
        ("task", "model", "generator", "discriminator", "num_classes", "latent_dim", "conditional"),
    "the examples the model learns from and their order (the resume position counts that stream)":
        ("dataset", "data_dir", "train_split", "image_size", "augment", "input_range", "seed", "shuffle_buffer",
         "deterministic_input", "data_service"),
    "how many examples one step sees (the data position and the learning rate scale with it)":
        ("global_batch_size", "grad_accum_steps"),
    "what one step computes: the loss, the numbers it is computed in, which layers learn":
        ("precision", "label_smoothing", "sync_batch_norm", "freeze", "unfreeze_at_step", "gan_loss",
         "gradient_penalty", "r1_gamma", "n_critic", "diffaugment"),
    "the optimizer, its state and its learning-rate schedule":
        ("optimizer", "base_learning_rate", "lr_schedule", "warmup", "warmup_epochs", "warmup_steps", "lr_decay_at",
         "lr_decay_epochs", "lr_decay_factor", "momentum", "nesterov", "weight_decay", "grad_clip_norm", "g_learning_rate",
         "d_learning_rate", "adam_beta1", "adam_beta2", "ema_decay"),
}

# Fields that may change on any resume, grouped by why.
SAFE = {
    "how long to train: extending a run is what resuming is for (a cosine or step schedule is laid over the "
    "new length from the restored step on)":
        ("train", "train_steps", "epochs"),
    "when to checkpoint, evaluate or stop, and what is logged":
        ("steps_per_loop", "checkpoint_every", "checkpoint_every_steps", "keep_checkpoints", "eval_every",
         "eval_every_steps", "target",
         "max_nonfinite_steps", "max_restarts", "tensorboard", "profile_input", "profile_steps", "verbose",
         "allow_config_change"),
    "how evaluation measures the model, not what it learns (curves across the change compare with care)":
        ("eval_split", "eval_steps", "eval_batch_size", "fid_num_samples", "inception_weights",
         "fid_feature_model_dir"),
    "where and how fast the same records are read":
        ("data_cache_dir", "tfds_data_dir", "download", "data_workers", "data_threadpool_size", "cache",
         "skip_corrupt_records"),
    "the devices, cluster and compilation (resuming on another topology is the checkpoint's business)":
        ("distribution_strategy", "num_gpus", "all_reduce_alg", "cpu_logical_devices", "gpu_memory_growth",
         "cluster", "collective_timeout_s", "jit_compile", "deterministic", "allreduce_dtype"),
    "the starting point of a fresh run, which the restored checkpoint replaces (the loss scale included)":
        ("init_weights", "init_skip_mismatch", "zero_init_residual", "initial_loss_scale",
         "loss_scale_growth_steps"),
    "the run's own directory: config.yaml was found in it, whatever its spelling":
        ("model_dir",),
}

TRAINED_FIELDS = tuple(name for names in TRAINED.values() for name in names)
_PATH_FIELDS = ("data_dir", "model", "generator", "discriminator")  # the same file under another spelling


@dataclasses.dataclass(frozen=True)
class Change:
    """One field that changes what is trained: its value in config.yaml and in this run."""
    field: str
    old: object
    new: object
    what: str = ""  # for a change to the built model (field "model"): the layer, setting or file that changed

    def describe(self) -> str:
        if self.what:
            return f"{self.what} changed: {self.old} -> {self.new}"
        return f"{self.field} {_show(self.old)} -> {_show(self.new)}"

    def record(self) -> dict:
        """The history.jsonl values of this change (JSON: tuples as lists); a model change's ``old`` and ``new``
        say what they are about, as the report's table shows them."""
        if self.what:
            return {"field": self.field, "old": f"{self.what}: {self.old}", "new": f"{self.what}: {self.new}"}
        return {"field": self.field, "old": _json(self.old), "new": _json(self.new)}


@dataclasses.dataclass(frozen=True)
class Recorded:
    """The configuration a resumed run was trained with: config.yaml's values (a key it lacks, from an older
    tfgpu, has the field's default) and the checkpoint step it resumes from."""
    path: str
    values: dict
    step: int


def _show(value) -> str:
    if isinstance(value, tuple):
        return ",".join(f"{v:g}" for v in value) or "''"
    return repr(value) if isinstance(value, str) else str(value)


def _json(value):
    return list(value) if isinstance(value, tuple) else value


def check_allowed_names(config: Config) -> None:
    """Every name --allow_config_change lists is an option; ConfigError naming the first that is not."""
    import difflib

    names = list(config_sources.options())
    for name in sorted(config.allowed_config_changes):
        if name not in names:
            close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise ConfigError("allow_config_change", f"{name!r} is not an option{hint}")


def resumed_step(model_dir: str):
    """The step of the latest checkpoint in ``model_dir`` (the one a run resumes from), or None when it has none;
    a state file that cannot be read is ConfigError(model_dir) (``checkpoint.latest``)."""
    from tfgpu.training import checkpoint

    latest = checkpoint.latest(model_dir)
    if latest is None:
        return None
    number = re.search(r"-(\d+)$", latest)
    return int(number.group(1)) if number else 0


def read_recorded(model_dir: str):
    """The ``Recorded`` configuration of the run this one resumes, or None for a fresh run (no checkpoint).
    A config.yaml that is unreadable or not tfgpu's is ConfigError(model_dir) naming it; a checkpoint with no
    config.yaml beside it is resumed unchecked, with a warning."""
    from tfgpu.runtime import fileio

    step = resumed_step(model_dir)
    if step is None:
        return None
    path = run_dir.config_yaml(model_dir)
    if not fileio.exists(path):
        log.warning("%s is missing: resuming the checkpoint at step %d without checking that this run trains "
                    "the same thing", path, step)
        return None
    fix = "fix or remove it, or train into a new --model_dir"
    try:
        data = config_sources.load_yaml(path)
    except ConfigError as e:
        raise ConfigError("model_dir", f"the run's recorded config: {e.reason}; {fix}") from None
    fields = {name: option.field for name, option in config_sources.options().items()}
    known = [name for name in data if name in fields]
    if not known:
        raise ConfigError("model_dir", f"{path} is not a tfgpu config.yaml (none of its keys is a tfgpu option); "
                          f"{fix}")
    unknown = sorted(set(data) - set(known))
    if unknown:
        log.warning("%s: %s not options of this tfgpu, not compared", path, ", ".join(unknown))
    values = {name: f.default for name, f in fields.items()}
    for name in known:
        try:
            values[name] = config_sources.coerce(name, data[name])
        except ConfigError as e:
            raise ConfigError("model_dir", f"{path}: {name}: {e.reason}; {fix}") from None
    return Recorded(path, values, step)


def _same(field: str, old, new) -> bool:
    """Whether two values of ``field`` train the same thing: equal, or local paths to the same file."""
    if old == new:
        return True
    if field in _PATH_FIELDS and isinstance(old, str) and isinstance(new, str) and "://" not in old + new:
        old_target, _, old_function = old.rpartition(":") if field != "data_dir" else (old, "", "")
        new_target, _, new_function = new.rpartition(":") if field != "data_dir" else (new, "", "")
        return bool(old_target and new_target) and old_function == new_function and \
            os.path.realpath(old_target) == os.path.realpath(new_target)
    return False


def changes(recorded: Recorded, config: Config) -> list:
    """The ``Change`` of each field that changes what is trained and differs from ``recorded``; ``--precision=
    auto`` is compared once resolved (config.yaml records the policy it chose), so not before."""
    found = []
    current = {name: option.field.default for name, option in config_sources.options().items()}
    current.update(config.options())  # another task's options are at their defaults in this run
    for name in TRAINED_FIELDS:
        new = current[name]
        if name == "precision" and new == "auto":
            continue
        if not _same(name, recorded.values[name], new):
            found.append(Change(name, recorded.values[name], new))
    return found


def check(recorded, config: Config) -> list:
    """The changes of this resume (none for a fresh run) when --allow_config_change lists all of them; otherwise
    ConfigError(allow_config_change) naming each refused field with its old and new value, and the fix."""
    found = changes(recorded, config) if recorded is not None else []
    refused = [c for c in found if c.field not in config.allowed_config_changes]
    if refused:
        allow = ",".join(sorted(config.allowed_config_changes | {c.field for c in refused}))
        raise ConfigError("allow_config_change", f"{config.model_dir} resumes at step {recorded.step} a run "
                          f"trained with other settings ({recorded.path}): "
                          f"{'; '.join(c.describe() for c in refused)}. Pass --allow_config_change={allow} to "
                          "resume with the change, or train into a new --model_dir")
    return found


def record(changes_made: list, step: int, history) -> None:
    """Logs each allowed change and appends its ``config_change`` record to history.jsonl (``history``: a
    ``training.history.History``, enabled on the chief alone)."""
    for change in changes_made:
        log.warning("resuming at step %d with a changed config (--allow_config_change): %s", step,
                    change.describe())
        history.write(HISTORY_KIND, step, change.record())


MODEL = "model"  # --allow_config_change's name for a change to the built model, as for --model itself


def model_changes(recorded_fingerprint, current: dict, config: Config, step: int) -> list:
    """The changes of the models built here from those the resumed checkpoint recorded (``tfgpu.models.fingerprint``;
    none when it recorded none: a checkpoint of an older tfgpu), when --allow_config_change lists ``model``;
    otherwise ConfigError(allow_config_change) naming the first differences in one line, and the fix. Called once the
    models are built and before anything is restored or written."""
    from tfgpu.models import fingerprint

    if not recorded_fingerprint:
        return []
    found = fingerprint.differences(recorded_fingerprint, current)
    if found and MODEL not in config.allowed_config_changes:
        allow = ",".join(sorted(config.allowed_config_changes | {MODEL}))
        raise ConfigError("allow_config_change", f"{config.model_dir} resumes at step {step} a checkpoint of another "
                          f"model: {fingerprint.summary(found)}. Pass --allow_config_change={allow} to resume with the "
                          "changed model, or train into a new --model_dir")
    return [Change(MODEL, d.old, d.new, d.what) for d in found]


def check_same_model(recorded_fingerprint, current: dict, config: Config, checkpoint: str, use: str) -> None:
    """For a command that uses a finished run's checkpoint (``use``: "evaluate", "export", ...): ConfigError
    (allow_config_change) in one line naming the first differences when the models built now (an edited --model
    file, an override) are not those ``checkpoint`` recorded, unless --allow_config_change lists ``model``. A
    checkpoint that recorded no fingerprint (an older tfgpu's) is taken as it is."""
    from tfgpu.models import fingerprint

    if not recorded_fingerprint or MODEL in config.allowed_config_changes:
        return
    found = fingerprint.differences(recorded_fingerprint, current)
    if found:
        raise ConfigError("allow_config_change", f"{checkpoint} was saved by another model than the one built now: "
                          f"{fingerprint.summary(found)}. Build the model it trained (undo the edit or the "
                          f"override), or pass --allow_config_change={MODEL} to {use} it with the changed model")
