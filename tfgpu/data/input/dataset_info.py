"""What a run reads of a converted dataset: ``describe(config, directory) -> DatasetInfo`` from its ``dataset.json``.

The read half's view of a dataset (``tfgpu.data``'s map): the manifest's classes, image shape, splits and shards,
the shards checked against it (``shards.verify``) and for the record keys the reader needs. It knows nothing of
how the dataset was written; which directory a run names, and converting it there first, is ``catalog.prepare``.
"""
import dataclasses
import os

from tfgpu.config import ConfigError, DatasetConfig
from tfgpu.data.schema import tfrecord
from tfgpu.runtime import fileio

EVAL_SPLITS = ("val", "validation", "test")


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """What the model and the loop need to know about the data."""
    name: str
    directory: str  # "" for synthetic data
    classes: tuple
    image_shape: tuple  # (height, width, channels) the model sees
    split_sizes: dict
    split_files: dict  # split -> tuple of (file, num_examples)
    compression: str
    train_split: str
    eval_split: str  # "" when there is no evaluation
    damaged: dict = dataclasses.field(default_factory=dict)  # shard -> shards.Damaged (--skip_corrupt_records)
    record_keys: tfrecord.RecordKeys = tfrecord.OWN_KEYS  # the features records are read by (dataset.json)
    tables: dict = dataclasses.field(default_factory=dict, compare=False)  # shard -> shards.record_table (by offset)

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def num_train_examples(self) -> int:
        return self.split_sizes[self.train_split]


def default_cache_dir() -> str:
    return os.environ.get("TFGPU_DATA_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "tfgpu")


def describe(config: DatasetConfig, directory: str, flag: str, pattern: str = "") -> DatasetInfo:
    """The dataset converted in ``directory`` as the run reads it (``pattern``: a glob choosing the train shards);
    raises ConfigError naming ``flag`` (the flag that named the directory) when it can't be read."""
    try:
        manifest = tfrecord.read_manifest(directory)
    except (FileNotFoundError, ValueError) as e:
        raise ConfigError(flag, str(e)) from None
    splits = manifest["splits"]
    if config.train_split not in splits:
        raise ConfigError("train_split", f"split {config.train_split!r} not in {directory} "
                          f"(splits: {', '.join(splits)})")
    eval_split = config.eval_split
    if eval_split == "none":
        eval_split = ""
    elif not eval_split:
        eval_split = next((s for s in EVAL_SPLITS if s in splits), "")
    elif eval_split not in splits:
        raise ConfigError("eval_split", f"split {eval_split!r} not in {directory} (splits: {', '.join(splits)})")
    h, w, c = _manifest_image_shape(manifest, directory)
    if config.image_size:
        h = w = config.image_size
    elif h is None:
        raise ConfigError("image_size", f"images in {directory} vary in size; set --image_size")
    files = {}
    for split, entry in splits.items():
        files[split] = tuple((os.path.join(directory, s["file"]), int(s["num_examples"])) for s in entry["shards"])
        missing = [f for f, _ in files[split] if not fileio.exists(f)]
        if missing:
            raise ConfigError(flag, f"{directory} is incomplete: {missing[0]} is missing" + (
                f" (a shard {tfrecord.MANIFEST} reads where another tool wrote it: it was moved or deleted; "
                "convert the source again)" if _outside(directory, missing[0]) else ""))
    sizes = {s: int(e["num_examples"]) for s, e in splits.items()}
    if pattern:
        matched = {fileio.absolute(f) for f in fileio.glob(pattern)}
        chosen = tuple((f, n) for f, n in files[config.train_split] if fileio.absolute(f) in matched)
        if not chosen:
            raise ConfigError("data_dir", f"{pattern!r} matches none of the {config.train_split!r} shards in "
                              f"{directory}")
        files[config.train_split] = chosen
        sizes[config.train_split] = sum(n for _, n in chosen)
    classes = tuple(manifest.get("classes") or ())
    if config.num_classes and classes and config.num_classes != len(classes):
        raise ConfigError("num_classes", f"{config.num_classes} but {directory} has {len(classes)} classes")
    if not classes:
        classes = tuple(str(i) for i in range(config.num_classes))
    compression = manifest.get("compression", "none")
    read_splits = {split: files[split] for split in dict.fromkeys((config.train_split, eval_split)) if split}
    tables = {}
    damaged = _verify_shards(config, flag, directory, manifest, read_splits, compression, bool(classes), tables)
    return DatasetInfo(manifest.get("name", os.path.basename(directory.rstrip("/"))), directory, classes,
                       (int(h), int(w), int(c)), sizes, files, compression, config.train_split, eval_split, damaged,
                       tfrecord.record_keys(manifest), tables)


def _manifest_image_shape(manifest: dict, directory: str):
    """(height, width, channels) from the manifest; height/width None when images vary in size."""
    shape = manifest.get("image_shape") or {}
    if "height" in shape:
        return shape["height"], shape["width"], shape["channels"]
    # Converter manifests keep min/max statistics; a fixed size means min == max.
    h, w = shape.get("height_min"), shape.get("width_min")
    same = h == shape.get("height_max") and w == shape.get("width_max")
    channels = shape.get("channels")
    if not channels:
        raise ValueError(f"{directory}/{tfrecord.MANIFEST} gives no image channels")
    return (h if same else None), (w if same else None), channels


def _outside(directory: str, path: str) -> bool:
    """Whether ``path`` (a shard the manifest lists) lies outside the manifest's ``directory``."""
    return os.path.dirname(os.path.normpath(path)) != os.path.normpath(directory)


def _verify_shards(config: DatasetConfig, flag: str, directory: str, manifest: dict, split_files: dict,
                   compression: str, labelled: bool, tables: dict = None) -> dict:
    """The shards the run reads, checked against ``dataset.json`` (``shards.verify``: counts, sha256s, unreadable
    records; cached) and for the keys the reader needs (each shard's first readable record: a foreign writer's
    keys are the same in every record). Returns {shard: Damaged} and fills ``tables`` with each shard's record
    offsets; raises ConfigError naming ``flag``."""
    from tfgpu.data.schema import shards

    try:
        damaged = shards.verify(directory, manifest, split_files, compression, config.skip_corrupt_records,
                                config.data_cache_dir or default_cache_dir(), tables)
    except shards.ShardError as e:
        raise ConfigError(flag, str(e)) from None
    keys = tfrecord.record_keys(manifest)
    required = keys.required(labelled)
    for files in split_files.values():
        for path, count in files:
            readable = damaged[path].readable() if path in damaged else [(0,)] * bool(count)
            if not readable:
                continue
            index = readable[0][0]
            problem = tfrecord.missing_feature(shards.read_record(path, compression, index, damaged.get(path)),
                                               required)
            if problem:
                raise ConfigError(flag, f"{path}: record {index} {problem}; {directory}/{tfrecord.MANIFEST} reads "
                                  f"records by the keys {', '.join(required)} (docs/datasets.md): convert them "
                                  "with python -m tfgpu.convert --source=tfrecord:GLOB --image_key=... "
                                  "--label_key=...")
    return damaged
