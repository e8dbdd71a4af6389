"""Real datasets that ship inside PyPI packages, so quickstarts and tests need no network.

``digits``: scikit-learn's 1,797 handwritten digits (8x8 grayscale, 10 classes),
split once into train/val with a fixed seed, stratified by class.
"""
import numpy as np

BUILTIN = ("digits",)


def load_builtin(name: str, val_fraction: float = 0.2, seed: int = 0) -> dict:
    """Returns ``{"splits": {split: (uint8 NHWC images, int64 labels)}, "classes": [names]}``."""
    if name != "digits":
        raise ValueError(f"unknown built-in dataset {name!r}; built-in datasets: {', '.join(BUILTIN)}")
    from sklearn.datasets import load_digits

    digits = load_digits()
    # Pixel values are 0..16; stretch them to the full uint8 range.
    images = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)[..., None]
    labels = digits.target.astype(np.int64)
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
        "classes": [str(c) for c in digits.target_names],
    }
