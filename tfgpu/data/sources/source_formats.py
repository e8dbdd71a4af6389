"""What ``python -m tfgpu.convert --source`` accepts: one table, ``SOURCE_FORMATS``, that the converter opens
sources through and the flag's help and errors are written from.

Each format says how --source names it (``form``, as help and errors spell it), a sentence for the help, whether a
--source value is one of its kind (``claims``; the first format that claims it opens it) and how to open it as a
``source.Source`` (``open(source, options)``, ``options`` the converter's ``convert.Options``). Light to import
(no TensorFlow): ``tfgpu/convert.py`` builds its help from it; each opener imports its own module when called.

A new source format: its module (as ``tfds_source.py`` is), an entry here, and its test.
"""
import dataclasses
import os
from typing import Callable

from tfgpu.config import ConfigError
from tfgpu.data.sources import builtin


@dataclasses.dataclass(frozen=True)
class SourceFormat:
    form: str  # how --source names it in help and errors: "an image folder", "tfds:NAME"
    help: str  # the --source help's description of it
    claims: Callable  # (source) -> bool: the value is of this kind
    open: Callable  # (source, options) -> source_lib.Source
    is_file: bool = False  # a file told apart by its name's ending (a file that no format claims is refused)


def _prefixed(prefix: str) -> Callable:
    return lambda source: source.startswith(prefix)


def _ending(*suffixes: str) -> Callable:
    return lambda source: os.path.isfile(source) and source.lower().endswith(suffixes)


def _open_tfrecord(source, options):
    from tfgpu.data.schema import tfrecord
    from tfgpu.data.sources import foreign

    keys = tfrecord.RecordKeys(options.image_key, options.label_key, options.label_offset)
    return foreign.open_tfrecords(source[len("tfrecord:"):], keys)


def _open_tfds(source, options):
    from tfgpu.data.sources import tfds_source

    return tfds_source.open_tfds(source[len("tfds:"):], options.tfds_data_dir, options.download)


def _open_folder(source, options):
    from tfgpu.data.sources import source as source_lib

    return source_lib.open_folder(source)


def _open_csv(source, options):
    from tfgpu.data.sources import source as source_lib

    return source_lib.open_csv(source)


def _open_npz(source, options):
    from tfgpu.data.sources import source as source_lib

    return source_lib.open_npz(source)


def _open_builtin(source, options):
    from tfgpu.data.sources import source as source_lib

    return source_lib.open_builtin(source)


# In the order a --source value is tried: the first format that claims it opens it.
SOURCE_FORMATS = (
    SourceFormat("tfrecord:GLOB", "tfrecord:GLOB (another tool's TFRecords: read in place when every record is usable "
                 "as stored; --image_key, --label_key, --label_offset)", _prefixed("tfrecord:"), _open_tfrecord),
    SourceFormat("tfds:NAME", "tfds:NAME[/CONFIG][:VERSION] (a TensorFlow Datasets dataset)", _prefixed("tfds:"),
                 _open_tfds),
    SourceFormat("an image folder", "an image folder (root/<class>/*.jpg, optionally root/train/ and root/val/; JPEG, "
                 "PNG, BMP, GIF, WebP, TIFF; OS debris ignored)", os.path.isdir, _open_folder),
    SourceFormat("a .csv/.tsv", "a .csv/.tsv of path,label[,split] (paths relative to the file; integer labels are "
                 "class ids)", _ending(".csv", ".tsv"), _open_csv, is_file=True),
    SourceFormat("a .npz", "a .npz with x (N,H,W[,C]) uint8 and y (N,) (or x_<split>/y_<split>)", _ending(".npz"),
                 _open_npz, is_file=True),
    SourceFormat(f"a built-in dataset ({', '.join(builtin.BUILTIN)})",
                 f"a built-in dataset ({', '.join(builtin.BUILTIN)})", lambda source: source in builtin.BUILTIN,
                 _open_builtin),
)


def forms() -> str:
    """Every form --source takes, for errors: 'tfrecord:GLOB, tfds:NAME, an image folder, ... or a built-in ...'."""
    names = [f.form for f in SOURCE_FORMATS]
    return ", ".join(names[:-1]) + " or " + names[-1]


def help_text() -> str:
    """The --source help: each format's description."""
    descriptions = [f.help for f in SOURCE_FORMATS]
    return "One of: " + "; ".join(descriptions) + ". See docs/datasets.md."


def open_source(source: str, options):
    """The ``source.Source`` --source names, opened by the first format that claims it; ConfigError(source) when
    it is empty, a file of no known kind, or nothing that exists."""
    if not source:
        raise ConfigError("source", f"is required: {forms()}")
    for kind in SOURCE_FORMATS:
        if kind.claims(source):
            return kind.open(source, options)
    if os.path.isfile(source):
        files = " or ".join(f.form for f in SOURCE_FORMATS if f.is_file)
        raise ConfigError("source", f"{source}: a file, but not {files}")
    raise ConfigError("source", f"{source} does not exist (expected {forms()})")
