"""Training throughput of tfgpu against plain Keras, measured in the same run.

    python -m tfgpu.benchmark --model=resnet20 --image_size=32 --batch_size=128,256 \
        --precision=float32,mixed_bfloat16 --baseline=keras_fit --output_json=bench.json

Every measurement (one runner x batch x precision x XLA setting) runs in its own
child process (``--_case=<json>``), because device settings can be applied only
once per process and peak memory is per process. The parent checks the flags,
runs the children one after another and prints a table plus the throughput
ratios of tfgpu to each baseline.

Runners: ``tfgpu`` (the Trainer: ``--steps_per_loop`` steps per tf.function
call, under ``--distribution_strategy``), ``keras_fit`` (what users write:
``model.compile(SGD, sparse CE); model.fit(...)`` on one device, same model,
data, global batch, precision and XLA setting) and ``keras_fit_strategy``
(Keras ``fit`` under the same strategy, ``steps_per_execution=1`` because larger
values fail under MirroredStrategy; a failure is recorded, not raised).

Timing: ``--warmup_steps`` (tracing, compilation, autotuning) are excluded, then
``--windows`` windows of ``--steps_per_window`` steps are timed by wall clock,
host work between loops included; examples/sec is their median, with min/max
and quartiles as the spread.
"""
import argparse
import contextlib
import dataclasses
import json
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow is imported anywhere

from tfgpu import cli  # noqa: E402
from tfgpu.config import PRECISIONS, STRATEGIES, ConfigError  # noqa: E402

RUNNERS = ("tfgpu", "keras_fit", "keras_fit_strategy", "synthetic")
BASELINES = RUNNERS[1:]

# Peak dense (no 2:4 sparsity) tensor-core TFLOPS per GPU, from NVIDIA's datasheets; the datasheets print
# sparsity figures for TF32/FP16/BF16, which are twice these. float32 runs use the TF32 peak while
# TensorFlow's TF32 execution is on (its default on Ampere and newer), else the plain FP32 peak. None = that
# precision has no tensor-core path on the GPU (MFU is not reported).
#   H100/H200: nvidia.com/en-us/data-center/h100/ and /h200/ datasheets (SXM: 67 FP32, 989 TF32*, 1,979 BF16*;
#              PCIe: 51, 756*, 1,513*; NVL: 60, 835*, 1,671*; * = with sparsity)
#   A100:  nvidia-a100-datasheet (19.5 FP32, 156 TF32, 312 BF16/FP16; SXM and PCIe, 40 and 80 GB)
#   A10:   nvidia-a10-datasheet (31.2, 62.5, 125);  L4: nvidia.com/en-us/data-center/l4/ (30.3, 60, 121)
#   L40S:  nvidia.com/en-us/data-center/l40s/ (91.6, 183, 362)
#   V100:  volta-v100-datasheet (SXM2: 15.7 FP32, 125 FP16 tensor; PCIe: 14, 112)
#   T4:    t4-tensor-core-datasheet (8.1 FP32, 65 FP16 mixed)
GPU_PEAK_TFLOPS = (
    # (pattern matched against the CUDA device name, label, fp32, tf32, fp16, bf16)
    (r"H200", "H200 SXM", 67.0, 494.7, 989.4, 989.4),
    (r"H100.*NVL", "H100 NVL", 60.0, 417.5, 835.5, 835.5),
    (r"H100.*PCIe", "H100 PCIe", 51.2, 378.0, 756.5, 756.5),
    (r"H100", "H100 SXM", 67.0, 494.7, 989.4, 989.4),
    (r"A100", "A100", 19.5, 156.0, 312.0, 312.0),
    (r"A10(?![0-9])", "A10", 31.2, 62.5, 125.0, 125.0),
    (r"L40S", "L40S", 91.6, 183.0, 362.0, 362.0),
    (r"L4(?![0-9])", "L4", 30.3, 60.0, 121.0, 121.0),
    (r"V100.*PCIE", "V100 PCIe", 14.0, None, 112.0, None),
    (r"V100", "V100 SXM2", 15.7, None, 125.0, None),
    (r"T4(?![0-9])", "T4", 8.1, None, 65.0, None),
)


# -- pure helpers (tested directly) ---------------------------------------------------------------------------
def peak_tflops(device_name: str, precision: str, tf32: bool = True):
    """(peak dense TFLOPS of one device for ``precision``, label), or (None, why) when unknown."""
    for pattern, label, fp32, tf32_peak, fp16, bf16 in GPU_PEAK_TFLOPS:
        if re.search(pattern, device_name, re.IGNORECASE):
            if precision == "float32":
                return (tf32_peak, f"{label} TF32") if tf32 and tf32_peak else (fp32, f"{label} FP32")
            peak = fp16 if precision == "mixed_float16" else bf16
            if peak is None:
                return None, f"{label} has no {precision.split('_')[1]} tensor cores"
            return peak, f"{label} {precision.split('_')[1].upper()}"
    return None, f"peak TFLOPS of {device_name or 'this device'} unknown"


