"""A small CNN: the cheapest real classifier, for tests and smoke runs."""
import keras
from keras import layers

from tfgpu.models.registration import register_model


@register_model("small_cnn", default_image_size=32, options=("sync_batch_norm",))
def small_cnn(input_shape, num_classes, sync_batch_norm=False, width=32):
    """Two conv-BN-ReLU blocks, global pooling and a dense head (no residual blocks: no --zero_init_residual)."""
    inputs = keras.Input(input_shape)
    x = inputs
    for i, filters in enumerate((width, 2 * width)):
        x = layers.Conv2D(filters, 3, strides=1 if i == 0 else 2, padding="same", use_bias=False)(x)
        x = layers.BatchNormalization(synchronized=sync_batch_norm)(x)
        x = layers.ReLU()(x)
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers.Dense(num_classes, name="logits")(x), name="small_cnn")
