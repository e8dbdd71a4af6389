"""Optimizers and learning-rate schedules built from the config.

The peak learning rate is ``base_learning_rate * global_batch_size / 256``
(linear scaling, Goyal et al. 2017), reached by a linear warmup and followed by
cosine decay to zero, step decay, or a constant.
"""
import math

import keras
import tensorflow as tf

from tfgpu.config import OptimizationConfig


def peak_learning_rate(config: OptimizationConfig) -> float:
    return config.base_learning_rate * config.global_batch_size / 256.0


@keras.saving.register_keras_serializable("tfgpu")
class WarmupSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup from 0 to ``peak`` over ``warmup_steps``, then cosine, step or constant."""

    def __init__(self, peak, total_steps, warmup_steps=0, kind="cosine", boundaries=(), decay_factor=0.1):
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
        if self.kind == "cosine":
            span = float(max(self.total_steps - self.warmup_steps, 1))
            progress = tf.clip_by_value((step - self.warmup_steps) / span, 0.0, 1.0)
            after = self.peak * 0.5 * (1.0 + tf.cos(math.pi * progress))
        elif self.kind == "step":
            drops = tf.add_n([tf.cast(step >= b, tf.float32) for b in self.boundaries]) if self.boundaries else 0.0
            after = self.peak * tf.pow(self.decay_factor, drops)
        else:
            after = tf.constant(self.peak)
        return tf.where(step < self.warmup_steps, warmup, after)

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


def learning_rate_schedule(config: OptimizationConfig, total_steps: int, steps_per_epoch: float) -> WarmupSchedule:
    warmup = config.warmup_steps or int(round(config.warmup_epochs * steps_per_epoch))
    boundaries = [int(round(e * steps_per_epoch)) for e in config.lr_decay_epochs]
    return WarmupSchedule(peak_learning_rate(config), total_steps, warmup, config.lr_schedule, boundaries,
                          config.lr_decay_factor)


def decays(variable) -> bool:
    """Weight decay applies to kernels and embeddings, never to BatchNorm parameters or biases."""
    return len(variable.shape) > 1


def create_optimizer(config: OptimizationConfig, learning_rate) -> keras.optimizers.Optimizer:
    """The inner optimizer (before loss-scale wrapping). Only adamw decays decoupled; sgd and adam get L2
    through ``l2_penalty`` in the task's loss."""
    if config.optimizer == "sgd":
        return keras.optimizers.SGD(learning_rate, momentum=config.momentum, nesterov=config.nesterov)
    if config.optimizer == "adam":
        return keras.optimizers.Adam(learning_rate)
    if config.optimizer == "adamw":
        return keras.optimizers.AdamW(learning_rate, weight_decay=config.weight_decay)
    raise ValueError(f"unknown optimizer {config.optimizer!r}")


def exclude_from_decay(optimizer, variables) -> None:
    """Tells a decoupled-decay optimizer to skip BN parameters and biases."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    if isinstance(inner, keras.optimizers.AdamW):
        inner.exclude_from_weight_decay(var_list=[v for v in variables if not decays(v)])


def l2_penalty(config: OptimizationConfig, variables, num_replicas: int):
    """0.5 * wd * sum(w^2) over decayed variables, divided by the replicas (their gradients are summed),
    so each weight's gradient gains exactly ``weight_decay * w``. Zero for adamw (decoupled)."""
    if not config.weight_decay or config.optimizer == "adamw":
        return tf.constant(0.0)
    squares = [tf.reduce_sum(tf.square(tf.cast(v, tf.float32))) for v in variables if decays(v)]
    return 0.5 * config.weight_decay * tf.add_n(squares) / num_replicas


def clip_by_global_norm(grads, clip_norm: float, loss_scale, num_replicas: int, summed: bool = False):
    """Clips the all-reduced gradient to ``clip_norm`` (measured unscaled) and returns per-replica shares.

    Keras clips each replica's partial gradient before the all-reduce; this clips the true global
    gradient instead. The optimizer sums the returned shares over replicas, giving the clipped sum.
    ``summed``: ``grads`` are the cross-replica sum already (--allreduce_dtype; pass ``num_replicas=1``),
    clipped as they are. Returns (grads, global_norm).
    """
    ctx = tf.distribute.get_replica_context()
    total = grads if summed or not ctx else ctx.all_reduce(tf.distribute.ReduceOp.SUM, grads)
    norm = tf.linalg.global_norm([tf.cast(g, tf.float32) for g in total]) / loss_scale
    factor = tf.minimum(1.0, clip_norm / (norm + 1e-12))
    return [g * tf.cast(factor / num_replicas, g.dtype) for g in total], norm
