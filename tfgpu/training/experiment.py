"""One run, start to finish: config → devices and strategy → data → task → trainer → outputs.

Everything that can be checked cheaply is checked before the first heavy step,
so a bad option costs seconds, not a compiled model.
"""
import dataclasses
import logging
import os
import re
import time
from typing import TYPE_CHECKING

from tfgpu.config import Config, ConfigError, DatasetConfig, RuntimeConfig, TrainerConfig
from tfgpu.config_sources import save_yaml
from tfgpu.training import config_change, exporting
from tfgpu.metrics import results
from tfgpu.runtime import run_dir
from tfgpu.metrics.history import PhaseTimer

if TYPE_CHECKING:  # for Setup's field types only: these import TensorFlow, which setup() imports when it runs
    from tfgpu.data.input.dataset_info import DatasetInfo
    from tfgpu.runtime.distribute import Placement
    from tfgpu.tasks.base import Task
    from tfgpu.training.trainer import Trainer

log = logging.getLogger("tfgpu")


def check_model_dir(model_dir: str) -> None:
    """Creates ``model_dir`` and proves it is writable; raises ConfigError(model_dir) otherwise."""
    from tfgpu.runtime import fileio  # local paths or any TensorFlow file system (gs://, ram://)

    try:
        fileio.makedirs(model_dir)
        probe = run_dir.write_probe(model_dir, os.getpid())
        with fileio.open_file(probe, "w") as f:
            f.write("ok")
        fileio.remove(probe)
    except OSError as e:
        raise ConfigError("model_dir", f"{model_dir!r} is not writable: {e.strerror or e}") from None


@dataclasses.dataclass
class Setup:
    """The pieces of a run, built and checked, before any training: what run, evaluate, export and the
    benchmark share."""
    config: Config
    placement: "Placement"
    info: "DatasetInfo"
    task: "Task"
    trainer: "Trainer"
    total_steps: int


UNRESOLVED = object()  # ``setup``'s cluster_desc when the caller has not resolved the cluster


def setup(config: Config, write_config: bool = True, startup: PhaseTimer | None = None,
          cluster_desc=UNRESOLVED, history_class=None, hooks=None) -> Setup:
    """Devices, strategy, data description, task and trainer for ``config``; raises ConfigError early.
    ``startup`` times each phase (the trainer goes on timing it to the end of its first loop). ``cluster_desc``:
    the cluster as ``cluster.resolve_for_run`` describes it (None: this process trains alone), when the caller
    resolved it already; it is resolved here, once, otherwise, and the strategy is built from it.
    ``history_class``: the trainer's history.jsonl writer (default ``History``; the benchmark's also times);
    ``hooks``: the trainer's ``LoopHooks`` (``tfgpu.fit``'s Keras callbacks)."""
    from tfgpu.runtime import cluster

    startup = startup or PhaseTimer(time.time())

    # A cluster that describes this process inconsistently, or a single-worker strategy in a cluster of several,
    # is refused before model_dir is touched: N processes must never train as N chiefs into one directory.
    if cluster_desc is UNRESOLVED:
        cluster_desc = cluster.resolve_for_run(config.cluster, config.distribution_strategy)
    check_model_dir(config.model_dir)
    # Resuming with a change to what is trained stops here, before anything is built (config_change.TRAINED);
    # --precision=auto is compared once resolved, below.
    recorded = None
    if write_config:
        config_change.check_allowed_names(config)
        recorded = config_change.read_recorded(config.model_dir)
        config_change.check(recorded, config)
    # TensorFlow is imported only now, after the cheap checks.
    import keras
    import tensorflow as tf

    from tfgpu import durations
    from tfgpu.runtime import distribute, precision
    from tfgpu.data import catalog
    from tfgpu.data.input import pipeline
    from tfgpu.models import list_models
    from tfgpu.tasks.registry import get_task, input_config
    from tfgpu.training.loop import step_counter
    from tfgpu.training.trainer import Trainer

    startup.mark("tensorflow_import")
    distribute.configure_devices(RuntimeConfig.of(config))
    if config.deterministic:
        tf.config.experimental.enable_op_determinism()
    placement = distribute.build_strategy(RuntimeConfig.of(config), cluster_desc)
    # --precision=auto becomes a policy here, before anything reads it or config.yaml records it.
    config = precision.resolve_config(config, placement)
    accepted = config_change.check(recorded, config)
    try:
        task_class = get_task(config.task)
    except ValueError as e:
        raise ConfigError("task", str(e)) from None
    list_models()  # imports every model family now: some imports draw random numbers
    keras.backend.clear_session()  # a second run in one process starts from the same state as the first
    keras.utils.set_random_seed(config.seed)
    log.info("%s", placement.describe())
    startup.mark("strategy")
    _check_batches(config, placement.num_replicas)
    if config.jit_compile and placement.on_logical_cpus:
        log.warning("--jit_compile is off for this run: XLA cannot compile one replica's step across logical CPU "
                    "devices (it does take effect on GPUs and with one device)")
    elif config.jit_compile and config.sync_batch_norm and placement.num_replicas > 1:
        log.warning("--jit_compile is off for this run: --sync_batch_norm all-reduces inside the forward pass, "
                    "which XLA cannot compile")
    info = catalog.prepare(DatasetConfig.of(config))
    inputs = input_config(config)
    per_epoch = pipeline.steps_per_epoch(inputs, info)
    resumed = _resumed_examples(config, info)
    total_steps = durations.train_steps(durations.of(inputs, "train"), per_epoch, inputs.examples_per_step, resumed)
    startup.mark("dataset")
    log.info("data: %s %s train=%d eval=%s(%d) classes=%d; %d steps of %d examples (%.2f epochs)", info.name,
             info.image_shape, info.num_train_examples, info.eval_split or "none",
             info.split_sizes.get(info.eval_split, 0), info.num_classes, total_steps,
             inputs.examples_per_step, durations.epochs_at(total_steps, per_epoch, inputs.examples_per_step, resumed))
    from tfgpu.models import provenance

    if not write_config:
        provenance.warn_if_changed(config, config.model_dir)
    precision.set_policy(config.precision)
    task = task_class(config, info, placement, total_steps, step_counter(placement.strategy), resumed)
    # config.yaml, model_source.json and the record of each allowed change are written once the checkpoint restored
    # into this run's model and its data position was placed: a resume refused at any point before (a config, model
    # or data change, a checkpoint that does not fit) writes nothing, and no change that never trained is recorded.
    changes = list(accepted)  # the model's own changes join once the models are built, below
    on_restored = ([lambda step, history: _write_run_config(config, changes, step, history)]
                   if placement.is_chief and write_config else [])
    trainer = Trainer(_trainer_config(config, inputs, info), inputs, placement, task, info, total_steps, startup,
                      on_restored, history_class, hooks)
    changes += _check_model(config, task, trainer.checkpointer, recorded, write_config)
    startup.mark("build")  # the task's models and optimizers, the trainer's loops and checkpointer
    return Setup(config, placement, info, task, trainer, total_steps)


