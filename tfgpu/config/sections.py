"""The slices of the Config each subsystem receives (``RuntimeConfig.of(config)``): a subsystem's signature names
exactly the options it reads, while users still set flat flags. Every field is a Config option of the same type
or a value the caller derives (tests/config/test_sections.py)."""
import dataclasses
import typing

if typing.TYPE_CHECKING:
    from tfgpu.config.options import Config


class Section:
    """A subsystem's slice of the Config: exactly the options it reads, so its signature shows its inputs.
    Users still set flat flags; ``XConfig.of(config)`` picks the slice (derived values included)."""

    @classmethod
    def of(cls, config: "Config", **derived):
        """The slice of ``config``; ``derived`` gives the fields that are not options (e.g. batches_per_step)."""
        return cls(**{f.name: derived[f.name] if f.name in derived else getattr(config, f.name)
                      for f in dataclasses.fields(cls)})

    @classmethod
    def defaults(cls, **fields):
        """The slice of the options' defaults, with ``fields`` set: the settings of a subsystem used outside a
        command (``import tfgpu``'s strategy, a probe), as a command with no flags would set it."""
        from tfgpu.config.options import Config

        return dataclasses.replace(cls.of(Config()), **fields)


@dataclasses.dataclass(frozen=True)
class RuntimeConfig(Section):
    """Devices and strategy (runtime/distribute.py)."""
    distribution_strategy: str
    num_gpus: int
    all_reduce_alg: str
    cpu_logical_devices: int
    gpu_memory_growth: bool
    cluster: str
    collective_timeout_s: float


@dataclasses.dataclass(frozen=True)
class PrecisionConfig(Section):
    """The dtype policy and loss scaling an optimizer is wrapped with (runtime/precision.py)."""
    precision: str
    allreduce_dtype: str
    initial_loss_scale: float
    loss_scale_growth_steps: int


@dataclasses.dataclass(frozen=True)
class DatasetConfig(Section):
    """Which dataset a run names and how it is described (data/catalog.py)."""
    dataset: str
    data_dir: str
    data_cache_dir: str
    tfds_data_dir: str
    download: bool
    train_split: str
    eval_split: str
    image_size: int
    num_classes: int
    skip_corrupt_records: bool


@dataclasses.dataclass(frozen=True)
class InputConfig(Section):
    """How the train and eval pipelines read a dataset, and how many steps make the schedule (data/input/pipeline.py).
    ``batches_per_step`` is the task's declaration (Task.batches_per_step): ``tasks.registry.input_config``."""
    seed: int
    global_batch_size: int
    eval_batch_size: int
    batches_per_step: int
    train: str
    train_steps: int
    epochs: float
    eval_steps: int
    image_size: int
    augment: str
    input_range: tuple
    shuffle_buffer: int
    data_workers: int
    deterministic_input: bool
    data_threadpool_size: int
    data_service: str
    skip_corrupt_records: bool
    cache: bool

    @classmethod
    def of(cls, config: "Config", batches_per_step: int):
        return super().of(config, batches_per_step=batches_per_step)

    @property
    def examples_per_step(self) -> int:
        """Train examples one optimizer step reads over all replicas."""
        return self.global_batch_size * self.batches_per_step


@dataclasses.dataclass(frozen=True)
class OptimizationConfig(Section):
    """The classifier's optimizer and learning-rate schedule (tasks/optimizers.py)."""
    optimizer: str
    base_learning_rate: float
    global_batch_size: int
    lr_schedule: str
    warmup: str
    warmup_epochs: float
    warmup_steps: int
    lr_decay_at: str
    lr_decay_epochs: tuple
    lr_decay_factor: float
    momentum: float
    nesterov: bool
    weight_decay: float


@dataclasses.dataclass(frozen=True)
class TrainerConfig(Section):
    """The loop's own options (training/trainer.py); the pipeline's come as an InputConfig. experiment.setup turns
    --checkpoint_every into steps (tfgpu.durations); --eval_every stays a duration, whose steps the trainer places
    once it knows the data position it resumed (an epoch ends where its records do, whatever batches came before)."""
    model_dir: str
    steps_per_loop: int
    checkpoint_every_steps: int
    checkpoint_every: str  # read by the trainer only in its time form (5min), which has no steps
    keep_checkpoints: int
    eval_every: str
    eval_every_steps: int
    max_nonfinite_steps: int
    target: str
    init_weights: str
    tensorboard: bool
    profile_input: bool
    allowed_config_changes: frozenset
    profile_steps: str
    verbose: int
    data_dir: str  # only to name the flag of a corrupt record: --data_dir or --dataset


SECTIONS = (RuntimeConfig, PrecisionConfig, DatasetConfig, InputConfig, OptimizationConfig, TrainerConfig)
