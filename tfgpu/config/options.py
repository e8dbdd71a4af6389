"""Every shared option of a run, declared once: ``Config``, the one frozen run configuration (each field's default,
type, help, ``--help`` group and allowed values), ``TaskOptions``, the base of a task's own options section (e.g. the
GAN's in ``tasks/gan/options.py``), and ``coerce_to``, which turns a YAML or flag value into an option's type.

Precedence, lowest to highest: field defaults < YAML file (``--config``) < flagfile and command line (command line
last, so it wins); ``tfgpu.config_sources`` reads those sources, builds the task's section from the flat values
and checks what the values name, because this package is a leaf that imports nothing else of tfgpu. Every option
field (here or in a task's section) becomes a flag of the same name, with the help text and group given with it.
"""
import dataclasses
import typing


class ConfigError(ValueError):
    """A bad option value; ``flag`` names the option so the user knows what to fix."""

    def __init__(self, flag: str, message: str):
        super().__init__(f"--{flag}: {message}")
        self.flag = flag
        self.reason = message

    def __reduce__(self):
        """Rebuilt from its flag and reason, so the error crosses a process (a converter worker's, a spawn pool's)
        as the same one line; the default rebuild passes the joined message alone and fails."""
        return type(self), (self.flag, self.reason)


def option(default, help: str, group: str, choices: tuple | None = None):
    """A field that is a flag of its own name: its default, help text, ``--help`` group and allowed values."""
    return dataclasses.field(default=default, metadata={"help": help, "group": group, "choices": choices})


PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")  # the policies; --precision also takes auto
STRATEGIES = ("auto", "one_device", "mirrored", "multi_worker_mirrored")


def _check_choices(options) -> None:
    """ConfigError naming the first field of ``options`` (a Config or a TaskOptions) outside its choices."""
    for f in dataclasses.fields(options):
        choices = f.metadata.get("choices")
        if choices and getattr(options, f.name) not in choices:
            raise ConfigError(f.name, f"{getattr(options, f.name)!r} is not one of {', '.join(map(str, choices))}")


class TaskOptions:
    """Base of a task's own options section: a frozen dataclass of ``option`` fields in the task's package
    (``tasks/gan/options.py``), listed by task name in ``tasks/options.py``. Users set its fields as flat flags;
    ``Config.task_options`` holds the run's instance and the task reads it as ``XOptions.of(config)``."""
    task: typing.ClassVar[str]

    @classmethod
    def of(cls, config: "Config"):
        """``config``'s section of this task: the one it holds, or the defaults when it was built without one."""
        held = config.task_options
        if held is None:
            return cls()
        if not isinstance(held, cls):
            raise TypeError(f"the config of --task={config.task} holds {type(held).__name__}, not {cls.__name__}")
        return held

    def check(self, config: "Config") -> None:
        """Checks the section's values (and rules tying them to the shared options); ConfigError naming the flag."""
        _check_choices(self)