def _check_model(config: Config, task, checkpointer, recorded, write_config: bool) -> list:
    """Records the built models' fingerprint in every checkpoint this run saves and, for a training run, compares it
    with the one the checkpoint it resumes recorded: the allowed changes (``config_change.model_changes``), or the
    one-line refusal."""
    import keras

    from tfgpu.models import fingerprint, provenance
    from tfgpu.training import checkpoint

    models = {name: item for name, item in task.checkpoint_items().items() if isinstance(item, keras.Model)}
    current = fingerprint.of(models, provenance.builder_sources(config))
    checkpointer.record_fingerprint(current)
    latest = checkpoint.latest(config.model_dir) if write_config else None
    if latest is None:
        return []
    step = recorded.step if recorded is not None else config_change.resumed_step(config.model_dir)
    # A checkpoint older than fingerprints: the user file's sha256 that model_source.json recorded, if any.
    recorded_fingerprint = checkpoint.recorded_fingerprint(latest) or provenance.recorded_sources(config.model_dir)
    return config_change.model_changes(recorded_fingerprint, current, config, step)


def _resumed_examples(config: Config, info):
    """(step, examples trained by it) of the checkpoint this run resumes, from the data position it records (records
    fed, whatever global batch fed them), or None for a fresh run, synthetic data or a checkpoint without one:
    --train in epochs or examples then counts each segment at its own batch (``durations.train_steps``)."""
    from tfgpu.data.index import position
    from tfgpu.data.input import records
    from tfgpu.training import checkpoint

    latest = checkpoint.latest(config.model_dir)
    record = checkpoint.recorded_data_position(latest) if latest and info.name != "synthetic" else None
    if record is None:
        return None
    fed = position.from_record(record, latest)[0]
    return config_change.resumed_step(config.model_dir), position.records_fed(fed, records.train_records(info))


def _write_run_config(config: Config, changes=(), step: int = 0, history=None) -> None:
    """The chief's config.yaml and model_source.json (which file built a user model); first, for a resume with
    allowed changes, their log lines and history.jsonl records."""
    from tfgpu.models import provenance

    if changes:
        config_change.record(changes, step, history)
    save_yaml(config, run_dir.config_yaml(config.model_dir))
    provenance.write_source_record(config, config.model_dir)


def _trainer_config(config: Config, inputs, info) -> TrainerConfig:
    """The loop's section, its checkpoint interval in steps (--checkpoint_every; its time form is the trainer's
    clock). --eval_every stays as given: the trainer places its steps (``durations.every``) after the restore."""
    from tfgpu import durations
    from tfgpu.data.input import pipeline

    duration = durations.of(config, "checkpoint_every")
    steps = 0 if durations.seconds(duration) else durations.to_steps(duration, pipeline.steps_per_epoch(inputs, info),
                                                                     inputs.examples_per_step)
    return TrainerConfig.of(config, checkpoint_every_steps=steps)


