"""User model files (``--model=path/to/file.py:build``) the training tests write, edit and resume."""

NET = '''
import keras


def build(input_shape, num_classes):
    inputs = keras.Input(input_shape)
    x = keras.layers.Conv2D(4, 3, activation="relu", name="conv")(inputs)
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    return keras.Model(inputs, keras.layers.Dense(num_classes, name="logits")(x))
'''
