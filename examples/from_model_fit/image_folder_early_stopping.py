"""A plain Keras script on a folder of images (``image_dataset_from_directory``, ``Rescaling``, ``EarlyStopping``),
ported to tfgpu by two edits.

The images are written locally first: scikit-learn's 1,797 handwritten digits (no download) as 24x24 RGB PNGs,
one folder per class (``zero`` .. ``nine``), under ``--image_dir``. Keras' loader splits them 80/20 (training and
validation subsets, seed 7) into batches of 32; the model begins with ``Rescaling(1/255)``; ``EarlyStopping`` watches
val_loss and restores the best weights.

The two edits (docs/from-model-fit.md): ``import tfgpu`` and ``model.fit(`` -> ``tfgpu.fit(model, ``; ``--keras``
runs the unported line for comparison.

    python examples/from_model_fit/image_folder_early_stopping.py --keras
    python examples/from_model_fit/image_folder_early_stopping.py
    python -m tfgpu.launch --num_workers=2 -- python examples/from_model_fit/image_folder_early_stopping.py

Prints one line ``{"script": ..., "val_accuracy": ...}``: the trained model scored on the validation Dataset the
script made before training, as after model.fit.
"""
import tfgpu  # edit 1: first, before TensorFlow or Keras make anything
import argparse
import json
import os

import keras
import numpy as np
from sklearn.datasets import load_digits


NAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def write_images(directory: str) -> None:
    """The digits as 24x24 RGB PNGs in one folder per class (once; every worker writes the same files)."""
    from PIL import Image

    if os.path.exists(os.path.join(directory, "nine")):
        return
    digits = load_digits()
    for i, (image, label) in enumerate(zip(digits.images, digits.target)):
        folder = os.path.join(directory, NAMES[label])
        os.makedirs(folder, exist_ok=True)
        pixels = np.kron(image * (255 / 16), np.ones((3, 3))).round().astype(np.uint8)
        path = os.path.join(folder, f"{i:04d}.png")
        if not os.path.exists(path):
            Image.fromarray(np.stack([pixels] * 3, -1)).save(path + f".{os.getpid()}.tmp", format="PNG")
            os.replace(path + f".{os.getpid()}.tmp", path)


def load(directory: str):
    """(train, val): Keras' loader's 80/20 split of the folders, in batches of 32."""
    return keras.utils.image_dataset_from_directory(directory, image_size=(24, 24), batch_size=32,
                                                    validation_split=0.2, subset="both", seed=7, verbose=False)


def build_model() -> keras.Model:
    return keras.Sequential([
        keras.Input((24, 24, 3)),
        keras.layers.Rescaling(1 / 255),
        keras.layers.Conv2D(16, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keras", action="store_true", help="run plain model.fit (the unported script)")
    parser.add_argument("--image_dir", default="/tmp/tfgpu-digit-folders")
    parser.add_argument("--epochs", type=int, default=20)
    args = parser.parse_args(argv)
    write_images(args.image_dir)
    keras.utils.set_random_seed(1)
    train, val = load(args.image_dir)
    model = build_model()
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    stop = keras.callbacks.EarlyStopping(monitor="val_loss", patience=3, restore_best_weights=True)
    if args.keras:
        history = model.fit(train, validation_data=val, epochs=args.epochs, callbacks=[stop], verbose=0)
    else:
        history = tfgpu.fit(model, train, validation_data=val, epochs=args.epochs, callbacks=[stop],
                            verbose=0)  # edit 2
    _, accuracy = model.evaluate(val, verbose=0)
    result = {"script": "image_folder_early_stopping", "keras": args.keras, "val_accuracy": round(float(accuracy), 4),
              "epochs": len(history.epoch)}
    print(json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main()