def _check_batches(config: Config, num_replicas: int) -> None:
    if config.global_batch_size % num_replicas:
        raise ConfigError("global_batch_size", f"{config.global_batch_size} is not divisible by the "
                          f"{num_replicas} replicas")
    per_replica = config.global_batch_size // num_replicas
    if per_replica % config.grad_accum_steps:
        raise ConfigError("grad_accum_steps", f"{config.grad_accum_steps} does not divide the per-replica batch "
                          f"{per_replica}")
    eval_batch = config.eval_batch_size or config.global_batch_size
    if eval_batch % num_replicas:
        raise ConfigError("eval_batch_size", f"{eval_batch} is not divisible by the {num_replicas} replicas")


def run(config: Config, startup: PhaseTimer | None = None, cluster_desc=UNRESOLVED, hooks=None) -> dict:
    """Trains (or resumes) the run described by ``config``; returns metrics.json's object (every worker).
    ``startup``: the entrypoint's timer, started when the process did (--target's time_to_target_s counts from
    there) with its ``imports`` marked before TensorFlow's; default a timer started now. ``cluster_desc``: as
    ``setup`` takes it; ``hooks``: the trainer's ``LoopHooks``. A SIGTERM ends it with ``failures.Preempted`` once the checkpoint is saved."""
    started = time.time()
    if startup is None:
        startup = PhaseTimer(started)
        startup.mark("imports")
    import tensorflow as tf

    built = setup(config, startup=startup, cluster_desc=cluster_desc, hooks=hooks)
    config, placement, task = built.config, built.placement, built.task  # config: --precision=auto resolved
    try:
        result = built.trainer.train()
    except tf.errors.InvalidArgumentError as e:
        # An image that does not decode fails inside tf.data, whose error names neither shard nor record.
        found = find_undecodable_image(built.info) if "IteratorGetNext" in e.message else None
        if found is None:
            raise
        raise ConfigError("data_dir" if config.data_dir else "dataset",
                          f"{found[0]}: record {found[1]} holds an image that does not decode ({found[2]}); convert "
                          "the dataset again (--skip_corrupt_records skips unreadable records, not such images)"
                          ) from None
    result = dataclasses.replace(result, wall_time_s=round(time.time() - started, 1), facts=results.RunFacts(
        config.task, config.model, config.precision, placement.kind, placement.num_replicas, placement.num_workers,
        config.global_batch_size))
    if placement.is_chief:
        # After the last record: the trainer's teardown (its input pipeline), then the outputs, phase by phase.
        shutdown = PhaseTimer(built.trainer.history.last_time or time.time(), "shutdown", "the outputs written")
        shutdown.mark("trainer_teardown")
        exported = exporting.export_model(task, run_dir.exported_model(config.model_dir))
        exporting.write_description(config, built.info, exported, task.model_facts())
        shutdown.mark("export")
        results.write(config.model_dir, result)
        _write_report(config.model_dir)
        shutdown.mark("metrics_and_report")
        built.trainer.history.write("shutdown", result.step, shutdown.record())
        log.info("%s", shutdown.describe())
    return result.to_dict()


def find_undecodable_image(info):
    """(file, record index, reason) of the first record of the train or eval split whose image does not decode,
    or None. Each shard is first decoded as a whole by tf.data; only a shard that loses records is walked one
    record at a time."""
    import tensorflow as tf

    from tfgpu.data.schema import tfrecord

    channels = info.image_shape[2]

    def decodes(serialized):
        features = tfrecord.parse_example(serialized, keys=info.record_keys)
        return tf.size(tfrecord.decode_image(features, channels)) >= 0

    for split in dict.fromkeys((info.train_split, info.eval_split)):
        for filename, num_examples in info.split_files.get(split, ()):
            records = tf.data.TFRecordDataset(filename, compression_type="GZIP" if info.compression == "gzip"
                                              else None)
            decoded = records.map(decodes, num_parallel_calls=tf.data.AUTOTUNE).ignore_errors()
            if int(decoded.reduce(0, lambda n, _: n + 1)) == num_examples:
                continue
            try:
                for index, serialized in enumerate(records):
                    try:
                        tfrecord.decode_image(tfrecord.parse_example(serialized, keys=info.record_keys), channels)
                    except tf.errors.InvalidArgumentError as e:
                        reason = re.sub(r"\{\{.*?\}\}", "", e.message).strip().split("\n")[0]
                        return filename, index, reason.split(" [Op:")[0]
            except tf.errors.DataLossError:  # an unreadable shard: the corrupt-record check names it
                continue
    return None


def _write_report(model_dir: str) -> None:
    try:
        from tfgpu.reporting import report
    except ImportError:
        return
    try:
        report.write_report(model_dir)
    except Exception as e:  # a broken plot must not cost the user the finished run
        log.warning("could not write the run report: %s", e)
