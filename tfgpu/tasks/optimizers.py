"""Optimizers and learning-rate schedules built from the config.

The peak learning rate is ``base_learning_rate * global_batch_size / 256``
(linear scaling, Goyal et al. 2017), reached by a linear warmup and followed by
one of ``SCHEDULES``: cosine decay to zero, step decay, or a constant. Warmup and
decay points are durations (steps, epochs or examples: ``tfgpu.durations``). The optimizer is one of
``OPTIMIZERS`` (sgd, adam, adamw). A new schedule or optimizer is an entry here and its name among the flag's
choices in ``config/options.py`` (a leaf, so it cannot read these tables); ``tests/tasks/test_optimizers.py`` ties
the two.
"""
import dataclasses
import math
from typing import Callable

import keras
import tensorflow as tf

from tfgpu import durations
from tfgpu.config import ConfigError, OptimizationConfig


def peak_learning_rate(config: OptimizationConfig) -> float:
    return config.base_learning_rate * config.global_batch_size / 256.0


def _cosine(schedule, step):
    """Half a cosine from the peak at the end of warmup to 0 at the last step."""
    span = float(max(schedule.total_steps - schedule.warmup_steps, 1))
    progress = tf.clip_by_value((step - schedule.warmup_steps) / span, 0.0, 1.0)
    return schedule.peak * 0.5 * (1.0 + tf.cos(math.pi * progress))


def _step(schedule, step):
    """The peak times ``decay_factor`` once per boundary passed."""
    if not schedule.boundaries:
        return tf.constant(schedule.peak)
    drops = tf.add_n([tf.cast(step >= b, tf.float32) for b in schedule.boundaries])
    return schedule.peak * tf.pow(schedule.decay_factor, drops)


def _constant(schedule, step):
    return tf.constant(schedule.peak)


# --lr_schedule: the rate after warmup, by name (Config's lr_schedule choices list the same names).
SCHEDULES = {"cosine": _cosine, "step": _step, "constant": _constant}


@keras.saving.register_keras_serializable("tfgpu")
class WarmupSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup from 0 to ``peak`` over ``warmup_steps``, then the ``SCHEDULES`` entry ``kind``; an unknown
    kind is ConfigError(lr_schedule), never a silent constant rate."""

    def __init__(self, peak, total_steps, warmup_steps=0, kind="cosine", boundaries=(), decay_factor=0.1):
        if kind not in SCHEDULES:
            raise ConfigError("lr_schedule", f"unknown schedule {kind!r}; known: {', '.join(SCHEDULES)}")
        self.peak = float(peak)
        self.total_steps = int(total_steps)
        self.warmup_steps = int(warmup_steps)
        self.kind = kind
        self.boundaries = tuple(int(b) for b in boundaries)
        self.decay_factor = float(decay_factor)

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        warm = float(max(self.warmup_steps, 1))
        warmup = self.peak * tf.minimum(1.0, (step + 1.0) / warm) if self.warmup_steps else self.peak
        return tf.where(step < self.warmup_steps, warmup, SCHEDULES[self.kind](self, step))

    def get_config(self):
        return {"peak": self.peak, "total_steps": self.total_steps, "warmup_steps": self.warmup_steps,
                "kind": self.kind, "boundaries": list(self.boundaries), "decay_factor": self.decay_factor}


class ScheduleAtStep:
    """The learning rate ``schedule(step)`` at the trainer's step, as a no-argument callable the optimizer
    reads at each update (Keras would evaluate a schedule at ``optimizer.iterations``).

    Skipped (non-finite) steps advance the trainer's step but not ``optimizer.iterations``; following the
    trainer's step keeps warmup, decay boundaries (set in epochs of data) and the end of the cosine where
    the configuration put them, the logged rate the one used at that step, and a resumed run on the same
    schedule (the step is checkpointed). Adam's bias correction still counts applied updates.
    """

    def __init__(self, schedule, step):
        self.schedule = schedule
        self.step = step

    def __call__(self):
        return self.schedule(self.step)


def learning_rate_schedule(config: OptimizationConfig, total_steps: int, steps_per_epoch: float,
                           examples_per_step: int, resumed=None) -> WarmupSchedule:
    """The run's schedule, with --warmup and --lr_decay_at (or their older flags) turned into steps.
    ``resumed``: (step, examples trained by it) of the checkpoint resumed, so that a point in epochs falls where
    those epochs' records end after a global batch change (``durations.step_at``)."""
    warmup = durations.step_at(durations.of(config, "warmup"), steps_per_epoch, examples_per_step, resumed)
    boundaries = [durations.step_at(point, steps_per_epoch, examples_per_step, resumed)
                  for point in durations.points(config, "lr_decay_at")]
    return WarmupSchedule(peak_learning_rate(config), total_steps, warmup, config.lr_schedule, boundaries,
                          config.lr_decay_factor)


