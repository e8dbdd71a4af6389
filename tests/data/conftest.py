"""Fixtures for converter tests: tiny real sources built on the fly (PIL images, CSV, .npz, a local TFDS builder)."""
import io
import os
import subprocess

import numpy as np
import pytest

CLASSES = ("cat", "dog", "eel")


def make_image(rng, height, width, channels=3):
    shape = (height, width) if channels == 1 else (height, width, channels)
    return rng.integers(0, 256, shape, dtype=np.uint8)


def save_image(path, array, fmt=None):
    from PIL import Image

    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.fromarray(array).save(path, format=fmt)


@pytest.fixture
def png_folder(tmp_path):
    """root/<class>/*.png, 4 images per class of varying sizes; returns (root, {relpath: (array, class)})."""
    rng = np.random.default_rng(1)
    root = tmp_path / "pngs"
    images = {}
    for c in CLASSES:
        for i in range(4):
            array = make_image(rng, 10 + i, 12 + 2 * i)
            rel = f"{c}/{i}.png"
            save_image(str(root / rel), array)
            images[rel] = (array, c)
    return str(root), images


@pytest.fixture
def mixed_folder(tmp_path):
    """root/<class>/ with JPEG, PNG, BMP and GIF files (5 per class) plus one corrupt ``dog/broken.jpg``."""
    rng = np.random.default_rng(2)
    root = tmp_path / "mixed"
    for c in CLASSES:
        for i, ext in enumerate(("jpg", "jpeg", "png", "bmp", "gif")):
            save_image(str(root / c / f"{i}.{ext}"), make_image(rng, 16, 20))
    (root / "dog" / "broken.jpg").write_bytes(b"\xff\xd8\xff this is not a JPEG")
    (root / "cat" / "notes.txt").write_text("not an image, ignored")
    return str(root)


@pytest.fixture
def split_folder(tmp_path):
    """root/train/<class>/*.png (3 per class) and root/val/<class>/*.png (1 per class)."""
    rng = np.random.default_rng(3)
    root = tmp_path / "presplit"
    for split, n in (("train", 3), ("val", 1)):
        for c in CLASSES:
            for i in range(n):
                save_image(str(root / split / c / f"{i}.png"), make_image(rng, 8, 8))
    return str(root)


def _tfds_builder_class():
    import tensorflow_datasets as tfds

    class TfgpuTinyShapes(tfds.core.GeneratorBasedBuilder, skip_registration=True):
        """26 random 12x10 RGB images in 3 classes; train 20, test 6."""
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
                "image": tfds.features.Image(shape=(12, 10, 3)),
                "label": tfds.features.ClassLabel(names=list(CLASSES))}), supervised_keys=("image", "label"))

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples(20, 0), "test": self._generate_examples(6, 1)}

        def _generate_examples(self, n, seed):
            for i, (image, label) in enumerate(tiny_tfds_examples(n, seed)):
                yield i, {"image": image, "label": label}

    return TfgpuTinyShapes


def tiny_tfds_examples(n, seed):
    rng = np.random.default_rng(seed)
    return [(make_image(rng, 12, 10), i % 3) for i in range(n)]


@pytest.fixture(scope="session")
def tfds_dir(tmp_path_factory):
    """A TFDS data dir holding the prepared ``tfgpu_tiny_shapes`` (not registered: read back from its files)."""
    data_dir = str(tmp_path_factory.mktemp("tfds"))
    _tfds_builder_class()(data_dir=data_dir).download_and_prepare()
    return data_dir


def png_bytes(array):
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture
def small_disk(tmp_path):
    """``small_disk(kib)`` mounts a tmpfs of that size (a disk that really fills up) and returns its path; unmounted
    afterwards. Skips the test where mounting is not permitted (not root, no CAP_SYS_ADMIN)."""
    mounted = []

    def mount(kib, name="disk"):
        path = tmp_path / name
        path.mkdir()
        if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={kib}k", "tmpfs", str(path)],
                          capture_output=True).returncode:
            pytest.skip("mounting a tmpfs is not permitted here")
        mounted.append(path)
        return path

    yield mount
    for path in mounted:
        subprocess.run(["umount", str(path)], capture_output=True)
