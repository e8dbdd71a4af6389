"""What a benchmark measures: the checked plan (batches x precisions x XLA settings, baselines, data shape)
and the Config options of each measurement."""
import argparse
import dataclasses

from tfgpu.bench.stats import BASELINES
from tfgpu.config import PRECISIONS, ConfigError


def _split(value: str) -> list:
    return [v.strip() for v in value.split(",") if v.strip()]


def _parse_bool(flag: str, value: str) -> bool:
    table = {"true": True, "on": True, "1": True, "yes": True, "false": False, "off": False, "0": False, "no": False}
    if value.lower() not in table:
        raise ConfigError(flag, f"expected true or false, got {value!r}")
    return table[value.lower()]


@dataclasses.dataclass(frozen=True)
class Plan:
    """What to measure, checked: the product of these lists, with these runners."""
    opts: argparse.Namespace  # the benchmark's own options (timing, sweeps, baselines)
    shared: dict  # Config options from the shared flags (model, data, precision, strategy), defaults included
    batches: tuple  # global batch sizes; empty = auto
    precisions: tuple
    jits: tuple
    baselines: tuple
    image_size: int
    data_shape: tuple  # (height, width, channels) of the data the model sees
    num_classes: int
    precision_auto: dict = dataclasses.field(default_factory=dict)  # {"precision", "reason"} when auto was asked


def host_gpus(num_gpus: int) -> list:
    """The GPUs a benchmark case would use (``--num_gpus``: -1 all, 0 none), as ``resolve_auto`` takes them:
    name and compute capability. Lists devices without initialising TensorFlow's runtime."""
    import tensorflow as tf

    physical = tf.config.list_physical_devices("GPU")
    if num_gpus >= 0:
        physical = physical[:num_gpus]
    gpus = []
    for device in physical:
        details = tf.config.experimental.get_device_details(device)
        gpus.append({"name": details.get("device_name", device.name),
                     "compute_capability": ".".join(map(str, details.get("compute_capability", (0, 0))))})
    return gpus


def resolve_precisions(names: tuple, cpu_flags: dict, gpus: list) -> tuple:
    """``names`` with ``auto`` replaced by the policy ``--precision=auto`` picks on this host (as tfgpu.train
    does: ``runtime.precision.resolve_auto``), duplicates dropped; and {"precision", "reason"} when auto was
    among them (else {})."""
    if "auto" not in names:
        return names, {}
    from tfgpu.runtime.precision import resolve_auto

    chosen, reason = resolve_auto(cpu_flags, gpus)
    return tuple(dict.fromkeys(chosen if n == "auto" else n for n in names)), {"precision": chosen, "reason": reason}


def plan(opts: argparse.Namespace, shared: dict) -> Plan:
    """Checks every flag (and the data) before any measurement starts; raises ConfigError naming the flag.

    ``shared`` holds the Config options given through the shared flags, over the benchmark's defaults."""
    from tfgpu import config as config_lib
    from tfgpu import config_sources

    base = config_lib.Config(**shared)  # typed values with the field defaults; validated per measurement below
    steps = {"untimed_steps": opts.untimed_steps, "steps_per_window": opts.steps_per_window, "windows": opts.windows,
             "repeats": opts.repeats, "steps_per_loop": base.steps_per_loop,
             "keras_steps_per_execution": opts.keras_steps_per_execution, "batch_granularity": opts.batch_granularity}
    for name, value in steps.items():
        if value <= 0:
            raise ConfigError(name, f"must be positive, got {value}")
    for name in ("steps_per_window", "untimed_steps"):
        for unit in ("steps_per_loop", "keras_steps_per_execution"):
            if steps[name] % steps[unit]:
                raise ConfigError(name, f"{steps[name]} is not a multiple of --{unit}={steps[unit]}")
    batches = ()
    if opts.batch_size.strip().lower() != "auto":
        try:
            batches = tuple(dict.fromkeys(int(b) for b in _split(opts.batch_size)))
        except ValueError:
            raise ConfigError("batch_size", f"expected comma separated integers or 'auto', got "
                              f"{opts.batch_size!r}") from None
        if not batches or min(batches) <= 0:
            raise ConfigError("batch_size", f"batch sizes must be positive, got {opts.batch_size!r}")
    if opts.max_batch_size < 0:
        raise ConfigError("max_batch_size", f"must be >= 0, got {opts.max_batch_size}")
    precisions = tuple(dict.fromkeys(_split(opts.precision)))
    for p in precisions or ("",):
        if p not in PRECISIONS + ("auto",):
            raise ConfigError("precision", f"{p!r} is not one of {', '.join(PRECISIONS)}, auto")
    auto = {}
    if "auto" in precisions:
        from tfgpu.runtime.host import cpu_facts

        precisions, auto = resolve_precisions(precisions, cpu_facts()["flags"], host_gpus(base.num_gpus))
    jits = tuple(dict.fromkeys(_parse_bool("jit_compile", j) for j in _split(opts.jit_compile) or ["?"]))
    baselines = tuple(dict.fromkeys(b for b in _split(opts.baseline) if b != "none"))
    for b in baselines:
        if b not in BASELINES:
            raise ConfigError("baseline", f"{b!r} is not one of {', '.join(BASELINES)}, none")
    from tfgpu.models import get_spec

    try:
        spec = get_spec(base.model)
    except ValueError as e:
        raise ConfigError("model", str(e)) from None
    if spec.family != "classifier":
        raise ConfigError("model", f"{base.model} is a {spec.family} model; the benchmark trains classifiers")
    image_size = base.image_size or (spec.default_image_size or 32 if not base.data_dir and
                                     base.dataset == "synthetic" else 0)
    p = Plan(opts, dict(shared), batches, precisions, jits, baselines, image_size, (), 0, auto)
    first = config_sources.resolve(case_config(p, batches[0] if batches else opts.batch_granularity, precisions[0],
                                           jits[0], "unused"))
    from tfgpu.data import catalog

    # Data errors name --data_dir/--dataset now; built-in data converts once, here.
    info = catalog.prepare(config_lib.DatasetConfig.of(first))
    if "synthetic" in baselines:
        h, w, c = info.image_shape
        if info.name == "synthetic":
            raise ConfigError("baseline", "synthetic compares real input with synthetic input: set --data_dir or "
                              "a --dataset other than synthetic")
        if h != w or c != 3:
            raise ConfigError("baseline", f"synthetic data is square RGB; {info.name} gives {h}x{w}x{c} images "
                              "(set --image_size, or drop the synthetic baseline)")
    return dataclasses.replace(p, data_shape=tuple(info.image_shape), num_classes=info.num_classes)


def case_config(p: Plan, batch: int, precision: str, jit: bool, model_dir: str) -> dict:
    """The Config options of one tfgpu measurement (the baselines read the same ones): the shared flags, this
    case's batch, precision and XLA setting, and a run that only trains (no eval, checkpoint or summaries)."""
    o = p.opts
    total = o.untimed_steps + o.windows * o.steps_per_window
    return {**p.shared, "image_size": p.image_size, "global_batch_size": batch, "precision": precision,
            "jit_compile": jit, "model_dir": model_dir, "train_steps": total, "checkpoint_every_steps": 0,
            "keep_checkpoints": 1, "eval_split": "none", "tensorboard": False, "verbose": 0,
            "lr_schedule": "constant"}
