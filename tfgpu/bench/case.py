"""The child side of a benchmark: one measurement (runner x batch x precision x XLA) per process.

``run_case`` trains the tfgpu Trainer or plain Keras ``fit`` for the untimed steps and the timed windows and
returns the timings, peak memory and device facts; it never raises (a failure's reason is returned), because
the parent records a failed measurement instead of stopping.
"""
import contextlib
import dataclasses
import os
import resource
import time

from tfgpu.bench.stats import XLA_SCOPES, peak_tflops, window_stats
from tfgpu.config import ConfigError, DatasetConfig, RuntimeConfig


def _environment() -> dict:
    import platform

    import keras
    import tensorflow as tf

    from tfgpu.runtime.host import cpu_facts

    cpu = cpu_facts()
    gpus = [tf.config.experimental.get_device_details(g).get("device_name", g.name)
            for g in tf.config.list_physical_devices("GPU")]
    build = tf.sysconfig.get_build_info()
    return {"tensorflow": tf.__version__, "keras": keras.__version__, "python": platform.python_version(),
            "platform": platform.platform(), "cpu": cpu["model"], "cpu_count": os.cpu_count(),
            "cpu_features": sorted(f for f, present in cpu["flags"].items() if present),
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
        peak, kind = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "host_peak_rss_bytes"
        host_tflops, peak_source = cpu_matmul_peak_tflops(config.precision)
        tflops = host_tflops / num_devices  # logical CPU devices share the host's cores: MFU is of the host
    return {"peak_memory_bytes": int(peak), "memory_kind": kind, "peak_tflops_per_device": tflops,
            "peak_source": peak_source, "num_devices": num_devices}


def cpu_matmul_peak_tflops(precision: str, size: int = 1024, seconds: float = 0.6) -> tuple:
    """(TFLOPS, label): what this process reaches on the host's CPU in chained ``size``-square matmuls of the
    policy's compute dtype (float32, or bfloat16 for mixed_bfloat16; float16 for mixed_float16), best of a
    few ``seconds`` / 4 windows. The CPU's datasheet peak is unknown here; this is the ceiling a dense model
    step can reach on the same cores, measured in the same process as the benchmark."""
    import time

    import tensorflow as tf

    dtype = {"mixed_bfloat16": tf.bfloat16, "mixed_float16": tf.float16}.get(precision, tf.float32)
    a = tf.random.stateless_uniform([size, size], seed=[1, 2], dtype=tf.float32)
    a = tf.cast(a / size, dtype)

    @tf.function
    def chain(x):
        for _ in range(8):
            x = tf.matmul(x, a)
        return x

    chain(a).numpy()  # trace and warm the kernels
    best = 0.0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or best == 0.0:
        start, calls = time.perf_counter(), 0
        while time.perf_counter() - start < seconds / 4:
            chain(a).numpy()
            calls += 1
        best = max(best, calls * 8 * 2 * size ** 3 / (time.perf_counter() - start))
    return best / 1e12, f"CPU {tf.as_dtype(dtype).name} matmul probe ({size}x{size}, this process)"


def _is_oom(error: BaseException) -> bool:
    import tensorflow as tf

    text = str(error)
    return isinstance(error, tf.errors.ResourceExhaustedError) or "RESOURCE_EXHAUSTED" in text or \
        "out of memory" in text.lower()


def _replica_count(config) -> int:
    """Replicas the config's strategy will have on this host, found before TensorFlow initialises."""
    import tensorflow as tf

    from tfgpu.runtime import distribute

    distribute.configure_devices(RuntimeConfig.of(config))  # setup() applies them again: a no-op before init
    gpus = len(tf.config.get_visible_devices("GPU"))
    kind = distribute.choose_kind(RuntimeConfig.of(config), gpus, 1)
    if kind == "one_device":
        return 1
    return gpus or (config.cpu_logical_devices if kind == "mirrored" else 1) or 1


def _macs(model, image_shape):
    from tfgpu.models.summary import count_params, flops_per_example

    try:
        return {"macs_per_example": flops_per_example(model, image_shape), "params": count_params(model)}
    except ValueError:  # a dynamic shape: MFU unknown, the timing stands
        return {"macs_per_example": None, "params": count_params(model)}


def _timed_history():
    """The class of the trainer's history writer that also notes wall and CPU clocks when each train loop's line is
    written (``marks``)."""
    from tfgpu.metrics.history import History

    class TimedHistory(History):
        def __init__(self, model_dir, enabled):
            super().__init__(model_dir, enabled)
            self.marks = {}  # step -> (wall clock, process CPU time)

        def write(self, kind, step, values):
            super().write(kind, step, values)
            if kind == "train":
                self.marks[step] = (time.perf_counter(), time.process_time())

    return TimedHistory


def _run_tfgpu(case: dict, config) -> dict:
    """The tfgpu Trainer for warmup + timed windows; a window ends when its last loop's history line is written
    (so host work between loops counts)."""
    from tfgpu.training import experiment

    if case.get("per_replica_batch_size"):
        config = dataclasses.replace(config, global_batch_size=case["per_replica_batch_size"] * _replica_count(config))
    built = experiment.setup(config, write_config=False, history_class=_timed_history())
    history = built.trainer.history
    built.trainer.train()
    placement = built.placement
    out = {"batch_size": config.global_batch_size,
           "per_replica_batch_size": config.global_batch_size // placement.num_replicas, "strategy": placement.kind,
           "num_replicas": placement.num_replicas, "devices": list(placement.devices),
           "jit_compile_effective": built.task.jit_compile, "steps_per_loop": config.steps_per_loop,
           "xla_scope": XLA_SCOPES["tfgpu"] if built.task.jit_compile else "none",
           "input_to_device": tfgpu_input_to_device(placement)}
    out.update(_device_facts(config, placement.num_replicas))
    if case.get("probe"):
        return out
    ends = [history.marks[case["untimed_steps"] + k * case["steps_per_window"]] for k in range(case["windows"] + 1)]
    wall, cpu = ([b[i] - a[i] for a, b in zip(ends, ends[1:])] for i in (0, 1))
    out.update(window_stats(wall, case["steps_per_window"] * config.global_batch_size, case["steps_per_window"], cpu))
    out.update(_macs(built.task.model, built.info.image_shape))
    return out


def one_device(config):
    """``config`` on one device: the first GPU (the only one made visible) if there is one, else the CPU,
    unsplit. keras_fit, keras_fit_spe and tfgpu_one_device run on it."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU") if config.num_gpus != 0 else []
    return dataclasses.replace(config, distribution_strategy="one_device", cpu_logical_devices=0,
                               num_gpus=1 if gpus else config.num_gpus)


def baseline_placement(config, runner: str, one_device_strategy: bool):
    """The strategy a Keras ``fit`` baseline compiles under: ``keras_fit_strategy`` tfgpu's own; ``keras_fit`` and
    ``keras_fit_spe`` none (what users write: Keras places the model on the first GPU and copies each batch to
    it inside the step) or, with ``--keras_one_device_strategy``, a OneDeviceStrategy on that device, whose
    distributed dataset prefetches batches to the device as tfgpu's input does. ``configure_devices`` first."""
    from tfgpu.runtime import cluster, distribute

    if runner == "keras_fit_strategy":
        return distribute.build_strategy(RuntimeConfig.of(config),
                                         cluster.resolve_for_run(config.cluster, config.distribution_strategy))
    if one_device_strategy:
        alone = dataclasses.replace(config, distribution_strategy="one_device")
        return distribute.build_strategy(RuntimeConfig.of(alone), cluster.resolve_for_run(alone.cluster, "one_device"))
    return None


def tfgpu_input_to_device(placement) -> str:
    """How tfgpu's batches reach its devices (``training/loop.input_iterator`` decides)."""
    from tfgpu.training.loop import host_cpu_only

    if host_cpu_only(placement):
        return "host memory (CPU device; the dataset's own iterator)"
    return "prefetched by the strategy's distributed dataset"


def input_to_device(placement, on_gpu: bool) -> str:
    """How a fit baseline's batches reach the device (the JSON's ``input_to_device``)."""
    if placement is not None:
        return "prefetched by the strategy's distributed dataset"
    return "copied to the GPU inside each step (no strategy)" if on_gpu else "host memory (CPU device)"


def _run_keras_fit(case: dict, config, runner: str) -> dict:
    """Plain Keras 3 compile + fit on the same model, data, batch, precision and XLA setting."""
    import keras
    import tensorflow as tf

    from tfgpu.data import catalog
    from tfgpu.data.input import pipeline
    from tfgpu.models import create_model
    from tfgpu.runtime import distribute, precision
    from tfgpu.tasks.registry import input_config

    if runner != "keras_fit_strategy":  # what a user's own script does: one device, no CPU splitting
        config = one_device(config)
    distribute.configure_devices(RuntimeConfig.of(config))
    placement = baseline_placement(config, runner, case.get("keras_one_device_strategy", False))
    if runner == "keras_fit_strategy" and placement.kind == "one_device":
        return {"status": "skipped", "reason": "the strategy is one_device: keras_fit measures the same thing"}
    if runner == "keras_fit_strategy" and placement.num_workers > 1:
        return {"status": "skipped", "reason": "model.fit cannot train under MultiWorkerMirroredStrategy in Keras 3 "
                "(tfgpu.fit is the call there): the tfgpu run is the measure"}
    replicas = placement.num_replicas if placement else 1
    # MirroredStrategy fails with steps_per_execution > 1 (keras-team/keras#19246); XLA cannot span logical CPUs.
    steps_per_execution = {"keras_fit": case["keras_steps_per_execution"], "keras_fit_spe": config.steps_per_loop,
                           "keras_fit_strategy": 1}[runner]
    jit = config.jit_compile and not (placement and placement.on_logical_cpus)
    keras.utils.set_random_seed(config.seed)
    precision.set_policy(config.precision)
    info = catalog.prepare(DatasetConfig.of(config))
    dataset = pipeline.train_dataset_fn(input_config(config), info, 0)(tf.distribute.InputContext())  # global batches
    with placement.strategy.scope() if placement else contextlib.nullcontext():
        model = create_model(config.model, info.image_shape, info.num_classes)
        model.compile(optimizer=keras.optimizers.SGD(config.base_learning_rate * config.global_batch_size / 256,
                                                     momentum=config.momentum),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"],
                      jit_compile=jit, steps_per_execution=steps_per_execution)
    model.fit(dataset, epochs=1, steps_per_epoch=case["untimed_steps"], verbose=0)
    timer = _epoch_timer()
    model.fit(dataset, epochs=case["windows"], steps_per_epoch=case["steps_per_window"], verbose=0,
              callbacks=[timer])
    on_gpu = bool(tf.config.list_logical_devices("GPU"))
    out = {"batch_size": config.global_batch_size, "per_replica_batch_size": config.global_batch_size // replicas,
           "strategy": placement.kind if placement else "keras_default",
           "num_replicas": replicas, "devices": list(placement.devices) if placement else [],
           "jit_compile_effective": bool(model.jit_compile), "steps_per_execution": steps_per_execution,
           "xla_scope": XLA_SCOPES["keras"] if model.jit_compile else "none",
           "input_to_device": input_to_device(placement, on_gpu)}
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
    from tfgpu import config_sources

    result = {"name": case["runner"], "status": "ok"}
    try:
        config = config_sources.resolve(case["config"])
        if case["runner"] == "tfgpu_one_device":
            config = one_device(config)
        result.update(_run_tfgpu(case, config) if case["runner"] in ("tfgpu", "tfgpu_one_device", "synthetic") else
                      _run_keras_fit(case, config, case["runner"]))
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