def decays(variable) -> bool:
    """Weight decay applies to kernels and embeddings, never to BatchNorm parameters or biases."""
    return len(variable.shape) > 1


@dataclasses.dataclass(frozen=True)
class OptimizerKind:
    """What --optimizer=NAME builds: ``build(config, learning_rate)`` -> the inner Keras optimizer, and whether it
    decays weights itself (decoupled) or takes L2 through ``l2_term`` in the task's loss."""
    build: Callable
    decoupled_decay: bool = False


# --optimizer: the classifier's optimizer by name (Config's optimizer choices list the same names).
OPTIMIZERS = {
    "sgd": OptimizerKind(lambda config, lr: keras.optimizers.SGD(lr, momentum=config.momentum,
                                                                 nesterov=config.nesterov)),
    "adam": OptimizerKind(lambda config, lr: keras.optimizers.Adam(lr)),
    "adamw": OptimizerKind(lambda config, lr: keras.optimizers.AdamW(lr, weight_decay=config.weight_decay),
                           decoupled_decay=True),
}


def optimizer_kind(config: OptimizationConfig) -> OptimizerKind:
    """The ``OPTIMIZERS`` entry --optimizer names; ConfigError(optimizer) for an unknown name."""
    if config.optimizer not in OPTIMIZERS:
        raise ConfigError("optimizer", f"unknown optimizer {config.optimizer!r}; known: {', '.join(OPTIMIZERS)}")
    return OPTIMIZERS[config.optimizer]


def create_optimizer(config: OptimizationConfig, learning_rate) -> keras.optimizers.Optimizer:
    """The inner optimizer (before loss-scale wrapping). Only a decoupled one (adamw) decays weights itself; sgd
    and adam get L2 through ``l2_term`` in the task's loss."""
    return optimizer_kind(config).build(config, learning_rate)


def exclude_from_decay(optimizer, variables) -> None:
    """Tells a decoupled-decay optimizer to skip BN parameters and biases."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    if isinstance(inner, keras.optimizers.AdamW):
        inner.exclude_from_weight_decay(var_list=[v for v in variables if not decays(v)])


def l2_coefficient(config: OptimizationConfig) -> float:
    """The weight decay the task's loss carries as an L2 term: --weight_decay, 0 for adamw (decoupled)."""
    if not config.weight_decay or optimizer_kind(config).decoupled_decay:
        return 0.0
    return config.weight_decay


def l2_term(coefficient: float, variables, num_replicas: int):
    """0.5 * coefficient * sum(w^2) over decayed variables, divided by the replicas (their gradients are summed),
    so each weight's gradient gains exactly ``coefficient * w``; a constant 0 when the coefficient is 0."""
    if not coefficient:
        return tf.constant(0.0)
    squares = [tf.reduce_sum(tf.square(tf.cast(v, tf.float32))) for v in variables if decays(v)]
    return 0.5 * coefficient * tf.add_n(squares) / num_replicas
