"""Step 1 of fine-tuning, in plain Keras (no tfgpu): train the backbone on another task and save its weights.

    python examples/finetune/pretrain.py --out=/tmp/finetune/pretrained.weights.h5

The task here is "is the digit even or odd" on scikit-learn's 8x8 digits, a stand-in for your own
pretraining. Pixels are fed in [-1, 1], the range tfgpu feeds a classifier by default, so the weights see
the same inputs when tfgpu fine-tunes them (weights trained on [0, 1] or [0, 255] need tfgpu told so).

Step 2, tfgpu fine-tunes on all 10 classes with a new head, on any number of devices
(see finetune.flags):

    python -m tfgpu.train --flagfile=examples/finetune/finetune.flags \
        --init_weights=/tmp/finetune/pretrained.weights.h5 --model_dir=/tmp/finetune/run
"""
import argparse
import os

import keras
import numpy as np

from backbone import build_model  # examples/finetune/backbone.py: Python puts a script's folder on sys.path


def digits_parity():
    """(images in [-1, 1] of shape (N, 8, 8, 1), 0/1 labels: even/odd) from scikit-learn's digits."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    pixels = np.round(digits.images * (255.0 / 16.0))  # as tfgpu stores them (uint8) ...
    images = (pixels / 127.5 - 1.0).astype("float32")[..., None]  # ... and feeds them
    return images, (digits.target % 2).astype("int64")


def pretrain(out: str, epochs: int = 5, seed: int = 0) -> dict:
    """Trains the 2-class model and saves its weights to ``out``; returns the last epoch's metrics."""
    keras.utils.set_random_seed(seed)
    images, labels = digits_parity()
    model = build_model(images.shape[1:], 2)
    model.compile(optimizer=keras.optimizers.Adam(1e-2),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    history = model.fit(images, labels, batch_size=64, epochs=epochs, verbose=0)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    model.save_weights(out)
    return {name: values[-1] for name, values in history.history.items()}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="where to write the .weights.h5 file")
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args()
    metrics = pretrain(args.out, args.epochs)
    print(f"pretrained (even/odd): accuracy={metrics['accuracy']:.3f}; weights in {args.out}")
