"""A plain Keras script on a batched tf.data pipeline with a learning-rate schedule and label smoothing, ported to
tfgpu by two edits.

The data are scikit-learn's 1,797 handwritten digits (no download) as 16x16 uint8 images with one-hot labels, the
last 300 held out for testing; training runs from ``Dataset.from_tensor_slices(...).shuffle(...).batch(64)``. The
model is compiled with SGD (momentum 0.9) on an ``ExponentialDecay`` schedule and
``CategoricalCrossentropy(label_smoothing=0.1)``.

The two edits (docs/from-model-fit.md): ``import tfgpu`` and ``model.fit(`` -> ``tfgpu.fit(model, ``; ``--keras``
runs the unported line for comparison.

    python examples/from_model_fit/tfdata_schedule_smoothing.py --keras
    python examples/from_model_fit/tfdata_schedule_smoothing.py
    python -m tfgpu.launch --num_workers=2 -- python examples/from_model_fit/tfdata_schedule_smoothing.py

Prints one line ``{"script": ..., "test_accuracy": ...}``.
"""
import tfgpu  # edit 1: first, before TensorFlow or Keras make anything
import argparse
import json

import keras
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits



def data():
    digits = load_digits()
    images = np.kron(digits.images * (255 / 16), np.ones((2, 2))).round().astype(np.uint8)[..., None]
    labels = keras.utils.to_categorical(digits.target, 10)
    return (images[:-300], labels[:-300]), (images[-300:], labels[-300:])


def build_model() -> keras.Model:
    inputs = keras.Input((16, 16, 1))
    x = keras.layers.Rescaling(1 / 255)(inputs)
    x = keras.layers.Conv2D(32, 3, activation="relu", padding="same")(x)
    x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dense(64, activation="relu")(x)
    return keras.Model(inputs, keras.layers.Dense(10, activation="softmax")(x))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keras", action="store_true", help="run plain model.fit (the unported script)")
    parser.add_argument("--epochs", type=int, default=20)
    args = parser.parse_args(argv)
    keras.utils.set_random_seed(1)
    (x, y), (x_test, y_test) = data()
    train = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(2000, seed=1).batch(64)
    schedule = keras.optimizers.schedules.ExponentialDecay(0.05, decay_steps=200, decay_rate=0.7)
    model = build_model()
    model.compile(optimizer=keras.optimizers.SGD(schedule, momentum=0.9),
                  loss=keras.losses.CategoricalCrossentropy(label_smoothing=0.1), metrics=["accuracy"])
    if args.keras:
        model.fit(train, epochs=args.epochs, verbose=0)
    else:
        tfgpu.fit(model, train, epochs=args.epochs, verbose=0)  # edit 2
    _, accuracy = model.evaluate(x_test, y_test, verbose=0)
    result = {"script": "tfdata_schedule_smoothing", "keras": args.keras, "test_accuracy": round(float(accuracy), 4)}
    print(json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main()
