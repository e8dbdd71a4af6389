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


def wrap_optimizer(optimizer: keras.optimizers.Optimizer, config: Config) -> keras.optimizers.Optimizer:
    """Wraps ``optimizer`` in a dynamic LossScaleOptimizer under mixed_float16; else returns it unchanged.

    Every optimizer of a task goes through here (Keras' compile-time wrapping covers only one).
    """
    if config.precision != "mixed_float16":
        return optimizer
    return keras.optimizers.LossScaleOptimizer(
        optimizer, initial_scale=config.initial_loss_scale, dynamic_growth_steps=config.loss_scale_growth_steps)


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
