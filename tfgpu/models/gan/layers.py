"""Layers the GAN networks share: spectrally normalized convolution and dense layers.

``keras.layers.SpectralNormalization`` is not used: it overwrites the wrapped
kernel with ``W / sigma`` on every training call (so the gradient never sees the
``1/sigma`` dependence, and a generator step that runs the discriminator would
rewrite its weights), and its updates are replica-context assignments to
trainable variables. These layers keep ``W`` as the trainable weight and use
``W / sigma(W)`` in the forward pass (Miyato et al. 2018); only the power
iteration vector ``u`` is state, updated when ``training`` is true. ``u`` is the
same on every replica (the weights are), so it is aggregated "only first
replica", which MirroredStrategy and MultiWorkerMirroredStrategy accept in a
replica step. The power iteration runs in float32 whatever the dtype policy.
"""
import keras
import tensorflow as tf
from keras import layers, ops


def _l2_normalize(x, eps=1e-12):
    return x / (tf.norm(x) + eps)


def spectral_normalize(kernel, u, training, power_iterations: int = 1):
    """``kernel / sigma`` with sigma the largest singular value of the kernel viewed as (-1, out) matrix,
    estimated by power iteration from ``u`` (updated in place when ``training``)."""
    w = tf.reshape(tf.cast(kernel, tf.float32), [-1, kernel.shape[-1]])
    u_hat = tf.cast(u, tf.float32)
    v_hat = None
    for _ in range(power_iterations):
        v_hat = _l2_normalize(tf.matmul(u_hat, w, transpose_b=True))
        u_hat = _l2_normalize(tf.matmul(v_hat, w))
    u_hat, v_hat = tf.stop_gradient(u_hat), tf.stop_gradient(v_hat)
    sigma = tf.reduce_sum(tf.matmul(v_hat, w) * u_hat)
    if training:
        u.assign(u_hat)
    return tf.cast(kernel, tf.float32) / sigma


class _SpectralBase(layers.Layer):
    def __init__(self, units, kernel_initializer="glorot_uniform", use_bias=True, power_iterations=1, **kwargs):
        super().__init__(**kwargs)
        self.units = int(units)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.use_bias = use_bias
        self.power_iterations = int(power_iterations)

    def _add_weights(self, kernel_shape):
        # autocast=False: the kernel is read in float32 for the power iteration and cast once afterwards.
        self.kernel = self.add_weight(shape=kernel_shape, initializer=self.kernel_initializer, name="kernel",
                                      autocast=False)
        self.bias = self.add_weight(shape=(self.units,), initializer="zeros", name="bias") if self.use_bias else None
        self.u = self.add_weight(shape=(1, self.units), initializer=keras.initializers.RandomNormal(stddev=1.0),
                                 trainable=False, name="sn_u", autocast=False, aggregation="only_first_replica")

    def normalized_kernel(self, training):
        return spectral_normalize(self.kernel.value, self.u, training, self.power_iterations)

    def get_config(self):
        return {**super().get_config(), "units": self.units, "use_bias": self.use_bias,
                "power_iterations": self.power_iterations,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer)}


@keras.saving.register_keras_serializable("tfgpu")
class SNDense(_SpectralBase):
    """Dense layer whose kernel is divided by its spectral norm."""

    def build(self, input_shape):
        self._add_weights((int(input_shape[-1]), self.units))

    def call(self, inputs, training=False):
        kernel = ops.cast(self.normalized_kernel(training), inputs.dtype)
        outputs = ops.matmul(inputs, kernel)
        return outputs + self.bias if self.bias is not None else outputs

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.units,)


@keras.saving.register_keras_serializable("tfgpu")
class SNConv2D(_SpectralBase):
    """2-D convolution (NHWC, 'same' padding) whose kernel is divided by its spectral norm."""

    def __init__(self, filters, kernel_size, strides=1, **kwargs):
        super().__init__(filters, **kwargs)
        self.kernel_size = int(kernel_size)
        self.strides = int(strides)

    def build(self, input_shape):
        self._add_weights((self.kernel_size, self.kernel_size, int(input_shape[-1]), self.units))

    def call(self, inputs, training=False):
        kernel = ops.cast(self.normalized_kernel(training), inputs.dtype)
        outputs = ops.conv(inputs, kernel, strides=self.strides, padding="same")
        return outputs + self.bias if self.bias is not None else outputs

    def compute_output_shape(self, input_shape):
        n, h, w, _ = input_shape
        out = lambda d: None if d is None else -(-d // self.strides)  # noqa: E731
        return (n, out(h), out(w), self.units)

    def get_config(self):
        return {**super().get_config(), "filters": self.units, "kernel_size": self.kernel_size,
                "strides": self.strides}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config.pop("units", None)
        return cls(**config)