def training_flops(macs_per_example: int) -> int:
    """FLOPs of one training example: forward + backward (2x forward), 2 FLOPs per multiply-add."""
    return 6 * macs_per_example


def window_stats(seconds: list, examples_per_window: int, steps_per_window: int, cpu_seconds: list = ()) -> dict:
    """Median and spread of examples/sec over timed windows, the median step time and, given the process's CPU
    time per window, the median CPU time per step (less sensitive than wall time to other work on the host)."""
    rates = sorted(examples_per_window / s for s in seconds)
    quartiles = statistics.quantiles(rates, n=4, method="inclusive") if len(rates) > 1 else [rates[0]] * 3
    stats = {"examples_per_sec": statistics.median(rates), "examples_per_sec_min": rates[0],
             "examples_per_sec_max": rates[-1], "examples_per_sec_p25": quartiles[0],
             "examples_per_sec_p75": quartiles[2], "window_examples_per_sec": [examples_per_window / s for s in seconds],
             "step_time_ms": 1000 * statistics.median(seconds) / steps_per_window}
    if cpu_seconds:
        stats["window_cpu_seconds"] = list(cpu_seconds)
        stats["cpu_ms_per_step"] = 1000 * statistics.median(cpu_seconds) / steps_per_window
    return stats


def _case_label(result: dict, varying: tuple) -> str:
    if not varying:
        return ""
    return "@" + ",".join(f"{k}={_fmt_value(k, result[k])}" for k in varying)


def _fmt_value(key, value):
    return ("on" if value else "off") if key == "jit_compile" else value


def _examples_per_cpu_second(result: dict):
    return 1000 * result["batch_size"] / result["cpu_ms_per_step"] if result.get("cpu_ms_per_step") else None


def ratios(results: list, rate=lambda r: r.get("examples_per_sec")) -> dict:
    """tfgpu / baseline ``rate`` (default examples/sec) per case, plus precision and XLA ratios of tfgpu; keys
    carry the case's settings only when they vary across the run (one case: ``{"tfgpu/keras_fit": 1.04}``)."""
    ok = [r for r in results if rate(r)]
    dims = ("batch_size", "precision", "jit_compile")
    varying = tuple(d for d in dims if len({r[d] for r in results}) > 1)
    by_key = {(r["name"], r["batch_size"], r["precision"], r["jit_compile"]): r for r in ok}
    out = {}
    for r in ok:
        if r["name"] != "tfgpu":
            continue
        key = (r["batch_size"], r["precision"], r["jit_compile"])
        for baseline in BASELINES:
            base = by_key.get((baseline,) + key)
            if base:
                out[f"tfgpu/{baseline}{_case_label(r, varying)}"] = round(rate(r) / rate(base), 4)
        if r["precision"] != "float32":
            base = by_key.get(("tfgpu", r["batch_size"], "float32", r["jit_compile"]))
            if base:
                label = _case_label(r, tuple(d for d in varying if d != "precision"))
                out[f"tfgpu:{r['precision']}/float32{label}"] = round(rate(r) / rate(base), 4)
        if r["jit_compile"] and r.get("jit_compile_effective"):
            base = by_key.get(("tfgpu", r["batch_size"], r["precision"], False))
            if base:
                label = _case_label(r, tuple(d for d in varying if d != "jit_compile"))
                out[f"tfgpu:xla_on/xla_off{label}"] = round(rate(r) / rate(base), 4)
    return out


def add_mfu(result: dict) -> None:
    """Model FLOPs utilisation: achieved training FLOP/s over the devices' summed dense peak (None on CPU)."""
    peak = result.get("peak_tflops_per_device")
    if result.get("examples_per_sec") and peak and result.get("macs_per_example"):
        achieved = result["examples_per_sec"] * training_flops(result["macs_per_example"])
        result["mfu"] = round(achieved / (peak * 1e12 * result["num_devices"]), 4)
    else:
        result["mfu"] = None


# -- the child side: one measurement per process -----------------------------------------------------------------
def _environment() -> dict:
    import platform

    import keras
    import tensorflow as tf

    cpu, flags = platform.processor(), set()
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and cpu in ("", "x86_64"):
                    cpu = line.split(":", 1)[1].strip()
                elif line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
    gpus = [tf.config.experimental.get_device_details(g).get("device_name", g.name)
            for g in tf.config.list_physical_devices("GPU")]
    build = tf.sysconfig.get_build_info()
    return {"tensorflow": tf.__version__, "keras": keras.__version__, "python": platform.python_version(),
            "platform": platform.platform(), "cpu": cpu, "cpu_count": os.cpu_count(),
            "cpu_features": sorted(flags & {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}),
            "gpus": gpus, "cuda": build.get("cuda_version"), "cudnn": build.get("cudnn_version")}


