"""A model of your own, trained by tfgpu on any number of devices and hosts with one flag:

    python -m tfgpu.train --flagfile=configs/quickstart.flags --train_steps=200 \
        --model=examples/own_model/my_model.py:build_model --model_dir=/tmp/own

This file knows nothing about tfgpu: ``build_model`` is an ordinary Keras function. What tfgpu needs from it:

- the signature ``(input_shape, num_classes, **kwargs)``: tfgpu passes the dataset's image shape and class
  count, plus options such as ``sync_batch_norm`` in ``kwargs`` (a function without ``**kwargs`` gets only the
  keywords it names);
- a new ``keras.Model`` built inside the function (tfgpu calls it inside the distribution strategy's scope,
  under the run's dtype policy), returning ``(batch, num_classes)`` logits, no softmax;
- custom layers registered with ``keras.saving.register_keras_serializable`` and a ``get_config`` that
  returns their constructor arguments, so ``<model_dir>/export/model.keras`` loads anywhere after
  ``import my_model`` (or with ``custom_objects={"GatedConv": GatedConv}``).
"""
import keras
from keras import layers


@keras.saving.register_keras_serializable(package="my_model")
class GatedConv(layers.Layer):
    """A 3x3 convolution whose output is gated by a sigmoid of a second one (a GLU over channels)."""

    def __init__(self, filters, strides=1, **kwargs):
        super().__init__(**kwargs)
        self.filters, self.strides = filters, strides
        self.value = layers.Conv2D(filters, 3, strides=strides, padding="same")
        self.gate = layers.Conv2D(filters, 3, strides=strides, padding="same")

    def build(self, input_shape):
        self.value.build(input_shape)
        self.gate.build(input_shape)

    def call(self, x):
        return self.value(x) * keras.ops.sigmoid(self.gate(x))

    def compute_output_shape(self, input_shape):
        return self.value.compute_output_shape(input_shape)

    def get_config(self):
        return {**super().get_config(), "filters": self.filters, "strides": self.strides}


def build_model(input_shape, num_classes, width=16, sync_batch_norm=False, **kwargs):
    """Two gated convolutions with BatchNorm, global pooling and a linear head (logits)."""
    inputs = keras.Input(input_shape)
    x = inputs
    for i, filters in enumerate((width, 2 * width)):
        x = GatedConv(filters, strides=1 if i == 0 else 2)(x)
        x = layers.BatchNormalization(synchronized=sync_batch_norm)(x)
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers.Dense(num_classes, name="logits")(x), name="my_model")
