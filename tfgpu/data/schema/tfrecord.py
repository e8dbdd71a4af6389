"""The one TFRecord schema, shared by the writer (converter) and the reader.

Records are ``tf.train.Example`` with the keys tensorflow/models uses for
ImageNet. A dataset directory holds ``<split>-SSSSS-of-NNNNN.tfrecord`` shards
and ``dataset.json`` (the manifest), which is written last: a directory
without a manifest is an unfinished conversion, never a dataset. A manifest may
instead name another writer's shards where they are (a path relative to it, or
absolute) with the keys they are read by (``RecordKeys``); docs/datasets.md
documents every key of the manifest.

Every file is written under a temporary name and renamed when complete, so an
interrupted writer leaves nothing that looks finished. The directory may be any path
TensorFlow opens (``gs://``, ``ram://``): files go through ``tfgpu.runtime.fileio``.
"""
import dataclasses
import hashlib
import json
import os
import re

import numpy as np
import tensorflow as tf

from tfgpu.runtime import fileio
from tfgpu.runtime.fileio import atomic_path, atomic_write_bytes

MANIFEST = "dataset.json"
# 2: shards may be outside the manifest's directory and read by other keys ("record_keys"). A manifest without
# format_version is version 1 (the same schema without those).
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)

# Feature keys (tensorflow/models ImageNet convention).
ENCODED = "image/encoded"
FORMAT = "image/format"
LABEL = "image/class/label"
HEIGHT = "image/height"
WIDTH = "image/width"
CHANNELS = "image/channels"
FILENAME = "image/filename"

FEATURE_SPEC = {
    ENCODED: tf.io.FixedLenFeature([], tf.string),
    FORMAT: tf.io.FixedLenFeature([], tf.string, default_value="png"),
    LABEL: tf.io.FixedLenFeature([], tf.int64, default_value=-1),
    HEIGHT: tf.io.FixedLenFeature([], tf.int64, default_value=0),
    WIDTH: tf.io.FixedLenFeature([], tf.int64, default_value=0),
    CHANNELS: tf.io.FixedLenFeature([], tf.int64, default_value=0),
    FILENAME: tf.io.FixedLenFeature([], tf.string, default_value=""),
}

COMPRESSIONS = {"none": "", "gzip": "GZIP"}

# The input pipeline parses a record without a label as this, and stops on it (it is below every class index),
# so the error can name the record (a required feature's own parse error names neither file nor record).
MISSING_LABEL = -(1 << 63)
LABELLED_SPEC = {**FEATURE_SPEC, LABEL: tf.io.FixedLenFeature([], tf.int64, default_value=MISSING_LABEL)}


@dataclasses.dataclass(frozen=True)
class RecordKeys:
    """Which features of a record hold the image bytes and the label, and what to add to the label (-1 for the
    1-based labels of Model Garden's ImageNet) so that labels are class indices from 0."""
    image: str = ENCODED
    label: str = LABEL
    label_offset: int = 0

    def required(self, labelled: bool) -> dict:
        """Key -> tf.train.Feature list kind a record must hold: the image always, the label when the dataset has
        classes (an unconditional GAN's data may have none). Other keys have defaults."""
        return {self.image: "bytes_list", **({self.label: "int64_list"} if labelled else {})}

    def to_manifest(self) -> dict:
        return {"image": self.image, "label": self.label, "label_offset": self.label_offset}


OWN_KEYS = RecordKeys()


def record_keys(manifest: dict) -> RecordKeys:
    """The manifest's ``record_keys`` (tfgpu's own when absent); ``_check_manifest`` has checked their types."""
    keys = manifest.get("record_keys")
    return RecordKeys(keys["image"], keys["label"], keys.get("label_offset", 0)) if keys else OWN_KEYS


def shard_name(split: str, index: int, num_shards: int) -> str:
    return f"{split}-{index:05d}-of-{num_shards:05d}.tfrecord"


def make_example(encoded: bytes, image_format: str, label, height: int, width: int, channels: int,
                 filename: str = "") -> bytes:
    """Serializes one image record; ``encoded`` is PNG/JPEG bytes or raw uint8 HWC; ``label`` one int (a class
    index) or a sequence of ints (a task's label vector, e.g. multi-label's 0/1 per label)."""

    def b(v):
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[v]))

    def i(v):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(x) for x in np.ravel(v)]))

    features = {
        ENCODED: b(encoded), FORMAT: b(image_format.encode()), LABEL: i(label),
        HEIGHT: i(height), WIDTH: i(width), CHANNELS: i(channels),
        FILENAME: b(filename.encode("utf-8", "surrogateescape")),  # file system names need not be UTF-8
    }
    # deterministic=True: the same record gives the same bytes in every process, so shard sha256s repeat.
    return tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString(deterministic=True)