def _device_facts(config, num_devices: int) -> dict:
    """Peak memory of this process (GPU allocator peak, else host peak RSS) and the peak TFLOPS for MFU."""
    import tensorflow as tf

    gpus = tf.config.list_logical_devices("GPU")
    if gpus:
        peak = max(tf.config.experimental.get_memory_info(f"GPU:{i}")["peak"] for i in range(len(gpus)))
        name = tf.config.experimental.get_device_details(tf.config.list_physical_devices("GPU")[0]).get(
            "device_name", "")
        tflops, peak_source = peak_tflops(name, config.precision,
                                          tf.config.experimental.tensor_float_32_execution_enabled())
        kind = "gpu_peak_bytes"
    else:  # ru_maxrss is in KiB on Linux
        peak, kind, tflops, peak_source = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, \
            "host_peak_rss_bytes", None, "CPU: no known peak"
    return {"peak_memory_bytes": int(peak), "memory_kind": kind, "peak_tflops_per_device": tflops,
            "peak_source": peak_source, "num_devices": num_devices}


def _is_oom(error: BaseException) -> bool:
    import tensorflow as tf

    text = str(error)
    return isinstance(error, tf.errors.ResourceExhaustedError) or "RESOURCE_EXHAUSTED" in text or \
        "out of memory" in text.lower()


def _replica_count(config) -> int:
    """Replicas the config's strategy will have on this host, found before TensorFlow initialises."""
    import tensorflow as tf

    from tfgpu import distribute

    distribute.configure_devices(config)  # setup() applies the same settings again: a no-op before init
    gpus = len(tf.config.get_visible_devices("GPU"))
    kind = distribute.choose_kind(config, gpus, 1)
    if kind == "one_device":
        return 1
    return gpus or (config.cpu_logical_devices if kind == "mirrored" else 1) or 1


def _macs(model, image_shape):
    from tfgpu.models.summary import count_params, flops_per_example

    try:
        return {"macs_per_example": flops_per_example(model, image_shape), "params": count_params(model)}
    except ValueError:  # a dynamic shape: MFU unknown, the timing stands
        return {"macs_per_example": None, "params": count_params(model)}


def _timed_history(history):
    """The trainer's history writer, also noting wall and CPU clocks when each train loop's line is written."""
    from tfgpu.trainer import History

    class TimedHistory(History):
        def __init__(self, model_dir, enabled):
            super().__init__(model_dir, enabled)
            self.marks = {}  # step -> (wall clock, process CPU time)

        def write(self, kind, step, values):
            super().write(kind, step, values)
            if kind == "train":
                self.marks[step] = (time.perf_counter(), time.process_time())

    return TimedHistory(os.path.dirname(history.path), history.enabled)


def _run_tfgpu(case: dict, config) -> dict:
    """The tfgpu Trainer for warmup + timed windows; a window ends when its last loop's history line is written
    (so host work between loops counts)."""
    from tfgpu import experiment

    if case.get("per_replica_batch_size"):
        config = dataclasses.replace(config, global_batch_size=case["per_replica_batch_size"] * _replica_count(config))
    built = experiment.setup(config, write_config=False)
    built.trainer.history = history = _timed_history(built.trainer.history)
    built.trainer.train()
    placement = built.placement
    out = {"batch_size": config.global_batch_size,
           "per_replica_batch_size": config.global_batch_size // placement.num_replicas, "strategy": placement.kind,
           "num_replicas": placement.num_replicas, "devices": list(placement.devices),
           "jit_compile_effective": built.task.jit_compile, "steps_per_loop": config.steps_per_loop}
    out.update(_device_facts(config, placement.num_replicas))
    if case.get("probe"):
        return out
    ends = [history.marks[case["warmup_steps"] + k * case["steps_per_window"]] for k in range(case["windows"] + 1)]
    wall, cpu = ([b[i] - a[i] for a, b in zip(ends, ends[1:])] for i in (0, 1))
    out.update(window_stats(wall, case["steps_per_window"] * config.global_batch_size, case["steps_per_window"], cpu))
    out.update(_macs(built.task.model, built.info.image_shape))
    return out


