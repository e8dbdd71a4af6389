"""Which dataset a run names, and what it looks like: ``prepare(config) -> DatasetInfo``.

``--data_dir`` is a dataset converted by ``tfgpu.convert``; a built-in dataset (``--dataset=digits``) or
``--dataset=tfds:NAME`` whose files tfgpu cannot read where they are, is converted once into the data cache by the
same converter (processes of one host that start together wait for the first), in a directory named after what the
data is and how it was converted, and used only while its manifest records that same conversion. A prepared TFDS
image-classification dataset is read in place: the cache holds only a ``dataset.json`` naming its shards. The
directory chosen, the read half describes it from its manifest (``dataset_info.describe`` -> ``DatasetInfo``). This
module is the bridge between ``tfgpu.data``'s halves (the map in its ``__init__``): it imports both, neither imports it.
``--data_dir`` and ``--data_cache_dir`` may be any path TensorFlow opens (``gs://``, ``ram://``:
``tfgpu.runtime.fileio``); only a local cache is locked against a second converter.
"""
import contextlib
import dataclasses
import logging
import os

from tfgpu.config import ConfigError, DatasetConfig
from tfgpu.data.input import dataset_info
from tfgpu.data.schema import tfrecord
from tfgpu.data.sources import builtin, source as source_lib
from tfgpu.data.input.dataset_info import DatasetInfo, default_cache_dir
from tfgpu.runtime import fileio

log = logging.getLogger("tfgpu")


def _builtin_dir(config: DatasetConfig, name: str) -> str:
    """A built-in dataset converted once into the data cache by tfgpu's converter (the same shards and manifest
    as ``python -m tfgpu.convert --source=NAME --num_shards=2 --image_format=png``); returns its directory."""
    return _cached_conversion(config, f"{name}-v{tfrecord.FORMAT_VERSION}", source_lib.builtin_identity(name),
                              source=name, num_shards="2", image_format="png")


def _tfds_dir(config: DatasetConfig) -> str:
    """A tfds:NAME dataset read where TFDS prepared it: a ``dataset.json`` in the data cache names the builder's
    own TFRecord shards (``tfds_source.reference_manifest``), keyed by what its data is
    (``tfds_source.data_identity``). A builder whose files tfgpu cannot read as they are (``tfds_source.why_copied``)
    is converted once into the cache instead (the shards and manifest of ``python -m tfgpu.convert
    --source=tfds:NAME``), and the log says why."""
    from tfgpu.data.sources import tfds_source

    name = config.dataset[len("tfds:"):]
    data_dir = os.path.expanduser(config.tfds_data_dir)
    label = f"tfds-{name.replace('/', '-')}"
    try:
        with _cache_lock(os.path.join(config.data_cache_dir or default_cache_dir(), label)):
            # Under the lock: with --download, the processes of one host prepare it once.
            builder = tfds_source.prepared_builder(name, data_dir, config.download)
            identity = tfds_source.data_identity(builder)
            why = tfds_source.why_copied(builder, name)
    except ConfigError as e:
        raise _dataset_error(config, e) from None
    if not why:
        return _tfds_references(config, label, identity, builder, name)
    log.info("tfds:%s is copied into the data cache, not read in place: %s", name, why)
    return _cached_conversion(config, label, identity, source=config.dataset, tfds_data_dir=data_dir,
                              download=config.download)


def _tfds_references(config: DatasetConfig, label: str, identity: str, builder, name: str) -> str:
    """The cache directory whose ``dataset.json`` alone names the builder's shards where they are (written once,
    under the cache lock); named ``<label>-in-place-<fingerprint of identity>``."""
    import hashlib

    from tfgpu.data.sources import tfds_source

    key = hashlib.sha256(f"in place\0{identity}".encode()).hexdigest()
    directory = os.path.join(config.data_cache_dir or default_cache_dir(), f"{label}-in-place-{key[:16]}")
    path = os.path.join(directory, tfrecord.MANIFEST)
    with _cache_lock(directory):
        if not fileio.exists(path):
            fileio.makedirs(directory)
            tfrecord.write_manifest(directory, tfds_source.reference_manifest(builder, name, key))
            log.info("tfds:%s is read in place from %s (%s names its shards; nothing copied)", name,
                     builder.data_dir, path)
    _check_recorded(config, directory, key)
    return directory


