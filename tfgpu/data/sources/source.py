"""A ``Source``: where a conversion's examples come from (image folders, CSV/TSV lists, .npz arrays, TFDS, built-in
data), with its splits, and the openers of folders, lists, arrays and built-in data.

A ``Source`` (which ``tfgpu.data.conversion.convert.open_source`` picks for ``--source``) holds class names in label
order and, per split, a ``SplitData`` that can be re-split (stratified by class when labels are known up front),
shuffled, and cut into picklable shard payloads. A payload's ``examples()`` yields ``(filename, label, data,
origin)``: the record's filename, the image's encoded bytes, a uint8 HxWxC array or an ``Unreadable`` reason, and
where a user finds it (a full path). Nothing here decodes images or writes files.

Finding a folder's images is ``folders``; reading a CSV list, ``csvlist``; TFDS builders, ``tfds_source`` (which
builds on this module's ``Source``); other tools' TFRecords, ``foreign``: all beside it in ``tfgpu.data.sources``.
"""
import dataclasses
import hashlib
import os

import numpy as np

from tfgpu.config import ConfigError
from tfgpu.data.sources import builtin, csvlist, folders


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
        """Paths, labels, and each file's size and modification time: an edited image changes it."""
        h = hashlib.sha256(b"files\0")
        for rel, label in self.items:
            try:
                st = os.stat(os.path.join(self.root, rel))
                state = f"{st.st_size}\t{st.st_mtime_ns}"
            except OSError as e:
                state = f"unreadable {e.errno}"
            h.update(f"{rel}\t{label}\t{state}\n".encode("utf-8", "surrogateescape"))
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
    notices: list = dataclasses.field(default_factory=list)  # one line each, printed before converting
    not_converted: dict = dataclasses.field(default_factory=dict)  # reason (folders.REASONS) -> [paths]
    followed_outside: list = dataclasses.field(default_factory=list)  # images taken through links leaving their class
    in_place: object = None  # foreign.InPlace: a tfrecord: source's own shards, for a manifest reading them in place


def parse_split_spec(spec: str) -> list:
    """``train:0.9,val:0.1`` -> [("train", 0.9), ("val", 0.1)]; fractions must be positive and sum to 1."""
    parts = []
    for item in spec.split(","):
        name, sep, frac = item.strip().partition(":")
        name = name.strip()
        if not sep or not name:
            raise ConfigError("split", f"{spec!r}: expected name:fraction pairs like train:0.9,val:0.1")
        csvlist.check_split_name(name, repr(spec), flag="split")
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

def open_folder(root: str) -> Source:
    """An image folder (``root/<class>/...`` or ``root/<split>/<class>/...``; see tfgpu.data.sources.folders)."""
    scan = folders.scan_folder(root)
    root = scan.root
    classes = sorted({c for by_class in scan.splits.values() for c, files in by_class.items() if files})
    if not classes:
        left = sum(len(p) for p in scan.not_converted.values())
        raise ConfigError("source", f"{root} has no images in class folders (expected {root}/<class>/*.jpg, or "
                          f"{root}/train/<class>/*.jpg with val/; image types: {', '.join(folders.IMAGE_EXTENSIONS)})"
                          + (f"; {left} file(s) or folder(s) were not usable" if left else ""))
    label_of = {c: i for i, c in enumerate(classes)}
    splits, notices = {}, list(scan.notices)
    for split, by_class in scan.splits.items():
        paths, labels = [], []
        for c, files in by_class.items():
            if files:
                paths.extend(files)
                labels.extend([label_of[c]] * len(files))
        splits[split] = FileSplit(root, paths, np.asarray(labels, np.int64))
        empty = [c for c in classes if not by_class.get(c)]
        if empty:
            notices.append(f"split {split}: {len(empty)} class(es) without images: {', '.join(empty[:5])}"
                           + (" ..." if len(empty) > 5 else ""))
    return Source(os.path.basename(root), "folder", classes, splits, scan.presplit, encoded=True,
                  identity=f"folder:{root}", notices=notices, not_converted=scan.not_converted,
                  followed_outside=scan.followed_outside)


def open_csv(path: str) -> Source:
    """Rows ``path,label[,split]`` (see tfgpu.data.sources.csvlist); paths relative to the file or absolute."""
    path = os.path.abspath(path)
    root, rows, classes, notices = csvlist.read_list(path)
    presplit = rows[0][3] is not None
    grouped = {}
    for _, rel, label, split in rows:
        paths, labels = grouped.setdefault(split if presplit else "train", ([], []))
        paths.append(rel)
        labels.append(label)
    splits = {s: FileSplit(root, p, np.asarray(lab, np.int64)) for s, (p, lab) in grouped.items()}
    return Source(os.path.splitext(os.path.basename(path))[0], "csv", classes, splits, presplit, encoded=True,
                  identity=f"csv:{path}", notices=notices)