def _run_keras_fit(case: dict, config, under_strategy: bool) -> dict:
    """Plain Keras 3 compile + fit on the same model, data, batch, precision and XLA setting."""
    import keras
    import tensorflow as tf

    from tfgpu import distribute, precision
    from tfgpu.data import pipeline
    from tfgpu.models import create_model

    if not under_strategy:  # what a user's own script does: one device, no strategy, no CPU splitting
        gpus = tf.config.list_physical_devices("GPU") if config.num_gpus != 0 else []
        config = dataclasses.replace(config, distribution_strategy="one_device", cpu_logical_devices=0,
                                     num_gpus=1 if gpus else config.num_gpus)
    distribute.configure_devices(config)
    placement = distribute.build_strategy(config) if under_strategy else None
    if placement is not None and placement.kind == "one_device":
        return {"status": "skipped", "reason": "the strategy is one_device: keras_fit measures the same thing"}
    replicas = placement.num_replicas if placement else 1
    # MirroredStrategy fails with steps_per_execution > 1 (keras-team/keras#19246); XLA cannot span logical CPUs.
    steps_per_execution = 1 if placement else case["keras_steps_per_execution"]
    jit = config.jit_compile and not (placement and placement.on_logical_cpus)
    keras.utils.set_random_seed(config.seed)
    precision.set_policy(config.precision)
    info = pipeline.prepare(config)
    dataset = pipeline.train_dataset_fn(config, info, 0)(tf.distribute.InputContext())  # global batches
    with placement.strategy.scope() if placement else contextlib.nullcontext():
        model = create_model(config.model, info.image_shape, info.num_classes)
        model.compile(optimizer=keras.optimizers.SGD(config.base_learning_rate * config.global_batch_size / 256,
                                                     momentum=config.momentum),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"],
                      jit_compile=jit, steps_per_execution=steps_per_execution)
    model.fit(dataset, epochs=1, steps_per_epoch=case["warmup_steps"], verbose=0)
    timer = _epoch_timer()
    model.fit(dataset, epochs=case["windows"], steps_per_epoch=case["steps_per_window"], verbose=0,
              callbacks=[timer])
    out = {"batch_size": config.global_batch_size, "per_replica_batch_size": config.global_batch_size // replicas,
           "strategy": placement.kind if placement else "keras_default",
           "num_replicas": replicas, "devices": list(placement.devices) if placement else [],
           "jit_compile_effective": bool(model.jit_compile), "steps_per_execution": steps_per_execution}
    out.update(_device_facts(config, replicas))
    out.update(window_stats(timer.seconds(0), case["steps_per_window"] * config.global_batch_size,
                            case["steps_per_window"], timer.seconds(1)))
    out.update(_macs(model, info.image_shape))
    return out


def _epoch_timer():
    """A Keras callback timing each epoch's wall clock; epoch hooks only, so fit keeps its per-step behaviour."""
    import keras

    class EpochTimer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 0:
                self.marks = [(time.perf_counter(), time.process_time())]

        def on_epoch_end(self, epoch, logs=None):
            float((logs or {}).get("loss", 0.0))  # the epoch's steps have finished once the loss is read
            self.marks.append((time.perf_counter(), time.process_time()))

        def seconds(self, clock):
            """Per epoch: wall-clock seconds (clock 0) or this process's CPU seconds (clock 1)."""
            return [b[clock] - a[clock] for a, b in zip(self.marks, self.marks[1:])]

    return EpochTimer()


def run_case(case: dict) -> dict:
    """Child entry: one measurement described by ``case``; never raises (the reason is returned)."""
    from tfgpu import config as config_lib

    result = {"name": case["runner"], "status": "ok"}
    try:
        config = config_lib.resolve(case["config"])
        result.update(_run_tfgpu(case, config) if case["runner"] in ("tfgpu", "synthetic") else
                      _run_keras_fit(case, config, case["runner"] == "keras_fit_strategy"))
    except ConfigError as e:
        result.update(status="failed", config_error=True, reason=str(e))
    except Exception as e:  # noqa: BLE001 - the parent reports why this measurement did not run
        result.update(status="oom" if _is_oom(e) else "failed", reason=_first_line(e))
    with contextlib.suppress(Exception):
        result["environment"] = _environment()
    return result


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0][:400] if lines else ''}"


