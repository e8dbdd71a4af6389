"""A plain Keras script on numpy arrays with validation_split, ported to tfgpu by two edits.

The data are scikit-learn's 1,797 handwritten digits (8x8, no download), upscaled to 16x16 floats in [0, 1]; the
last 20% of a shuffled copy is held out as a test set the script scores the trained model on. The model is a small
CNN compiled with Adam; fit holds out the last 10% of the training arrays (validation_split=0.1).

The two edits (docs/from-model-fit.md): ``import tfgpu`` and ``model.fit(`` -> ``tfgpu.fit(model, ``; ``--keras``
runs the unported line for comparison.

    python examples/from_model_fit/arrays_validation_split.py --keras     # plain Keras, one device
    python examples/from_model_fit/arrays_validation_split.py             # tfgpu, one device
    python -m tfgpu.launch --num_workers=2 -- python examples/from_model_fit/arrays_validation_split.py

Prints one line ``{"script": ..., "test_accuracy": ...}`` (every worker the same).
"""
import tfgpu  # edit 1: first, before TensorFlow or Keras make anything
import argparse
import json

import keras
import numpy as np
from sklearn.datasets import load_digits



def data(seed: int = 0):
    digits = load_digits()
    images = np.kron(digits.images, np.ones((2, 2)))[..., None].astype("float32") / 16.0  # 16x16, [0, 1]
    order = np.random.default_rng(seed).permutation(len(images))
    images, labels = images[order], digits.target[order]
    cut = int(0.8 * len(images))
    return (images[:cut], labels[:cut]), (images[cut:], labels[cut:])


def build_model() -> keras.Model:
    return keras.Sequential([
        keras.Input((16, 16, 1)),
        keras.layers.Conv2D(16, 3, activation="relu", padding="same"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keras", action="store_true", help="run plain model.fit (the unported script)")
    parser.add_argument("--epochs", type=int, default=12)
    args = parser.parse_args(argv)
    keras.utils.set_random_seed(1)
    (x, y), (x_test, y_test) = data()
    model = build_model()
    model.compile(optimizer=keras.optimizers.Adam(3e-3), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    if args.keras:
        history = model.fit(x, y, batch_size=32, epochs=args.epochs, validation_split=0.1, verbose=0)
    else:
        history = tfgpu.fit(model, x, y, batch_size=32, epochs=args.epochs, validation_split=0.1, verbose=0)  # edit 2
    _, accuracy = model.evaluate(x_test, y_test, verbose=0)
    result = {"script": "arrays_validation_split", "keras": args.keras, "test_accuracy": round(float(accuracy), 4),
              "val_accuracy": round(float(history.history["val_accuracy"][-1]), 4)}
    print(json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main()
