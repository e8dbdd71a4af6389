"""The GAN's losses (per example, on float32 logits) and the float32 forward pass its penalties need."""
import keras
import tensorflow as tf


def discriminator_loss(kind: str, real_logits, fake_logits):
    if kind in ("non_saturating", "minimax"):
        return tf.nn.softplus(-real_logits) + tf.nn.softplus(fake_logits)
    if kind == "wasserstein":
        return fake_logits - real_logits
    if kind == "hinge":
        return tf.nn.relu(1.0 - real_logits) + tf.nn.relu(1.0 + fake_logits)
    raise ValueError(f"unknown GAN loss {kind!r}")


def generator_loss(kind: str, fake_logits):
    if kind == "non_saturating":
        return tf.nn.softplus(-fake_logits)  # -log D(G(z))
    if kind == "minimax":
        return -tf.nn.softplus(fake_logits)  # log(1 - D(G(z)))
    if kind in ("wasserstein", "hinge"):
        return -fake_logits
    raise ValueError(f"unknown GAN loss {kind!r}")


class Float32Forward:
    """While open, every layer of ``model`` computes in float32 (its variables are float32 already), so a
    forward pass traced inside runs in float32 whatever the mixed policy; on exit the policies are back.

    Opened around the penalty's forward pass while a step is traced. MirroredStrategy traces its replicas
    in threads that run one at a time and pause only at cross-replica calls (synchronized BatchNorm), each
    replica at the same point of the same code, so the override is counted: it ends when the last replica
    that opened it closes it."""

    def __init__(self, model: keras.Model):
        self._layers = [layer for layer in model._flatten_layers(include_self=True)
                        if layer.dtype_policy.compute_dtype != "float32"]
        self._policies = [layer.dtype_policy for layer in self._layers]
        self._open = 0

    def __enter__(self):
        if self._open == 0:
            for layer in self._layers:
                layer.dtype_policy = "float32"
        self._open += 1

    def __exit__(self, *exc):
        self._open -= 1
        if self._open == 0:
            for layer, policy in zip(self._layers, self._policies):
                layer.dtype_policy = policy