# -- the parent side -----------------------------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    p = cli.ArgumentParser(prog="python -m tfgpu.benchmark", description=__doc__.split("\n\n")[0],
                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    a = p.add_argument
    a("--model", default="resnet20", help="Registered model name.")
    a("--image_size", type=int, default=0, help="Image size; 0 = the model's default (synthetic) or the dataset's.")
    a("--num_classes", type=int, default=0, help="Classes; 0 = the dataset's (synthetic: 10).")
    a("--dataset", default="synthetic", help="synthetic (one random batch repeated), a built-in dataset or "
      "tfds:NAME; ignored when --data_dir is set.")
    a("--data_dir", default="", help="A dataset converted by tfgpu.convert (real input pipeline).")
    a("--data_cache_dir", default="", help="Where built-in datasets are converted once.")
    a("--augment", default="none", help="Training augmentation for real data.")
    a("--batch_size", default="128", help="Global batch sizes, comma separated, or 'auto': the largest "
      "per-replica batch that fits (binary search with real steps) and the table below it.")
    a("--max_batch_size", type=int, default=0, help="auto: largest per-replica batch to try; "
      "0 = until out of memory on GPU, 256 on CPU.")
    a("--batch_granularity", type=int, default=8, help="auto: per-replica batches are multiples of this.")
    a("--precision", default="float32", help=f"Comma separated: {', '.join(PRECISIONS)}.")
    a("--jit_compile", default="false", nargs="?", const="true", help="XLA: true, false or 'false,true'.")
    a("--distribution_strategy", default="auto", choices=STRATEGIES, help="Strategy of the tfgpu runs.")
    a("--cpu_logical_devices", type=int, default=0, help="Split the CPU into N logical devices (mirrored on CPU).")
    a("--num_gpus", type=int, default=-1, help="GPUs to use; -1 = all visible.")
    a("--all_reduce_alg", default="", help="Cross-device all-reduce (see tfgpu.train --helpfull).")
    a("--baseline", default="keras_fit,keras_fit_strategy", help="Comma separated from keras_fit, "
      "keras_fit_strategy, synthetic (tfgpu on synthetic data of the real data's shape: the input pipeline's "
      "cost), or none.")
    a("--warmup_steps", type=int, default=20, help="Steps before timing (tracing, XLA, autotuning).")
    a("--steps_per_window", type=int, default=20, help="Steps per timed window.")
    a("--windows", type=int, default=5, help="Timed windows; examples/sec is their median.")
    a("--repeats", type=int, default=1, help="Run every measurement this many times, runners alternating, and "
      "pool their windows (steadier numbers on a busy machine).")
    a("--steps_per_loop", type=int, default=10, help="tfgpu: steps per tf.function call.")
    a("--keras_steps_per_execution", type=int, default=1, help="keras_fit: steps_per_execution "
      "(1 is what users write; keras_fit_strategy always uses 1).")
    a("--seed", type=int, default=42, help="Seed for weights and the synthetic batch.")
    a("--case_timeout_s", type=float, default=1800, help="Kill a measurement that takes longer.")
    a("--output_json", default="", help="Write results and ratios here.")
    a("--_case", default="", help=argparse.SUPPRESS)
    return p


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
    opts: argparse.Namespace
    batches: tuple  # global batch sizes; empty = auto
    precisions: tuple
    jits: tuple
    baselines: tuple
    image_size: int
    data_shape: tuple  # (height, width, channels) of the data the model sees
    num_classes: int


def plan(opts: argparse.Namespace) -> Plan:
    """Checks every flag (and the data) before any measurement starts; raises ConfigError naming the flag."""
    from tfgpu import config as config_lib

    for name in ("warmup_steps", "steps_per_window", "windows", "repeats", "steps_per_loop",
                 "keras_steps_per_execution", "batch_granularity"):
        if getattr(opts, name) <= 0:
            raise ConfigError(name, f"must be positive, got {getattr(opts, name)}")
    for name in ("steps_per_window", "warmup_steps"):
        for unit in ("steps_per_loop", "keras_steps_per_execution"):
            if getattr(opts, name) % getattr(opts, unit):
                raise ConfigError(name, f"{getattr(opts, name)} is not a multiple of --{unit}={getattr(opts, unit)}")
    auto = opts.batch_size.strip().lower() == "auto"
    batches = ()
    if not auto:
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
        if p not in PRECISIONS:
            raise ConfigError("precision", f"{p!r} is not one of {', '.join(PRECISIONS)}")
    jits = tuple(dict.fromkeys(_parse_bool("jit_compile", j) for j in _split(opts.jit_compile) or ["?"]))
    baselines = tuple(dict.fromkeys(b for b in _split(opts.baseline) if b != "none"))
    for b in baselines:
        if b not in BASELINES:
            raise ConfigError("baseline", f"{b!r} is not one of {', '.join(BASELINES)}, none")
    from tfgpu.models import get_spec

    try:
        spec = get_spec(opts.model)
    except ValueError as e:
        raise ConfigError("model", str(e)) from None
    if spec.family != "classifier":
        raise ConfigError("model", f"{opts.model} is a {spec.family} model; the benchmark trains classifiers")
    image_size = opts.image_size or (spec.default_image_size or 32 if not opts.data_dir and
                                     opts.dataset == "synthetic" else 0)
    p = Plan(opts, batches, precisions, jits, baselines, image_size, (), 0)
    first = config_lib.resolve(_explicit(p, batches[0] if batches else opts.batch_granularity, precisions[0],
                                         jits[0], "unused"))
    from tfgpu.data import pipeline

    info = pipeline.prepare(first)  # data errors name --data_dir/--dataset now; built-in data converts once, here
    if "synthetic" in baselines:
        h, w, c = info.image_shape
        if info.name == "synthetic":
            raise ConfigError("baseline", "synthetic compares real input with synthetic input: set --data_dir or "
                              "a --dataset other than synthetic")
        if h != w or c != 3:
            raise ConfigError("baseline", f"synthetic data is square RGB; {info.name} gives {h}x{w}x{c} images "
                              "(set --image_size, or drop the synthetic baseline)")
    return dataclasses.replace(p, data_shape=tuple(info.image_shape), num_classes=info.num_classes)


