"""The model both sides build: a small convolutional backbone and a linear head, plain Keras.

``pretrain.py`` builds it with 2 classes (even or odd digit) and saves its weights; tfgpu builds it with the
10 classes of the digits dataset (``--model=examples/finetune/backbone.py:build_model``) and loads those
weights with ``--init_weights``. Layers are matched by name, so give the ones you want to load stable names
(Keras names the rest ``conv2d``, ``conv2d_1``, ... in creation order, which is stable too as long as the
function builds the same layers in the same order). The head keeps its name; its shape changes with the
class count, which is what ``--init_skip_mismatch`` is for.
"""
import keras
from keras import layers


def build_model(input_shape, num_classes, width=16, sync_batch_norm=False, **kwargs):
    inputs = keras.Input(input_shape)
    x = inputs
    for i, (name, filters) in enumerate((("stem", width), ("block", 2 * width))):
        x = layers.Conv2D(filters, 3, strides=1 if i == 0 else 2, padding="same", use_bias=False,
                          name=f"{name}_conv")(x)
        x = layers.BatchNormalization(synchronized=sync_batch_norm, name=f"{name}_bn")(x)
        x = layers.ReLU(name=f"{name}_relu")(x)
    x = layers.GlobalAveragePooling2D(name="pool")(x)
    return keras.Model(inputs, layers.Dense(num_classes, name="head")(x), name="backbone_and_head")