def encode_image(image: np.ndarray, image_format: str, jpeg_quality: int = 95) -> bytes:
    """Encodes a uint8 HWC array as ``png``, ``jpeg`` or ``raw`` bytes."""
    if image.dtype != np.uint8 or image.ndim != 3:
        raise ValueError(f"expected a uint8 HxWxC image, got dtype {image.dtype} shape {image.shape}")
    if image_format == "png":
        return tf.io.encode_png(image).numpy()
    if image_format == "jpeg":
        return tf.io.encode_jpeg(image, quality=jpeg_quality).numpy()
    if image_format == "raw":
        return image.tobytes()
    raise ValueError(f"unknown image format {image_format!r}; use png, jpeg or raw")


def write_shard(path: str, records, compression: str = "none") -> dict:
    """Writes serialized records to one shard atomically; returns its manifest entry."""
    count = 0
    with atomic_path(path) as tmp:
        options = tf.io.TFRecordOptions(compression_type=COMPRESSIONS[compression])
        with tf.io.TFRecordWriter(tmp, options) as writer:
            for record in records:
                writer.write(record)
                count += 1
        digest = sha256_file(tmp)
    return {"file": os.path.basename(path), "num_examples": count, "sha256": digest}


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with fileio.open_file(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_manifest(directory: str, manifest: dict) -> None:
    """Writes ``dataset.json`` atomically; call it last, after every shard is in place."""
    manifest = {"format_version": FORMAT_VERSION, **manifest}
    atomic_write_bytes(os.path.join(directory, MANIFEST), json.dumps(manifest, indent=2, sort_keys=True).encode())


def read_manifest(directory: str) -> dict:
    path = os.path.join(directory, MANIFEST)
    if not fileio.exists(path):
        raise FileNotFoundError(
            f"{path} not found: {directory!r} is not a converted tfgpu dataset (or its conversion did not finish); "
            + (f"its files look like TFRecords another tool wrote: `python -m tfgpu.convert "
               f"--source='tfrecord:{directory.rstrip('/')}/*' --output_dir=DIR` reads them in place (with "
               "--label_offset=-1 for 1-based labels)" if _holds_tfrecords(directory) else
               "run `python -m tfgpu.convert --source=... --output_dir=...` first"))
    try:
        manifest = json.loads(fileio.read_text(path))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} is unreadable or not JSON ({getattr(e, 'strerror', None) or e}); "
                         "convert the dataset again") from None
    _check_manifest(path, manifest)
    return manifest


def _holds_tfrecords(directory: str) -> bool:
    """Whether ``directory`` holds files named as TFRecord shards are (``*.tfrecord``, ``train-00000-of-01024``);
    one listing, on the way to an error only."""
    try:
        names = fileio.listdir(directory) if fileio.isdir(directory) else []
    except OSError:
        return False
    return any(re.search(r"\.tfrecords?$|-\d+-of-\d+$", name) for name in names)


def _check_manifest(path: str, manifest) -> None:
    """Raises ValueError naming ``path`` when the manifest lacks a field the reader uses, or has the wrong type."""
    def bad(what):
        raise ValueError(f"{path}: {what}; convert the dataset again")

    if not isinstance(manifest, dict):
        bad(f"expected a JSON object, got {type(manifest).__name__}")
    version = manifest.get("format_version", 1)
    if version not in READABLE_VERSIONS:
        raise ValueError(f"{path}: format_version {version!r} is not one this tfgpu reads "
                         f"({', '.join(map(str, READABLE_VERSIONS))}): upgrade tfgpu, or convert the dataset with "
                         "this one")
    splits = manifest.get("splits")
    if not isinstance(splits, dict) or not splits:
        bad("'splits' must map each split name to its shards")
    for split, entry in splits.items():
        shards = entry.get("shards") if isinstance(entry, dict) else None
        if not isinstance(shards, list) or not isinstance(entry.get("num_examples"), int) or not all(
                isinstance(s, dict) and isinstance(s.get("file"), str) and isinstance(s.get("num_examples"), int)
                for s in shards):
            bad(f"split {split!r} needs 'num_examples' and 'shards' of {{'file', 'num_examples'}}")
    shape = manifest.get("image_shape")
    if not isinstance(shape, dict) or not isinstance(shape.get("channels"), int) or (
            "height" in shape and not all(isinstance(shape.get(k), int) for k in ("height", "width"))):
        bad("'image_shape' needs integer 'channels' (and 'height', 'width' for a fixed size)")
    if not isinstance(manifest.get("classes", []), list):
        bad("'classes' must be a list of class names")
    keys = manifest.get("record_keys")
    if keys is not None and not (isinstance(keys, dict) and all(isinstance(keys.get(k), str) and keys[k]
                                                                  for k in ("image", "label"))
                                 and type(keys.get("label_offset", 0)) is int):
        bad("'record_keys' needs the feature keys 'image' and 'label' (strings) and an integer 'label_offset'")