def _explicit(p: Plan, batch: int, precision: str, jit: bool, model_dir: str) -> dict:
    """The Config options of one tfgpu measurement (the baselines read the same ones)."""
    o = p.opts
    total = o.warmup_steps + o.windows * o.steps_per_window
    explicit = {"model": o.model, "image_size": p.image_size, "num_classes": o.num_classes,
                "dataset": o.dataset, "data_dir": o.data_dir, "data_cache_dir": o.data_cache_dir,
                "augment": o.augment, "global_batch_size": batch, "precision": precision, "jit_compile": jit,
                "distribution_strategy": o.distribution_strategy, "cpu_logical_devices": o.cpu_logical_devices,
                "num_gpus": o.num_gpus, "all_reduce_alg": o.all_reduce_alg, "seed": o.seed,
                "model_dir": model_dir, "train_steps": total, "steps_per_loop": o.steps_per_loop,
                "checkpoint_every_steps": 0, "keep_checkpoints": 1, "eval_split": "none", "tensorboard": False,
                "verbose": 0, "lr_schedule": "constant"}
    return {k: v for k, v in explicit.items() if v != ""}


class Runner:
    """Runs measurements in child processes under one scratch directory; prints progress to stderr."""

    def __init__(self, p: Plan, workdir: str):
        self.plan, self.workdir, self.count = p, workdir, 0
        self.environment = None

    def run(self, runner: str, batch: int, precision: str, jit: bool, per_replica: int = 0,
            probe: bool = False) -> dict:
        o = self.plan.opts
        self.count += 1
        model_dir = os.path.join(self.workdir, f"run{self.count}")
        case = {"runner": runner, "config": _explicit(self.plan, batch or per_replica, precision, jit, model_dir),
                "per_replica_batch_size": per_replica, "probe": probe, "warmup_steps": o.warmup_steps,
                "steps_per_window": o.steps_per_window, "windows": o.windows,
                "keras_steps_per_execution": o.keras_steps_per_execution}
        if probe:
            case["config"].update(train_steps=2, steps_per_loop=1)
        if runner == "synthetic":  # tfgpu again, on one random batch of the real data's shape
            case["config"].pop("data_dir", None)
            case["config"].update(dataset="synthetic", image_size=self.plan.data_shape[0],
                                  num_classes=self.plan.num_classes, augment="none")
        what = f"{runner} " + (f"per-replica batch {per_replica}" if per_replica else f"batch {batch}") + \
               f" {precision} xla={'on' if jit else 'off'}" + (" (fits?)" if probe else "")
        print(f"[{self.count}] {what} ...", file=sys.stderr, flush=True)
        started = time.time()
        result = self._child(case, os.path.join(self.workdir, f"run{self.count}"))
        result.update(name=runner, precision=precision, jit_compile=jit, model=o.model,
                      image_size=self.plan.image_size or self.plan.data_shape[0],
                      dataset=case["config"].get("data_dir") or case["config"]["dataset"],
                      steps_per_window=o.steps_per_window, windows=o.windows, warmup_steps=o.warmup_steps)
        result.setdefault("batch_size", batch)
        self.environment = result.pop("environment", None) or self.environment
        shutil.rmtree(model_dir, ignore_errors=True)
        status = (f"{result['examples_per_sec']:.1f} examples/sec" if result.get("examples_per_sec") else
                  "fits" if result["status"] == "ok" else f"{result['status']}: {result.get('reason', '')}")
        print(f"[{self.count}] {what}: {status} ({time.time() - started:.0f}s)", file=sys.stderr, flush=True)
        return result

    def _child(self, case: dict, stem: str) -> dict:
        import tfgpu

        result_path, log_path = stem + ".json", stem + ".log"
        env = dict(os.environ)
        env.pop("TF_CONFIG", None)  # one process: a cluster description would make it wait for peers
        package_root = os.path.dirname(os.path.dirname(os.path.abspath(tfgpu.__file__)))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
        cmd = [sys.executable, "-m", "tfgpu.benchmark", "--_case=" + json.dumps({**case, "result": result_path})]
        with open(log_path, "w") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
            try:
                returncode = proc.wait(timeout=self.plan.opts.case_timeout_s)
            except subprocess.TimeoutExpired:
                return {"status": "failed", "reason": f"timed out after {self.plan.opts.case_timeout_s:.0f}s"}
            finally:
                if proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        if os.path.exists(result_path):
            with open(result_path) as f:
                return json.load(f)
        with open(log_path, errors="replace") as f:
            tail = [line.strip() for line in f if line.strip()][-3:]
        killed = returncode < 0 and -returncode == signal.SIGKILL
        return {"status": "oom" if killed or any(_looks_oom(t) for t in tail) else "failed",
                "reason": f"child exited {returncode}: " + " | ".join(tail)[-600:]}


def _looks_oom(line: str) -> bool:
    return "RESOURCE_EXHAUSTED" in line or "out of memory" in line.lower()


def _fail_on_config_error(result: dict) -> None:
    if result.get("config_error"):
        flag, _, message = result["reason"].partition(": ")
        flag = flag.lstrip("-")
        raise ConfigError({"global_batch_size": "batch_size"}.get(flag, flag), message)


