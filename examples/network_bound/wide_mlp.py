"""A model with many parameters and little compute, so that the network decides a multi-worker step: two wide
Dense layers on the flattened image (about 4.3 M parameters, 17 MB of float32 gradients per step on 8x8 digits,
a few milliseconds of compute). ``tfgpu.plan`` and docs/benchmarks.md use it to check the cost model where the
wire dominates:

    python -m tfgpu.plan --flagfile=configs/quickstart.flags --model=examples/network_bound/wide_mlp.py:build_model \\
        --num_workers=2,3 --bandwidth=100mbit,1gbit --validate
"""
import keras


def build_model(input_shape, num_classes, width: int = 2048):
    inputs = keras.Input(input_shape)
    x = keras.layers.Flatten()(inputs)
    x = keras.layers.Dense(width, activation="relu")(x)
    x = keras.layers.Dense(width, activation="relu")(x)
    return keras.Model(inputs, keras.layers.Dense(num_classes)(x), name="wide_mlp")