def write_arrays(directory: str, split: str, images: np.ndarray, labels: np.ndarray, num_shards: int,
                 image_format: str = "png", compression: str = "none") -> dict:
    """Writes in-memory uint8 images (N,H,W,C) and int labels as shards of one split.

    Returns the split's manifest entry (``num_examples``, ``shards``, ``class_counts``).
    """
    if len(images) != len(labels):
        raise ValueError(f"{len(images)} images but {len(labels)} labels")
    num_shards = max(1, min(num_shards, len(images)))
    fileio.makedirs(directory)
    bounds = np.linspace(0, len(images), num_shards + 1).astype(int)
    shards = []
    for s in range(num_shards):
        lo, hi = bounds[s], bounds[s + 1]
        records = (
            make_example(encode_image(images[i], image_format), image_format, int(labels[i]),
                         *images[i].shape, filename=f"{split}/{i}")
            for i in range(lo, hi))
        shards.append(write_shard(os.path.join(directory, shard_name(split, s, num_shards)), records, compression))
    classes, counts = np.unique(labels, return_counts=True)
    return {
        "num_examples": int(sum(s["num_examples"] for s in shards)),
        "shards": shards,
        "class_counts": {str(int(c)): int(n) for c, n in zip(classes, counts)},
    }


def parse_example(serialized, labelled: bool = False, keys: RecordKeys = OWN_KEYS):
    """Parses one serialized record into the feature dict of ``FEATURE_SPEC``; ``labelled``: a record without a
    label gets ``MISSING_LABEL`` (for the input pipeline's label check) instead of -1. ``keys``: another writer's
    image and label keys (the manifest's ``record_keys``); the image is then decoded as PNG/JPEG/GIF/BMP and the
    label offset added."""
    if keys == OWN_KEYS:
        return tf.io.parse_single_example(serialized, LABELLED_SPEC if labelled else FEATURE_SPEC)
    missing = MISSING_LABEL if labelled else -1
    parsed = tf.io.parse_single_example(serialized, {
        keys.image: tf.io.FixedLenFeature([], tf.string),
        keys.label: tf.io.FixedLenFeature([], tf.int64, default_value=missing)})
    label = parsed[keys.label]
    label = tf.where(tf.equal(label, missing), label, label + keys.label_offset)
    zero = tf.constant(0, tf.int64)
    return {ENCODED: parsed[keys.image], FORMAT: tf.constant("encoded"), LABEL: label, HEIGHT: zero, WIDTH: zero,
            CHANNELS: zero, FILENAME: tf.constant("")}


def missing_feature(serialized: bytes, required: dict) -> str:
    """What ``serialized`` lacks of ``required`` (key -> feature list kind), as a phrase naming the key and the keys
    the record has; "" when it has them all."""
    try:
        features = tf.train.Example.FromString(serialized).features.feature
    except Exception as e:  # protobuf's DecodeError; its module differs between protobuf implementations
        return f"is not a tf.train.Example ({type(e).__name__})"
    have = ", ".join(f"{k} ({features[k].WhichOneof('kind')})" for k in sorted(features)) or "none"
    for key, kind in required.items():
        if key not in features:
            return f"has no {key!r} (its keys: {have})"
        if features[key].WhichOneof("kind") != kind:
            return f"holds {key!r} as {features[key].WhichOneof('kind')}, not {kind}"
    return ""


def decode_image(features, channels: int):
    """Decodes PNG/JPEG/GIF/BMP or raw bytes to a uint8 HxWxC tensor."""
    encoded = features[ENCODED]

    def raw():
        shape = tf.stack([features[HEIGHT], features[WIDTH], features[CHANNELS]])
        return tf.reshape(tf.io.decode_raw(encoded, tf.uint8), tf.cast(shape, tf.int32))

    def compressed():
        return tf.io.decode_image(encoded, channels=channels, expand_animations=False)

    image = tf.cond(tf.equal(features[FORMAT], "raw"), raw, compressed)
    return tf.ensure_shape(image, [None, None, channels])