def measure(runner: Runner, batch: int, precision: str, jit: bool, per_replica: int = 0) -> list:
    """tfgpu then each baseline on the same case, ``--repeats`` rounds in alternation (so a change in machine
    load hits every runner alike); each runner's windows from all rounds are pooled."""
    rounds = {name: [] for name in ("tfgpu",) + runner.plan.baselines}
    for _ in range(runner.plan.opts.repeats):
        mine = runner.run("tfgpu", batch, precision, jit, per_replica=per_replica)
        _fail_on_config_error(mine)
        rounds["tfgpu"].append(mine)
        for baseline in runner.plan.baselines:
            if baseline == "keras_fit_strategy" and mine.get("strategy") == "one_device":
                rounds[baseline] = [{**{k: mine.get(k) for k in ("precision", "jit_compile", "model", "image_size",
                                                                 "dataset", "batch_size")},
                                     "name": baseline, "status": "skipped",
                                     "reason": "the strategy is one_device: keras_fit measures the same thing"}]
                continue
            rounds[baseline].append(runner.run(baseline, mine.get("batch_size") or batch, precision, jit))
    return [pool_rounds(results) for results in rounds.values()]


def pool_rounds(results: list) -> dict:
    """One result from several rounds of the same measurement: all their windows pooled, the highest peak
    memory; a round that failed makes the whole measurement fail (its reason is kept)."""
    failed = [r for r in results if r.get("status") != "ok"]
    if failed or len(results) == 1:
        return {**(failed or results)[0], "repeats": len(results)}
    first = results[0]
    per_window = first["steps_per_window"] * first["batch_size"]
    rates = [rate for r in results for rate in r["window_examples_per_sec"]]
    pooled = {**first, "repeats": len(results), "peak_memory_bytes": max(r["peak_memory_bytes"] for r in results)}
    cpu = [c for r in results for c in r.get("window_cpu_seconds", ())]
    pooled.update(window_stats([per_window / rate for rate in rates], per_window, first["steps_per_window"], cpu))
    pooled["window_examples_per_sec"] = rates
    return pooled