def _check_arrays(where, x, y, notices):
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
    if not len(y):
        raise ConfigError("source", f"{where}: holds 0 images")
    if y.min() < 0:
        raise ConfigError("source", f"{where}: labels must be >= 0, found {y.min()}")
    if x.shape[-1] in (2, 4):
        notices.append(f"{where}: dropping the alpha channel ({x.shape[-1]} -> {x.shape[-1] - 1} channels), as "
                       "for image files")
        x = x[..., :-1]
    return x, y.astype(np.int64)


def _load_npz(path):
    """The .npz's arrays; ConfigError naming the file for anything that is not an .npz of plain arrays."""
    try:
        data = np.load(path, allow_pickle=False)
    except Exception as e:  # pickled or text data, an empty or truncated file: numpy's errors vary
        why = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ConfigError("source", f"{path}: not a readable .npz archive (numpy: {why}); write one with "
                          "np.savez(path, x=images, y=labels)") from None
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise ConfigError("source", f"{path}: a single .npy array, not an .npz archive of x and y (np.savez)")
    with data:
        arrays = {}
        for key in data.files:
            try:
                arrays[key] = data[key]
            except Exception as e:  # object arrays need pickle; a damaged member fails to read
                raise ConfigError("source", f"{path}[{key}]: cannot read ({str(e).splitlines()[0]}); save "
                                  "plain numeric arrays") from None
    return arrays


def open_npz(path: str) -> Source:
    """``x`` (N,H,W[,C]) uint8 and ``y`` (N,) ints, or ``x_<split>``/``y_<split>`` pairs; optional ``classes``.
    Alpha is dropped, as for image files (the reader never sees it)."""
    path = os.path.abspath(path)
    data = _load_npz(path)
    keys = set(data)
    if {"x", "y"} <= keys:
        pairs = {"train": ("x", "y")}
    else:
        pairs = {k[2:]: (k, "y_" + k[2:]) for k in sorted(keys) if k.startswith("x_") and "y_" + k[2:] in keys}
    if not pairs:
        raise ConfigError("source", f"{path}: expected arrays x and y (or x_<split> and y_<split>), found "
                          f"{', '.join(sorted(keys)) or 'none'}")
    splits, channels, notices = {}, set(), []
    for split, (xk, yk) in pairs.items():
        csvlist.check_split_name(split, f"{path}[{xk}]")
        x, y = _check_arrays(f"{path}[{xk}]", data[xk], data[yk], notices)
        channels.add(x.shape[-1])
        splits[split] = ArraySplit(x, y, [f"{split}/{i}" for i in range(len(y))])
    if len(channels) > 1:
        raise ConfigError("source", f"{path}: splits have different channel counts {sorted(channels)}")
    num_classes = 1 + max(int(s.labels.max()) for s in splits.values())
    classes = [str(i) for i in range(num_classes)]
    if "classes" in keys:
        if data["classes"].ndim != 1:
            raise ConfigError("source", f"{path}[classes]: expected a 1-D array of names, got {data['classes'].shape}")
        classes = [str(c) for c in data["classes"].tolist()]
    if len(classes) < num_classes:
        raise ConfigError("source", f"{path}: labels go up to {num_classes - 1} but only {len(classes)} classes "
                          "are named")
    return Source(os.path.splitext(os.path.basename(path))[0], "npz", classes, splits, presplit="x" not in keys,
                  encoded=False, channels=channels.pop(), identity=f"npz:{path}", notices=notices)


def builtin_identity(name: str) -> str:
    """What a built-in dataset is, for the converter's fingerprint (its bytes are those of the installed package)."""
    return f"builtin:{name}"


def open_builtin(name: str) -> Source:
    """A dataset shipped inside a PyPI package (tfgpu.data.sources.builtin), with its own train/val split."""
    data = builtin.load_builtin(name)
    splits = {s: ArraySplit(x, y.astype(np.int64), [f"{s}/{i}" for i in range(len(y))])
              for s, (x, y) in data["splits"].items()}
    channels = next(iter(data["splits"].values()))[0].shape[-1]
    return Source(name, "builtin", list(data["classes"]), splits, presplit=True, encoded=False,
                  channels=int(channels), identity=builtin_identity(name))
