"""TensorFlow Datasets sources: a prepared image-classification builder, read in its stored order.

Labels are not known before reading, so a TFDS split is cut by position (its stored
order is already shuffled), and its payloads read ranges of it.
"""
import dataclasses
import hashlib
import logging
import os

from tfgpu.config import ConfigError
from tfgpu.data.sources.source import Source
from tfgpu.runtime import fileio

log = logging.getLogger("tfgpu")

_TFDS_BUILDERS = {}


@dataclasses.dataclass
class TfdsPayload:
    """Examples ``lo:hi`` of one split of a prepared tensorflow_datasets builder, in its stored order."""
    name: str
    data_dir: str
    version: str
    split: str
    lo: int
    hi: int
    image_key: str
    label_key: str
    encoded: bool = True  # True: yield the image bytes as stored; False: decoded uint8 arrays

    def __len__(self):
        return self.hi - self.lo

    def fingerprint(self) -> str:
        return hashlib.sha256(
            f"tfds\0{self.name}\0{self.version}\0{self.split}\0{self.lo}\0{self.hi}\0{self.encoded}".encode()
        ).hexdigest()

    def examples(self):
        import tensorflow_datasets as tfds

        builder = _tfds_builder(self.name, self.data_dir)
        decoders = {self.image_key: tfds.decode.SkipDecoding()} if self.encoded else None
        split = f"{self.split}[{self.lo}:{self.hi}]"
        if _file_format(builder.info) == "tfrecord":
            stored = builder.as_dataset(split=split, decoders=decoders, shuffle_files=False).as_numpy_iterator()
        else:  # array_record (TFDS reads it as a random-access data source only)
            source = builder.as_data_source(split=split, decoders=decoders)
            stored = (source[i] for i in range(len(source)))
        for i, example in enumerate(stored, start=self.lo):
            name = f"{self.split}/{i}"
            yield name, int(example[self.label_key]), example[self.image_key], f"tfds:{self.name}[{name}]"


def _tfds_builder(name: str, data_dir: str):
    key = (name, data_dir)
    if key not in _TFDS_BUILDERS:
        import tensorflow_datasets as tfds

        _TFDS_BUILDERS[key] = tfds.builder(name, data_dir=data_dir or None)
    return _TFDS_BUILDERS[key]


@dataclasses.dataclass
class TfdsSplit:
    """A contiguous range of a TFDS split; labels are not known before reading, so splits are cut by range."""
    spec: dict  # TfdsPayload fields except lo/hi
    lo: int
    hi: int
    labels = None

    def __len__(self):
        return self.hi - self.lo

    def subrange(self, a, b):
        return TfdsSplit(self.spec, self.lo + a, self.lo + b)

    def payload(self, lo, hi):
        return TfdsPayload(**self.spec, lo=self.lo + lo, hi=self.lo + hi)


def prepared_builder(name: str, data_dir: str = "", download: bool = False):
    """The tensorflow_datasets builder ``name`` prepared in ``data_dir`` (downloads and prepares it only if
    allowed); ConfigError naming the flag when it cannot be had."""
    if not name:
        raise ConfigError("source", "tfds: needs a dataset name, e.g. tfds:cifar10")
    import tensorflow_datasets as tfds

    where = data_dir or "the default TFDS data dir (~/tensorflow_datasets or $TFDS_DATA_DIR)"
    try:
        builder = tfds.builder(name, data_dir=data_dir or None)
    except Exception as e:  # DatasetNotFoundError and friends carry page-long messages; keep the first line
        raise ConfigError("source", f"tfds:{name}: {str(e).strip().splitlines()[0]} (looked in {where})") from None
    if not builder.is_prepared():
        if not download:
            raise ConfigError("download", f"tfds:{name} is not prepared in {where}; pass --download to let "
                              "tensorflow_datasets download and prepare it, or --tfds_data_dir=DIR where it is")
        log.info("downloading and preparing tfds:%s into %s", name, where)
        builder.download_and_prepare()
    return builder


def data_identity(builder) -> str:
    """What a prepared builder's data is: its full name and version, the directory it is read from (symlinks
    resolved) and a sha256 over its ``dataset_info.json`` and the name, size and modification time of each of its
    files (locally also its inode). Two data dirs holding a dataset of one name, or one re-prepared in place, differ
    here. Costs listing one directory, a stat per file and reading ``dataset_info.json`` (no record is read)."""
    import tensorflow as tf

    directory = str(builder.data_dir)
    resolved = directory if fileio.has_scheme(directory) else os.path.realpath(directory)
    digest = hashlib.sha256()
    try:
        digest.update(fileio.read_bytes(os.path.join(directory, "dataset_info.json")))
        for file in sorted(fileio.listdir(directory)):
            path = os.path.join(directory, file)
            if fileio.has_scheme(directory):
                stat = tf.io.gfile.stat(path)
                digest.update(f"\0{file}\0{stat.length}\0{stat.mtime_nsec}".encode())
            else:  # the local stat: nanosecond times and the inode (a file prepared again is a new one)
                stat = os.stat(path)
                digest.update(f"\0{file}\0{stat.st_size}\0{stat.st_mtime_ns}\0{stat.st_ino}".encode())
    except (OSError, tf.errors.OpError) as e:
        raise ConfigError("tfds_data_dir", f"cannot read {directory}: {getattr(e, 'strerror', None) or e}") from None
    return f"tfds:{builder.info.full_name}:{resolved}:{digest.hexdigest()}"


