"""TensorFlow Datasets sources: a prepared image-classification builder, read in its stored order.

Labels are not known before reading, so a TFDS split is cut by position (its stored
order is already shuffled), and its payloads read ranges of it.
"""
import dataclasses
import hashlib
import logging
import os

from tfgpu.config import ConfigError
from tfgpu.data.sources import Source
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
        ds = builder.as_dataset(split=f"{self.split}[{self.lo}:{self.hi}]", decoders=decoders, shuffle_files=False)
        for i, example in enumerate(ds.as_numpy_iterator(), start=self.lo):
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


def open_tfds(name: str, data_dir: str = "", download: bool = False) -> Source:
    """A tensorflow_datasets image-classification builder prepared in ``data_dir`` (downloads only if allowed)."""
    import tensorflow_datasets as tfds

    builder = prepared_builder(name, data_dir, download)
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
    spec = dict(name=name, data_dir=data_dir, version=str(info.version), image_key=image_key, label_key=label_key,
                encoded=True)
    splits = {s: TfdsSplit({**spec, "split": s}, 0, info.splits[s].num_examples) for s in sorted(info.splits)}
    shape = features[image_key].shape
    return Source(name.replace("/", "-"), "tfds", list(features[label_key].names), splits, presplit=True,
                  encoded=True, channels=int(shape[-1]) if shape[-1] else 0, identity=data_identity(builder))
