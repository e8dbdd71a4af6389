"""One run, start to finish: config → devices and strategy → data → task → trainer → outputs.

Everything that can be checked cheaply is checked before the first heavy step,
so a bad option costs seconds, not a compiled model.
"""
import json
import logging
import os
import time

from tfgpu.config import Config, ConfigError, save_yaml
from tfgpu.fileio import atomic_write_bytes

log = logging.getLogger("tfgpu")


def check_model_dir(model_dir: str) -> None:
    """Creates ``model_dir`` and proves it is writable; raises ConfigError(model_dir) otherwise."""
    try:
        os.makedirs(model_dir, exist_ok=True)
        probe = os.path.join(model_dir, f".write-test-{os.getpid()}")
        with open(probe, "w") as f:
            f.write("ok")
        os.unlink(probe)
    except OSError as e:
        raise ConfigError("model_dir", f"{model_dir!r} is not writable: {e.strerror or e}") from None


def run(config: Config) -> dict:
    """Trains (or resumes) the run described by ``config``; returns the final metrics the chief writes."""
    check_model_dir(config.model_dir)
    # TensorFlow is imported only now, after the cheap checks.
    import tensorflow as tf

    from tfgpu import distribute, precision
    from tfgpu.data import pipeline
    from tfgpu.tasks.base import get_task
    from tfgpu.trainer import Trainer

    started = time.time()
    distribute.configure_devices(config)
    if config.deterministic:
        tf.config.experimental.enable_op_determinism()
    placement = distribute.build_strategy(config)
    import keras

    keras.utils.set_random_seed(config.seed)
    log.info("%s", placement.describe())
    if config.global_batch_size % placement.num_replicas:
        raise ConfigError("global_batch_size", f"{config.global_batch_size} is not divisible by the "
                          f"{placement.num_replicas} replicas")
    per_replica = config.global_batch_size // placement.num_replicas
    if per_replica % config.grad_accum_steps:
        raise ConfigError("grad_accum_steps", f"{config.grad_accum_steps} does not divide the per-replica batch "
                          f"{per_replica}")
    eval_batch = config.eval_batch_size or config.global_batch_size
    if eval_batch % placement.num_replicas:
        raise ConfigError("eval_batch_size", f"{eval_batch} is not divisible by the {placement.num_replicas} "
                          "replicas")
    if config.jit_compile and placement.on_logical_cpus:
        log.warning("--jit_compile is off for this run: XLA cannot compile one replica's step across logical CPU "
                    "devices (it does take effect on GPUs and with one device)")
    elif config.jit_compile and config.sync_batch_norm and placement.num_replicas > 1:
        log.warning("--jit_compile is off for this run: --sync_batch_norm all-reduces inside the forward pass, "
                    "which XLA cannot compile")
    info = pipeline.prepare(config)
    total_steps = pipeline.resolve_train_steps(config, info)
    log.info("data: %s %s train=%d eval=%s(%d) classes=%d; %d steps of %d examples (%.2f epochs)", info.name,
             info.image_shape, info.num_train_examples, info.eval_split or "none",
             info.split_sizes.get(info.eval_split, 0), info.num_classes, total_steps, config.global_batch_size,
             total_steps / pipeline.steps_per_epoch(config, info))
    if placement.is_chief:
        save_yaml(config, os.path.join(config.model_dir, "config.yaml"))
    precision.set_policy(config.precision)
    try:
        task = get_task(config.task)(config, info, placement, total_steps)
    except ValueError as e:
        raise ConfigError("task", str(e)) from None
    trainer = Trainer(config, placement, task, info, total_steps)
    metrics = trainer.train()
    metrics.update({"task": config.task, "model": config.model, "precision": config.precision,
                    "strategy": placement.kind, "num_replicas": placement.num_replicas,
                    "num_workers": placement.num_workers, "global_batch_size": config.global_batch_size,
                    "wall_time_s": round(time.time() - started, 1)})
    if placement.is_chief:
        export_path = os.path.join(config.model_dir, "export", "model.keras")
        os.makedirs(os.path.dirname(export_path), exist_ok=True)
        tmp = os.path.join(os.path.dirname(export_path), f".tmp-{os.getpid()}.keras")
        task.export(tmp)
        if os.path.exists(tmp):
            os.replace(tmp, export_path)
        atomic_write_bytes(os.path.join(config.model_dir, "metrics.json"),
                           json.dumps(metrics, indent=2, sort_keys=True).encode())
        _write_report(config.model_dir)
    return metrics


def _write_report(model_dir: str) -> None:
    try:
        from tfgpu import report
    except ImportError:
        return
    try:
        report.write_report(model_dir)
    except Exception as e:  # a broken plot must not cost the user the finished run
        log.warning("could not write the run report: %s", e)
