"""The Task interface: what one training or evaluation step computes.

The trainer owns the loop, the strategy and the checkpoints; a task owns the
models, optimizers and the math of a step. Every number a step returns is this
replica's *share* of the global value, so summing over replicas gives the
global value of the step (a loss is summed over the replica's examples and
divided by the global batch). The trainer sums shares over replicas and
averages over the steps of a loop.

A task also declares what it logs (``metrics``: names, which are lower-is-better,
which are plotted and how, which count skipped non-finite steps), what the
report adds for it (``report_sections``, ``report_options``), how many batches a
step reads and whether it evaluates without an eval split. The trainer and the
report read these declarations, so they name no task and no task's metric.

What differs per task has a hook whose default is classification's: what a record
holds and how it becomes ``(x, y)`` (``examples``), what the model must output
(``model_output``), how the export's output is described (``model_facts``'s
``output_meaning``). Batches follow Keras' ``(x, y, sample_weight)`` contract,
unpacked by ``unpack_batch``. A task registers itself with ``@register_task`` in
its own module, named once in ``tfgpu.tasks.TASK_MODULES`` (``tasks.registry`` imports what it names).
"""
import abc
import dataclasses

from tfgpu.config import Config, ConfigError
from tfgpu.metrics.metric_specs import MetricSpec  # noqa: F401  (re-exported: tasks declare their metrics with it)

_TASKS: dict = {}


class Stopped(Exception):
    """A stop signal ended an evaluation part way (``Trainer.train`` saves and stops)."""


class EvalRun:
    """What ``Task.evaluate`` is handed: calling it runs the compiled eval loop over the eval split and returns the
    sums as floats; ``check_stop()`` raises ``Stopped`` once a stop signal came (``stop``: the loops' ``StopFlag``),
    for a task that evaluates by other means to call between its own batches (the GAN's FID: sampling, features)."""

    def __init__(self, run, stop):
        self._run = run
        self._stop = stop

    def __call__(self) -> dict:
        return self._run()

    def check_stop(self) -> None:
        if self._stop is not None and self._stop.requested_by is not None:
            raise Stopped()


def register_task(name: str):
    """Registers a Task subclass under ``--task=name``."""

    def decorator(cls):
        if name in _TASKS:
            raise ValueError(f"task {name!r} is registered twice")
        _TASKS[name] = cls
        cls.name = name
        return cls

    return decorator


def unpack_batch(batch):
    """``(x, y, sample_weight)`` of a batch in Keras' contract (``x``, ``(x,)``, ``(x, y)`` or ``(x, y,
    sample_weight)``, each of any structure); absent parts are None. Every task unpacks its batches here."""
    if isinstance(batch, list):
        batch = tuple(batch)
    if not isinstance(batch, tuple):
        return batch, None, None
    if not 1 <= len(batch) <= 3:
        raise ValueError(f"a batch is (x, y, sample_weight) at most, got a tuple of {len(batch)}")
    return (*batch, *(None,) * (3 - len(batch)))


