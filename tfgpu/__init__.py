"""tfgpu: multi-GPU and multi-node training of Keras 3 models on TensorFlow."""

__version__ = "0.1.0"