def auto_batch(runner: Runner, precision: str, jit: bool) -> dict:
    """Largest per-replica batch (a multiple of --batch_granularity) whose real training step fits in memory:
    doubling until a step runs out of memory (or --max_batch_size), then binary search."""
    o = runner.plan.opts
    unit, probes, cap = o.batch_granularity, [], o.max_batch_size

    def fits(b):
        r = runner.run("tfgpu", 0, precision, jit, per_replica=b, probe=True)
        _fail_on_config_error(r)
        if r["status"] not in ("ok", "oom"):
            raise RuntimeError(f"--batch_size=auto: the probe at per-replica batch {b} failed: {r.get('reason')}")
        probes.append({"per_replica_batch_size": b, "fits": r["status"] == "ok",
                       "peak_memory_bytes": r.get("peak_memory_bytes"), "reason": r.get("reason")})
        return r

    first = fits(unit)
    if first["status"] != "ok":
        raise RuntimeError(f"--batch_size=auto: even a per-replica batch of {unit} does not fit: {first['reason']}")
    if not cap:
        cap = 256 if first.get("memory_kind") == "host_peak_rss_bytes" else 1 << 16
        print(f"--batch_size=auto: searching up to a per-replica batch of {cap} (--max_batch_size)",
              file=sys.stderr)
    cap = max(unit, cap // unit * unit)
    good, bad, doublings = unit, None, [unit]
    while good < cap and bad is None:
        b = min(2 * good, cap)
        if fits(b)["status"] == "ok":
            good = b
            doublings.append(b)
        else:
            bad = b
    while bad is not None and bad - good > unit:
        mid = (good + bad) // 2 // unit * unit
        if fits(mid)["status"] == "ok":
            good = mid
        else:
            bad = mid
    table = [d for d in doublings if d < good][-3:] + [good]  # the largest and up to three below it
    return {"precision": precision, "jit_compile": jit, "max_per_replica_batch_size": good,
            "limited_by": "memory" if bad is not None else "max_batch_size", "probes": probes,
            "table_per_replica_batch_sizes": table, "replicas": first.get("num_replicas")}


def run_benchmark(p: Plan) -> dict:
    """Every measurement of the plan; returns the report (results, ratios, auto search, environment)."""
    workdir = tempfile.mkdtemp(prefix="tfgpu-benchmark-")
    runner = Runner(p, workdir)
    results, searches = [], []
    try:
        for precision in p.precisions:
            for jit in p.jits:
                if p.batches:
                    for batch in p.batches:
                        results += measure(runner, batch, precision, jit)
                    continue
                search = auto_batch(runner, precision, jit)
                searches.append(search)
                for per_replica in search["table_per_replica_batch_sizes"]:
                    results += measure(runner, 0, precision, jit, per_replica=per_replica)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    for r in results:
        add_mfu(r)
        r.setdefault("examples_per_sec", None)
    if any(r.get("step_time_ms") and r["step_time_ms"] * p.opts.steps_per_window < 200 for r in results):
        print("note: some timed windows were shorter than 0.2 s, so timer resolution and scheduling noise weigh "
              "on them; raise --steps_per_window for stable numbers", file=sys.stderr)
    report = {"command": "python -m tfgpu.benchmark " + " ".join(p.opts.command),
              "time": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "environment": runner.environment,
              "results": results, "ratios": ratios(results),
              # Examples per CPU-second of the process: on a shared host these move far less than wall clock.
              "cpu_time_ratios": ratios(results, _examples_per_cpu_second)}
    if searches:
        report["auto_batch_size"] = searches
    return report


# -- the readable report ---------------------------------------------------------------------------------------------
def _mib(n):
    return f"{n / 2**20:,.0f} MiB" if n else "-"


def format_report(report: dict) -> str:
    """A fixed-width table of every measurement, then the ratios."""
    env = report.get("environment") or {}
    lines = [f"machine: {', '.join(env.get('gpus') or []) or env.get('cpu', '?')} ({env.get('cpu_count')} CPUs); "
             f"TensorFlow {env.get('tensorflow')}, Keras {env.get('keras')}"]
    head = ("name", "batch", "precision", "xla", "strategy", "ex/s", "min-max", "step ms", "cpu ms", "peak mem",
            "MFU")
    rows, xla_dropped = [], False
    for r in report["results"]:
        xla = "on" if r["jit_compile"] else "off"
        if r["jit_compile"] and r.get("jit_compile_effective") is False:
            xla, xla_dropped = "off*", True
        strategy = f"{r.get('strategy', '-')}({r['num_replicas']})" if r.get("num_replicas") else "-"
        if r.get("examples_per_sec"):
            rows.append((r["name"], str(r["batch_size"]), r["precision"], xla,
                         strategy, f"{r['examples_per_sec']:.1f}",
                         f"{r['examples_per_sec_min']:.0f}-{r['examples_per_sec_max']:.0f}",
                         f"{r['step_time_ms']:.1f}",
                         f"{r['cpu_ms_per_step']:.1f}" if r.get("cpu_ms_per_step") else "-",
                         _mib(r.get("peak_memory_bytes")),
                         f"{100 * r['mfu']:.1f}%" if r.get("mfu") is not None else "-"))
        else:
            rows.append((r["name"], str(r.get("batch_size")), r["precision"], xla,
                         strategy, f"{r['status']}: {r.get('reason', '')}"[:120]) + ("",) * 5)
    done = [row for row in rows if row[6]]
    widths = [max(len(row[i]) for row in [head] + done) for i in range(len(head))]
    for row in [head] + rows:
        if not row[6]:  # a failed or skipped run: its reason instead of numbers
            lines.append("  ".join(c.ljust(w) for c, w in zip(row[:5], widths)) + "  " + row[5])
            continue
        lines.append("  ".join(c.rjust(w) if i in (1, 5, 6, 7, 8, 9, 10) else c.ljust(w)
                               for i, (c, w) in enumerate(zip(row, widths))).rstrip())
    if xla_dropped:
        lines.append("off* = --jit_compile asked for, not in effect (XLA cannot span logical CPU replicas, "
                     "or synchronized BatchNorm)")
    for search in report.get("auto_batch_size", []):
        lines.append(f"auto batch ({search['precision']}, xla {'on' if search['jit_compile'] else 'off'}): largest "
                     f"per-replica batch that fits = {search['max_per_replica_batch_size']} (limited by "
                     f"{search['limited_by']}; probes: " + ", ".join(
                         f"{pr['per_replica_batch_size']}{'' if pr['fits'] else ' OOM'}" for pr in search["probes"])
                     + ")")
    lines.append("ratios:" if report["ratios"] else "ratios: none (a runner failed or no baseline was asked for)")
    lines += [f"  {k} = {v:.3f}" for k, v in report["ratios"].items()]
    if report.get("cpu_time_ratios"):
        lines.append("examples per CPU-second ratios (less moved by other work on the host than wall clock):")
        lines += [f"  {k} = {v:.3f}" for k, v in report["cpu_time_ratios"].items()]
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        opts = _parser().parse_args(argv)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if opts._case:
        case = json.loads(opts._case)
        result = run_case(case)
        from tfgpu.fileio import atomic_write_bytes

        atomic_write_bytes(case["result"], json.dumps(result).encode())
        return 0
    opts.command = argv
    try:
        p = plan(opts)
        if opts.output_json:  # an unwritable output path fails now, not after the measurements
            directory = os.path.dirname(os.path.abspath(opts.output_json))
            if not os.path.isdir(directory) or not os.access(directory, os.W_OK):
                raise ConfigError("output_json", f"directory {directory!r} does not exist or is not writable")
        report = run_benchmark(p)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(format_report(report), flush=True)
    if opts.output_json:
        from tfgpu.fileio import atomic_write_bytes

        atomic_write_bytes(opts.output_json, (json.dumps(report, indent=2) + "\n").encode())
    failed = [r for r in report["results"] if r["name"] == "tfgpu" and r["status"] != "ok"]
    return 2 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