class Task(abc.ABC):
    name = ""
    # Every metric the task may log: the keys ``train_step`` returns, ``learning_rates``/``loss_scales`` keys and
    # the eval keys worth plotting or ranking (tfgpu.metrics.metric_specs.MetricSpec).
    metrics: tuple = ()
    # "module:function" names of functions (metrics dict, eval records) -> markdown lines the report adds.
    report_sections: tuple = ()
    # Options of this task shown in the report's key-config table (after the common ones).
    report_options: tuple = ()
    # Whether a run without an eval split still evaluates (a GAN scores FID/KID on the train split).
    evaluates_without_eval_split = False

    @classmethod
    def batches_per_step(cls, config: Config) -> int:
        """Global batches of the train split one step reads (the trainer hands the step a tuple when > 1)."""
        return 1

    def __init__(self, config: Config, info, placement, total_steps: int, global_step, resumed_examples=None):
        self.config = config
        self.info = info  # tfgpu.data.input.dataset_info.DatasetInfo
        self.placement = placement  # tfgpu.runtime.distribute.Placement
        self.total_steps = total_steps
        # (step, examples trained by it) of the checkpoint this run resumes, or None: a point given in epochs
        # (--warmup, --lr_decay_at) falls where those epochs' records end, whatever batch earlier segments had.
        self.resumed_examples = resumed_examples
        # The run's one step counter (a tf.Variable, ``tfgpu.training.loop.step_counter``); the train loop
        # advances it after each step, skipped or not. Learning-rate schedules and random draws follow it
        # (optimizer.iterations counts only applied updates).
        self.global_step = global_step

    def examples(self):
        """What a record holds and how it becomes ``(x, y)``, for the input pipelines (``data.input.records.Examples``;
        this default: an image and one class index)."""
        from tfgpu.config import InputConfig
        from tfgpu.data.input.records import Examples

        return Examples(InputConfig.of(self.config, self.batches_per_step(self.config)), self.info)

    def model_output(self) -> tuple:
        """What the model must output, for ``models.create_model``'s check: (shape after the batch dimension,
        what that is, as a phrase). This default: one logit per class."""
        n = self.info.num_classes
        return (n,), f"a classifier of {n} classes must give logits of shape (batch, {n})"

    @abc.abstractmethod
    def build(self) -> None:
        """Creates models and optimizers (and builds the optimizers); called inside ``strategy.scope()``."""

    @property
    @abc.abstractmethod
    def train_metric_names(self) -> tuple:
        """Keys of the dict ``train_step`` returns; each is declared in ``metrics``."""

    @abc.abstractmethod
    def train_step(self, batch) -> dict:
        """One optimizer step on this replica's batch, run inside ``strategy.run``; returns metric shares."""

    @abc.abstractmethod
    def checkpoint_items(self) -> dict:
        """Trackables to save and restore (models, optimizers, EMA, ...), by name."""

    def eval_metric_names(self) -> tuple:
        return ()

    def eval_step(self, batch) -> dict:
        """Per-replica sums over one eval batch (weighted by the batch's 0/1 weights)."""
        raise NotImplementedError

    def evaluate(self, run_eval, step: int, model_dir: str) -> dict:
        """Metrics of one evaluation. ``run_eval()`` runs ``eval_step`` over the eval split and returns the
        sums over all replicas and batches as floats (``EvalRun``); a task that evaluates by
        other means calls ``run_eval.check_stop()`` between its batches, so that a stop signal ends it there."""
        return {}

    def learning_rates(self) -> dict:
        """Current learning rates for logs, by name (e.g. {"learning_rate": 0.1})."""
        return {}

    def loss_scales(self) -> dict:
        """Current dynamic loss scales for logs, by name; empty without loss scaling."""
        return {}

    def check_fine_tuning(self, loads_initial_weights: bool) -> None:
        """Refuses fine-tuning options this task cannot honour, as ConfigError naming the flag; called by the
        trainer before it builds anything. ``loads_initial_weights``: no checkpoint will be restored, so
        --init_weights will be read (a task that implements it checks its file here). This default
        implements neither --init_weights nor --freeze."""
        for flag in ("init_weights", "freeze"):
            if getattr(self.config, flag):
                raise ConfigError(flag, f"--task={self.name} does not support it (classification does)")

    def load_initial_weights(self) -> None:
        """Loads --init_weights into the built models; the trainer calls it on every worker, after ``build``
        and only when no checkpoint was restored (a restored checkpoint always wins)."""
        raise ConfigError("init_weights", f"--task={self.name} does not support it (classification does)")

    def step_boundaries(self) -> tuple:
        """Steps at which the task changes what a step trains (e.g. --unfreeze_at_step); the trainer ends a
        loop there and calls ``at_step``."""
        return ()

    def at_step(self, step: int) -> bool:
        """Puts the task in the state for training from ``step`` on (called after a restore, with the step
        restored, and at each of ``step_boundaries``); True when that changed which variables a step trains,
        so the trainer traces its step again."""
        return False

    def model_facts(self) -> dict:
        """What metrics.json and the export's ``<name>.input.json`` state about what the models give, e.g.
        {"model_output": "probabilities"}; strings only. ``"output_meaning"`` is the export's description of
        its output (``training.exporting``: by default "logits, one per class ...")."""
        return {}

    # -- what the task adds to the run's results (metrics.json: tfgpu.metrics.results) ----------------
    def extend_result(self, result):
        """The run's ``results.RunResult`` with what the task adds: by default its ``model_facts`` among the values
        (a task that counts its parameters sets ``parameters`` too)."""
        return dataclasses.replace(result, values={**result.values, **self.model_facts()})

    def describe(self) -> str:
        """One line about the models (parameters, FLOPs) for the start-of-run log."""
        return ""

    @classmethod
    def describe_export(cls, config, info, facts: dict) -> dict | None:
        """What ``<name>.input.json`` says the deployable takes and gives (``training.exporting``), for a task whose
        deployable is not a classifier of pixels (the GAN's generator); None: the classifier's description (pixels
        0..255 in, one output per class, ``facts`` from ``model_facts``)."""
        return None

    # The exports a run writes: variant name ("" = the default, <name>.keras) -> what it is, for input.json.
    export_variants = {"": "the deployable model"}

    @abc.abstractmethod
    def deployable(self, variant: str = ""):
        """The keras.Model users deploy, as export ``variant`` (a key of ``export_variants``)."""

    def export(self, path: str, variant: str = "") -> None:
        """Saves ``deployable(variant)`` to ``path`` (a .keras file)."""
        self.deployable(variant).save(path)