def _cached_conversion(config: DatasetConfig, label: str, identity: str, **options) -> str:
    """The cache directory of this conversion, made once: named ``<label>-<fingerprint>`` after the converter's
    fingerprint of the source ``identity`` and the ``options``, so other data or options get a new directory and
    leave the old one as it was. Its ``dataset.json`` must record that same fingerprint, or it is refused."""
    from tfgpu.data.conversion import convert, outdir

    options = convert.Options(output_dir="", **options)
    key = outdir.fingerprint(dataclasses.asdict(options), identity)
    directory = os.path.join(config.data_cache_dir or default_cache_dir(), f"{label}-{key[:16]}")
    _convert_once(config, dataclasses.replace(options, output_dir=directory))
    _check_recorded(config, directory, key)
    return directory


def _check_recorded(config: DatasetConfig, directory: str, key: str) -> None:
    """Refuses a cache directory whose ``dataset.json`` records another fingerprint than ``key``."""
    from tfgpu.data.conversion import outdir

    recorded, _ = outdir.existing_fingerprint(directory)
    if recorded != key:
        raise ConfigError("data_cache_dir", f"{directory} is not the conversion --dataset={config.dataset} names "
                          "now: its dataset.json records other data or options (copied there, or made by another "
                          "converter); remove it to convert again")


@contextlib.contextmanager
def _cache_lock(path: str):
    """Holds ``<path>.lock`` so that processes of one host that start together wait for the first (a cache with a
    scheme has no lock)."""
    import fcntl

    try:
        fileio.makedirs(os.path.dirname(path) or ".")
        lock = contextlib.nullcontext() if fileio.has_scheme(path) else open(path.rstrip("/") + ".lock", "a")
    except OSError as e:
        raise ConfigError("data_cache_dir", f"cannot write to {os.path.dirname(path)}: {e.strerror}") from None
    with lock:
        if not fileio.has_scheme(path):
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _dataset_error(config: DatasetConfig, error: ConfigError) -> ConfigError:
    """The converter's error in the terms of a training run: the cache directory is --data_cache_dir; anything
    about the source is --dataset."""
    if error.flag == "output_dir":
        return ConfigError("data_cache_dir", error.reason)
    if error.flag in ("download", "tfds_data_dir"):
        return error
    return ConfigError("dataset", f"{config.dataset}: {error.reason}")


def _convert_once(config: DatasetConfig, options) -> None:
    """Converts ``--dataset`` with tfgpu's converter (``tfgpu.data.conversion.convert``, the one dataset writer) into
    ``options.output_dir`` unless it is there already; the converter's errors name training's flags."""
    from tfgpu.data.conversion import convert

    directory = options.output_dir
    if fileio.exists(os.path.join(directory, tfrecord.MANIFEST)):
        return
    with _cache_lock(directory):
        if fileio.exists(os.path.join(directory, tfrecord.MANIFEST)):
            return
        try:
            convert.convert(options, stream=_LogStream(), out=_LogStream())
        except ConfigError as e:
            raise _dataset_error(config, e) from None
        except (convert.BadImageError, convert.WorkerDiedError) as e:
            raise ConfigError("dataset", f"{config.dataset}: {e}") from None
        log.info("converted %s to %s", config.dataset, directory)


class _LogStream:
    """The converter's summary lines, into this run's log instead of stdout."""

    def write(self, text):
        if text.strip():
            log.info("%s", text.rstrip())

    def flush(self):
        pass


def prepare(config: DatasetConfig) -> DatasetInfo:
    """Finds the dataset the config names and describes it; raises ConfigError naming the flag when it can't."""
    if not config.data_dir and config.dataset == "synthetic":
        size = config.image_size or 32
        n = config.num_classes or 10
        return DatasetInfo("synthetic", "", tuple(str(i) for i in range(n)), (size, size, 3),
                           {"train": 1_281_167, "val": 0}, {}, "none", "train", "")
    pattern = ""
    if config.data_dir and any(ch in config.data_dir for ch in "*?["):
        # A glob over a converted dataset's shards: train on the matching shards only.
        pattern, directory, flag = config.data_dir, os.path.dirname(config.data_dir), "data_dir"
    elif config.data_dir:
        directory, flag = config.data_dir, "data_dir"
    elif config.dataset in builtin.BUILTIN:
        directory, flag = _builtin_dir(config, config.dataset), "dataset"
    elif config.dataset.startswith("tfds:"):
        directory, flag = _tfds_dir(config), "dataset"
    else:
        raise ConfigError("dataset", f"unknown dataset {config.dataset!r}; use one of "
                          f"{', '.join(builtin.BUILTIN + ('synthetic',))}, tfds:NAME, or --data_dir")
    return dataset_info.describe(config, directory, flag, pattern)