def _image_and_label(builder, name: str):
    """(image key, label key) of an image-classification builder: its supervised keys, else image and label;
    ConfigError naming --source when it has no such features."""
    import tensorflow_datasets as tfds

    info = builder.info
    keys = info.supervised_keys
    image_key, label_key = keys if isinstance(keys, tuple) and len(keys) == 2 and all(
        isinstance(k, str) for k in keys) else ("image", "label")
    features = info.features
    if image_key not in features or not isinstance(features[image_key], tfds.features.Image):
        raise ConfigError("source", f"tfds:{name} has no image feature {image_key!r} (features: "
                          f"{', '.join(features.keys())})")
    if label_key not in features or not isinstance(features[label_key], tfds.features.ClassLabel):
        raise ConfigError("source", f"tfds:{name} has no class label feature {label_key!r}")
    return image_key, label_key


def _file_format(info) -> str:
    """The builder's file format: tfrecord (TFDS's default), array_record, ..."""
    return getattr(info.file_format, "value", info.file_format) or "tfrecord"


def why_copied(builder, name: str) -> str:
    """Why a prepared builder's own files cannot be read in place by tfgpu's pipeline, or "": they must be
    TFRecords of tf.train.Example (TFDS's default file format) whose image is stored encoded (PNG/JPEG, 8-bit)
    under its own key, with a per-shard record count for every split. Costs reading ``dataset_info.json``."""
    import numpy as np

    info = builder.info
    image_key, _ = _image_and_label(builder, name)
    file_format = _file_format(info)
    if file_format != "tfrecord":
        return f"its records are stored as {file_format} files, not TFRecords"
    image = info.features[image_key]
    if np.dtype(image.np_dtype) != np.uint8:
        return f"its image {image_key!r} holds {np.dtype(image.np_dtype).name} pixels, not 8-bit encoded images"
    for split, split_info in info.splits.items():
        if not list(split_info.shard_lengths):
            return f"dataset_info.json gives no per-shard record counts for split {split!r}"
    return ""


def reference_manifest(builder, name: str, fingerprint: str) -> dict:
    """``dataset.json`` naming a prepared builder's own TFRecord shards where they are (``why_copied`` is ""):
    their absolute paths and record counts from ``dataset_info.json``, read by the builder's image and label keys.
    The shards' sha256s are not recorded: the cache directory's name holds ``data_identity`` (each file's size,
    modification time and inode), and every run counts the records of each shard (shards.verify)."""
    info = builder.info
    image_key, label_key = _image_and_label(builder, name)
    splits = {}
    for split, split_info in sorted(info.splits.items()):
        paths = [str(p) for p in split_info.filepaths]
        shards = [{"file": path, "num_examples": int(n)} for path, n in zip(paths, split_info.shard_lengths)]
        splits[split] = {"num_examples": int(split_info.num_examples), "shards": shards}
    height, width, channels = info.features[image_key].shape
    shape = {"channels": int(channels or 3)}
    if height and width:
        shape.update(height=int(height), width=int(width))
    return {"name": name.replace("/", "-"), "source": f"tfds:{name}", "source_kind": "tfds", "in_place": True,
            "classes": list(info.features[label_key].names), "splits": splits, "compression": "none",
            "image_format": "keep", "image_shape": shape,
            "record_keys": {"image": image_key, "label": label_key, "label_offset": 0},
            "converter": {"fingerprint": fingerprint}}


def open_tfds(name: str, data_dir: str = "", download: bool = False) -> Source:
    """A tensorflow_datasets image-classification builder prepared in ``data_dir`` (downloads only if allowed)."""
    builder = prepared_builder(name, data_dir, download)
    info = builder.info
    image_key, label_key = _image_and_label(builder, name)
    features = info.features
    spec = dict(name=name, data_dir=data_dir, version=str(info.version), image_key=image_key, label_key=label_key,
                encoded=True)
    splits = {s: TfdsSplit({**spec, "split": s}, 0, info.splits[s].num_examples) for s in sorted(info.splits)}
    shape = features[image_key].shape
    return Source(name.replace("/", "-"), "tfds", list(features[label_key].names), splits, presplit=True,
                  encoded=True, channels=int(shape[-1]) if shape[-1] else 0, identity=data_identity(builder))