@dataclasses.dataclass(frozen=True)
class Config:
    # -- experiment ---------------------------------------------------------
    task: str = option("classification", "What a step computes: classification (one softmax over the classes), "
                       "multilabel (one sigmoid per label) or gan.", "experiment")
    model_dir: str = option("", "Directory for checkpoints, summaries, config.yaml and metrics.json. Required.",
                            "experiment")
    seed: int = option(42, "Seed for weights, data order and augmentation.", "experiment")
    deterministic: bool = option(False, "Bit-reproducible run: op determinism and a deterministic input pipeline "
                                 "(slower; same flags give the same weights).", "experiment")
    train: str = option("", "How long to train: N (optimizer steps), Nep (epochs) or Nex (examples), e.g. 90ep; "
                        "empty = --train_steps, else --epochs.", "experiment")
    train_steps: int = option(0, "Optimizer steps to train; wins over --epochs when > 0.", "experiment")
    epochs: float = option(1.0, "Passes over the train split, used when --train_steps is 0.", "experiment")
    steps_per_loop: int = option(100, "Train steps inside one tf.function call (one host round trip).", "experiment")
    checkpoint_every: str = option("", "Save a checkpoint every N steps, Nep (epochs), Nex (examples) or a time (Ns, "
                                   "Nmin, Nh: at the first loop end after it, as the chief's clock says), and always "
                                   "at the end; empty = --checkpoint_every_steps.", "experiment")
    checkpoint_every_steps: int = option(1000, "Save a checkpoint every N steps (and always at the end); 0 = end only.",
                                         "experiment")
    keep_checkpoints: int = option(3, "How many recent checkpoints to keep.", "experiment")
    eval_every: str = option("", "Evaluate every N steps, Nep (epochs) or Nex (examples), and always at the end; "
                             "empty = --eval_every_steps.", "experiment")
    eval_every_steps: int = option(0, "Evaluate every N steps (and always at the end); 0 = end only.", "experiment")
    eval_steps: int = option(0, "Eval batches per evaluation; 0 = the whole eval split exactly once.", "experiment")
    target: str = option("", "METRIC:VALUE (e.g. val_accuracy:0.97, fid:20): stop at the first evaluation that "
                         "reaches it, after a checkpoint, and exit 0; metrics ending in loss, fid or kid (or declared "
                         "lower-is-better) must fall to VALUE, others rise to it. With --eval_every_steps=0 a target "
                         "evaluates once per epoch. Empty = train the whole schedule.", "experiment")
    max_nonfinite_steps: int = option(20, "Stop the run (exit 2) when this many steps in a row, with no finite "
                                      "step between them (across loops), have a non-finite loss or gradient; each "
                                      "such step is skipped and changes no weight. Scattered skips never stop it.",
                                      "experiment")
    allow_config_change: str = option("", "FIELD[,FIELD]: resume in a model_dir whose recorded config.yaml differs "
                                      "from this run in these fields that change what is trained (e.g. "
                                      "global_batch_size); the change is recorded in history.jsonl and the report. "
                                      "Any other such change stops the run, naming the field with old and new value.",
                                      "experiment")
    # -- distribute ---------------------------------------------------------
    distribution_strategy: str = option("auto", "auto: multi_worker_mirrored when the cluster has more than one "
                                        "worker, mirrored when more than one GPU is visible, else one_device.",
                                        "distribute", STRATEGIES)
    num_gpus: int = option(-1, "GPUs to use on this host; -1 = all visible.", "distribute")
    all_reduce_alg: str = option("", "Cross-device all-reduce: nccl|hierarchical_copy (mirrored), auto|ring|nccl "
                                 "(multi_worker_mirrored); empty = TensorFlow's default.", "distribute",
                                 ("", "nccl", "hierarchical_copy", "auto", "ring"))
    cpu_logical_devices: int = option(0, "Split the CPU into N logical devices so mirrored runs N replicas on CPU "
                                      "(testing without GPUs); 0 = off.", "distribute")
    gpu_memory_growth: bool = option(True, "Allocate GPU memory as needed instead of all at start.", "distribute")
    cluster: str = option("auto", "Where multi-worker cluster membership comes from: auto (TF_CONFIG, else Slurm), "
                          "tf_config or slurm.", "distribute", ("auto", "tf_config", "slurm"))
    collective_timeout_s: float = option(0.0, "Fail a multi-worker collective (all-reduce) that waits longer than "
                                         "this, so survivors of a dead worker exit instead of hanging; 0 = never.",
                                         "distribute")
    max_restarts: int = option(0, "After a failed collective (exit 129), restart this worker process up to N times "
                               "(same PID, resumes from the last checkpoint) instead of exiting; for clusters that "
                               "restart the lost worker themselves.", "distribute")
    # -- precision ----------------------------------------------------------
    precision: str = option("float32", "Compute dtype policy; logits and losses stay float32. auto: mixed_bfloat16 on "
                            "GPUs of compute capability >= 8.0 and on CPUs with AMX (with AVX512_BF16 alone float32, "
                            "which ran faster there), mixed_float16 on 7.x, else float32 (the oldest GPU, or worker, "
                            "decides); resolved when the run starts, and config.yaml records the result.", "precision",
                            PRECISIONS + ("auto",))
    jit_compile: bool = option(False, "Classification: compile each replica's forward and backward pass with XLA, "
                               "under every strategy (not on logical CPU devices, nor with --sync_batch_norm over "
                               "several replicas). The GAN task does not compile with XLA.", "precision")
    allreduce_dtype: str = option("float32", "Dtype gradients cross the wire in: each replica's float32 gradients are "
                                  "cast to it before the cross-replica sum and back after (bfloat16 or float16 halve "
                                  "the bytes; float16 sums that overflow skip the step like any non-finite gradient). "
                                  "No effect with one replica.", "precision", ("float32", "bfloat16", "float16"))
    initial_loss_scale: float = option(32768.0, "Starting dynamic loss scale for mixed_float16.", "precision")
    loss_scale_growth_steps: int = option(2000, "Finite steps before the float16 loss scale doubles.", "precision")
    # -- data ---------------------------------------------------------------
    dataset: str = option("", "Built-in dataset (digits, mnist5k, synthetic) or tfds:NAME; ignored when --data_dir "
                          "is set.", "data")
    data_dir: str = option("", "A dataset converted by tfgpu.convert (directory with dataset.json).", "data")
    data_cache_dir: str = option("", "Where built-in datasets are converted to TFRecords once; "
                                 "default $TFGPU_DATA_CACHE or ~/.cache/tfgpu.", "data")
    tfds_data_dir: str = option("", "tensorflow_datasets data dir for --dataset=tfds:NAME; empty = TFDS's default "
                                "(~/tensorflow_datasets).", "data")
    download: bool = option(False, "Let --dataset=tfds:NAME download and prepare data missing from "
                            "--tfds_data_dir; otherwise tfgpu never touches the network.", "data")
    train_split: str = option("train", "Split to train on.", "data")
    eval_split: str = option("", "Split to evaluate on; empty = val, validation or test, whichever exists; "
                             "'none' = no evaluation (for GANs: no FID/KID).", "data")
    image_size: int = option(0, "Training crop size in pixels; 0 = the dataset's own size.", "data")
    global_batch_size: int = option(128, "Examples per optimizer step, summed over all replicas.", "data")
    eval_batch_size: int = option(0, "Global eval batch; 0 = --global_batch_size.", "data")
    augment: str = option("none", "Training augmentation: none, flip, cifar (pad-crop-flip), "
                          "imagenet (random-resized-crop + flip).", "data", ("none", "flip", "cifar", "imagenet"))
    shuffle_buffer: int = option(10000, "Records mixed together per input pipeline (a window of the epoch's index "
                                 "order; indices are shuffled, not records); 1 = no shuffle, records in shard "
                                 "order.", "data")
    data_workers: int = option(0, "Parallel decode/augment calls per input pipeline; 0 = tf.data AUTOTUNE.", "data")
    deterministic_input: bool = option(True, "Keep the input order a pure function of seed and step (exact resume); "
                                       "false lets tf.data hand out elements as soon as they are ready.", "data")
    data_threadpool_size: int = option(0, "Private tf.data threadpool per input pipeline; 0 = the shared pool.", "data")
    data_service: str = option("", "Run preprocessing on a tf.data service (grpc://dispatcher:port) when it "
                               "outgrows this host; its workers share each epoch (every record once), but the "
                               "order is then no longer tied to the step, so a resumed run's interrupted epoch is "
                               "not exact.", "data")
    skip_corrupt_records: bool = option(False, "Read around unreadable records (each logged once with its shard "
                                        "and index; metrics.json counts them) instead of stopping with the shard's "
                                        "name and record index; every readable record is still trained once per "
                                        "epoch.", "data")
    input_range: tuple = option((-1.0, 1.0), "MIN,MAX: the pixel range images reach a classifier in (training, "
                                "evaluation and the exported model's input), e.g. 0,1 or 0,255 for pretrained weights "
                                "trained that way. GANs always use -1,1.", "data")
    cache: bool = option(False, "Hold the train split in memory after the first pass (decoded when --augment is "
                         "none, flip or cifar; else its encoded records) and the decoded eval images. Without it, "
                         "a pipeline whose decoded train images take at most 256 MiB holds them anyway (logged); "
                         "the batches are the same either way.", "data")
    # -- model --------------------------------------------------------------
    model: str = option("resnet20", "Registered model name (see tfgpu.models.list_models()), or your own builder: "
                        "MODULE:FUNCTION or path/to/file.py:FUNCTION, a function (input_shape, num_classes, "
                        "**kwargs) -> keras.Model.", "model")
    init_weights: str = option("", "Local .weights.h5 or .keras file loaded into the model after it is built and "
                               "before the first step, on every worker (never downloaded); a restored checkpoint "
                               "wins over it.", "model")
    init_skip_mismatch: bool = option(False, "With --init_weights: load the layers whose shapes match (e.g. all but a "
                                      "new classification head) and log the ones skipped, instead of failing.",
                                      "model")
    freeze: str = option("", "Regex over layer names: matching layers are not trained (BatchNorm in them runs in "
                         "inference mode); empty = train everything.", "model")
    unfreeze_at_step: int = option(0, "With --freeze: train every layer from this step on; 0 = never.", "model")
    num_classes: int = option(0, "Classes; 0 = from the dataset manifest.", "model")
    sync_batch_norm: bool = option(False, "Synchronize BatchNorm statistics across replicas.", "model")
    zero_init_residual: bool = option(False, "Zero-init the last BN gamma of each residual block.", "model")
    # -- optimizer ----------------------------------------------------------
    # Classification's optimizer; the GAN has its own Adam pair (--g_learning_rate, --d_learning_rate,
    # --adam_beta1, --adam_beta2) and reads only --grad_clip_norm from this group.
    optimizer: str = option("sgd", "Classification: sgd (with momentum), adam or adamw (the GAN uses Adam, see "
                            "--g_learning_rate).", "optimizer", ("sgd", "adam", "adamw"))
    base_learning_rate: float = option(0.1, "Classification: learning rate per 256 examples; scaled linearly with "
                                       "--global_batch_size.", "optimizer")
    lr_schedule: str = option("cosine", "Classification: after warmup, cosine decay to 0, step decay, or constant.",
                              "optimizer", ("cosine", "step", "constant"))
    warmup: str = option("", "Classification: linear warmup length, N (steps), Nep (epochs) or Nex (examples); "
                         "empty = --warmup_steps, else --warmup_epochs.", "optimizer")
    warmup_epochs: float = option(0.0, "Classification: linear warmup length in epochs.", "optimizer")
    warmup_steps: int = option(0, "Classification: linear warmup length in steps; wins over --warmup_epochs when > 0.",
                               "optimizer")
    lr_decay_epochs: tuple = option((), "Classification: epochs at which the step schedule multiplies the LR by "
                                    "--lr_decay_factor (comma separated).", "optimizer")
    lr_decay_at: str = option("", "Classification: where the step schedule multiplies the LR by --lr_decay_factor, "
                              "durations comma separated (e.g. 30ep,60ep or 5000,8000); empty = --lr_decay_epochs.",
                              "optimizer")
    lr_decay_factor: float = option(0.1, "Classification: step schedule decay factor.", "optimizer")
    momentum: float = option(0.9, "Classification: SGD momentum.", "optimizer")
    nesterov: bool = option(False, "Classification: Nesterov momentum for sgd.", "optimizer")
    weight_decay: float = option(0.0, "Classification: weight decay, never applied to BatchNorm parameters or biases: "
                                 "sgd and adam add weight_decay * w to the gradient (L2, as in the ResNet papers and "
                                 "PyTorch); adamw decays decoupled.", "optimizer")
    label_smoothing: float = option(0.0, "Classification: label smoothing for the cross-entropy loss.", "optimizer")
    grad_clip_norm: float = option(0.0, "Clip the all-reduced gradient to this global norm (each of the GAN's "
                                   "discriminator and generator updates separately); 0 = off.", "optimizer")
    grad_accum_steps: int = option(1, "Classification: split each per-replica batch into N micro-batches and sum "
                                   "their gradients (same step, 1/N activation memory).", "optimizer")
    # -- output -------------------------------------------------------------
    tensorboard: bool = option(True, "Write TensorBoard scalars to <model_dir>/summaries.", "output")
    profile_input: bool = option(False, "Time the input pipeline alone against the train step and report the "
                                 "share of step time spent waiting for data.", "output")
    profile_steps: str = option("", "Capture a TensorBoard profile for steps A,B (e.g. 20,25).", "output")
    verbose: int = option(-1, "Progress output: 0 silent, 1 progress bar, 2 one line per loop; "
                          "-1 = bar on a terminal, lines otherwise.", "output", (-1, 0, 1, 2))

    # -- the task's own options (tasks/options.py), set as flat flags like the fields above ------------------
    task_options: typing.Optional[TaskOptions] = None

    # -- derived values -----------------------------------------------------
    @property
    def allowed_config_changes(self) -> frozenset:
        """The field names --allow_config_change lists."""
        return frozenset(name.strip() for name in self.allow_config_change.split(",") if name.strip())

    @property
    def compute_dtype(self) -> str:
        if self.precision == "auto":  # a concrete policy only exists once experiment.setup resolved it
            raise ValueError("precision 'auto' is not resolved yet: experiment.setup (precision.resolve_config) "
                             "turns it into a policy for this run's devices")
        return {"float32": "float32", "mixed_float16": "float16", "mixed_bfloat16": "bfloat16"}[self.precision]

    def check_values(self) -> "Config":
        """Checks the values themselves, importing nothing (no TensorFlow): a mistake is one line in well under a
        second; raises ConfigError naming the flag. What the values name (files, models, user code, the --target
        metric) is checked by ``tfgpu.config_sources.check_references``."""
        if not self.model_dir:
            raise ConfigError("model_dir", "is required (where checkpoints and metrics go)")
        for name in ("global_batch_size", "steps_per_loop", "keep_checkpoints", "grad_accum_steps",
                     "max_nonfinite_steps"):
            if getattr(self, name) <= 0:
                raise ConfigError(name, f"must be positive, got {getattr(self, name)}")
        for name in ("train_steps", "checkpoint_every_steps", "eval_every_steps", "eval_steps", "eval_batch_size",
                     "cpu_logical_devices", "image_size", "num_classes", "warmup_steps", "warmup_epochs",
                     "weight_decay", "grad_clip_norm", "shuffle_buffer", "collective_timeout_s", "data_workers",
                     "data_threadpool_size", "max_restarts"):
            if getattr(self, name) < 0:
                raise ConfigError(name, f"must be >= 0, got {getattr(self, name)}")
        if self.train_steps == 0 and self.epochs <= 0:
            raise ConfigError("epochs", f"must be positive when --train_steps is 0, got {self.epochs}")
        if self.base_learning_rate <= 0:
            raise ConfigError("base_learning_rate", f"must be positive, got {self.base_learning_rate}")
        if not 0 <= self.label_smoothing < 1:
            raise ConfigError("label_smoothing", f"must be in [0, 1), got {self.label_smoothing}")
        if self.global_batch_size % self.grad_accum_steps:
            raise ConfigError("grad_accum_steps", f"{self.grad_accum_steps} does not divide --global_batch_size "
                              f"{self.global_batch_size}")
        if not (self.data_dir or self.dataset):
            raise ConfigError("dataset", "no data: set --dataset (digits, mnist5k, synthetic, tfds:NAME) or --data_dir")
        if self.augment == "imagenet" and not self.image_size:
            raise ConfigError("image_size", "--augment=imagenet crops to a fixed size; set --image_size (e.g. 224)")
        if len(self.input_range) != 2 or not self.input_range[0] < self.input_range[1]:
            raise ConfigError("input_range", f"expected MIN,MAX with MIN < MAX (e.g. 0,1 or -1,1), got "
                              f"{','.join(f'{v:g}' for v in self.input_range)}")
        low, high = self.input_range
        if any(0 < abs(v) < 1.1754944e-38 for v in (low, high)) or high - low < 1e-6 * max(1.0, abs(low), abs(high)):
            # float32 flushes subnormal values to 0 and cannot tell 256 pixel levels apart in a sliver of a range
            raise ConfigError("input_range", f"{low:g},{high:g} is too narrow for float32 pixels: MAX - MIN must be at "
                              "least 1e-6 of the larger bound (and neither bound a subnormal number)")
        if self.unfreeze_at_step < 0:
            raise ConfigError("unfreeze_at_step", f"must be >= 0, got {self.unfreeze_at_step}")
        if self.unfreeze_at_step and not self.freeze:
            raise ConfigError("unfreeze_at_step", "has nothing to unfreeze: set --freeze=REGEX too")
        if self.freeze:
            import re
            try:
                re.compile(self.freeze)
            except re.error as e:
                raise ConfigError("freeze", f"{self.freeze!r} is not a valid regular expression: {e}") from None
        if self.init_skip_mismatch and not self.init_weights:
            raise ConfigError("init_skip_mismatch", "needs --init_weights=PATH")
        if self.data_service and not self.data_service.startswith(("grpc://", "grpc+local://")):
            raise ConfigError("data_service", f"{self.data_service!r} is not a grpc://host:port address")
        _check_choices(self)
        if self.task_options is not None:
            if self.task_options.task != self.task:
                raise ConfigError("task", f"this run is --task={self.task} but holds the options of "
                                  f"--task={self.task_options.task}")
            self.task_options.check(self)
        return self

    def options(self) -> dict:
        """Every option of this run by its flat (flag) name: the shared fields, then the task's section."""
        held = (self, self.task_options) if self.task_options is not None else (self,)
        return {f.name: getattr(source, f.name) for source in held for f in dataclasses.fields(source)
                if "group" in f.metadata}

    def to_dict(self) -> dict:
        """``options()`` as config.yaml records them (flat keys, lists for tuples)."""
        return {name: list(value) if isinstance(value, tuple) else value for name, value in self.options().items()}


def fields() -> tuple:
    """The shared options (every task's); a task's own are its TaskOptions' (``config_sources.options``)."""
    return tuple(f for f in dataclasses.fields(Config) if "group" in f.metadata)


def field_type(f: dataclasses.Field):
    hints = typing.get_type_hints(Config)
    return hints[f.name]


def coerce_to(name: str, kind: type, value):
    """Converts a YAML/flag value of option ``name`` to ``kind``; raises ConfigError on a mismatch."""
    try:
        if kind is tuple:
            if isinstance(value, str):
                value = [v for v in value.split(",") if v.strip()]
            return tuple(float(v) for v in value)
        if kind is bool:
            if isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
                return value.lower() in ("true", "1")
            if not isinstance(value, bool):
                raise TypeError
            return value
        if kind is int and isinstance(value, float) and not value.is_integer():
            raise TypeError
        if kind is float and isinstance(value, bool):
            raise TypeError
        if kind is str and not isinstance(value, str):
            raise TypeError  # str() would turn a YAML list, number or null into a silently wrong string
        return kind(value)
    except (TypeError, ValueError):
        raise ConfigError(name, f"expected {kind.__name__}, got {value!r}") from None
