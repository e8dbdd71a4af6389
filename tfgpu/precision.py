"""Mixed precision: the Keras dtype policy and dynamic loss scaling for float16.

Models compute in the policy's dtype; ``tfgpu.models.create_model`` keeps
logits in float32 and tasks compute losses in float32. Only float16 needs a
loss scale (bfloat16 has float32's exponent range).
"""
import keras
import tensorflow as tf

from tfgpu.config import Config


def set_policy(precision: str) -> None:
    """Sets the global Keras dtype policy; call before building models."""
    keras.mixed_precision.set_global_policy(precision)


_NEVER_GROW = 2 ** 30  # growth interval of the scale-1 guard used without float16


def wrap_optimizer(optimizer: keras.optimizers.Optimizer, config: Config) -> keras.optimizers.Optimizer:
    """Wraps ``optimizer`` in a LossScaleOptimizer: dynamic loss scaling under mixed_float16, otherwise a
    scale of 1 (exact in float32) that only serves to skip non-finite updates without touching any state.

    Every optimizer of a task goes through here (Keras' compile-time wrapping covers only one).
    """
    if config.precision == "mixed_float16":
        return keras.optimizers.LossScaleOptimizer(
            optimizer, initial_scale=config.initial_loss_scale, dynamic_growth_steps=config.loss_scale_growth_steps)
    return keras.optimizers.LossScaleOptimizer(optimizer, initial_scale=1.0, dynamic_growth_steps=_NEVER_GROW)


def apply_if_finite(optimizer, loss, grads, variables, clip_norm: float = 0.0, num_replicas: int = 1):
    """Applies ``grads`` unless the loss or a gradient on *any* replica is non-finite; returns (finite, norm).

    Keras' LossScaleOptimizer checks only the first replica's local gradients, so finiteness is decided here
    with an all-reduce, and a bad step poisons every replica's gradients so all of them skip it (and the
    float16 scale backs off). ``clip_norm`` > 0 clips the all-reduced gradient (``norm`` is measured first).
    """
    from tfgpu import optimizers

    local_bad = tf.logical_not(tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in grads] +
                                             [tf.math.is_finite(loss)]))
    ctx = tf.distribute.get_replica_context()
    bad = ctx.all_reduce(tf.distribute.ReduceOp.SUM, tf.cast(local_bad, tf.float32)) if ctx else \
        tf.cast(local_bad, tf.float32)
    finite = tf.equal(bad, 0.0)
    norm = None
    if clip_norm:
        grads, norm = optimizers.clip_by_global_norm(grads, clip_norm, current_loss_scale(optimizer), num_replicas)
    poison = tf.where(finite, 0.0, float("nan"))
    optimizer.apply([g + tf.cast(poison, g.dtype) for g in grads], variables)
    return finite, norm


def restore_if_not_finite(finite, variables, saved) -> None:
    """Puts back state a skipped step's forward pass changed (BatchNorm statistics, spectral-norm vectors)."""
    for variable, value in zip(variables, saved):
        variable.assign(tf.where(finite, variable.value, value))


def scale_loss(optimizer, loss):
    """Multiplies ``loss`` by the optimizer's current loss scale (no-op without loss scaling)."""
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return optimizer.scale_loss(loss)
    return loss


def current_loss_scale(optimizer):
    """The optimizer's current dynamic loss scale as a float32 tensor, or 1.0 without loss scaling."""
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return tf.cast(tf.convert_to_tensor(optimizer.dynamic_scale), tf.float32)
    return tf.constant(1.0, tf.float32)
