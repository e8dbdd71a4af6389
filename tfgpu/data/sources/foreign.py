"""Another writer's TFRecords as a dataset (``--source=tfrecord:GLOB``): every record checked, then read in place.

A foreign shard holds ``tf.train.Example`` records whose image bytes and label sit under keys of its writer's
choosing (Model Garden's ``image/encoded`` and ``image/class/label`` by default; ``--image_key``,
``--label_key``), its labels perhaps 1-based (``--label_offset=-1``). ``open_tfrecords`` reads every record once:
the keys present, the label plus the offset a class index, the image decoded the way the converter decodes
(``encode.example_to_record``: "what converts, trains"). When every record is usable as it is stored, the
converter writes only ``dataset.json``, naming the source shards where they are (``write_references``);
otherwise it writes new shards, and says which record (or option) made it.
"""
import concurrent.futures
import dataclasses
import hashlib
import json
import os
import re

import numpy as np
import tensorflow as tf

from tfgpu.config import ConfigError
from tfgpu.data.conversion import encode, outdir
from tfgpu.data.schema import shards, tfrecord
from tfgpu.data.sources import source as source_lib
from tfgpu.data.conversion import manifest as manifest_lib
from tfgpu.runtime import fileio

PREFIX = "tfrecord:"
# Model Garden's and TFDS's shard names: <split>-00000-of-01024, <name>-<split>.tfrecord-00000-of-00001.
_SHARD_NAME = re.compile(r"^(?:.*-)?(?P<split>[A-Za-z]+)(?:\.tfrecords?)?-\d+-of-\d+(?:\.tfrecords?)?$")
SPLIT_NAMES = ("train", "validation", "val", "test")
_KEEP = encode.Encoding("keep", 95, (), 0, skip_bad=False)


@dataclasses.dataclass
class ShardScan:
    """What reading one source shard found: where each record is, its label (offset applied; -1 when the record
    is bad), the records not usable (index, reason) and those the converter would change (index, how), and the
    statistics of the usable ones."""
    path: str
    sha256: str
    offsets: list
    labels: np.ndarray
    bad: list
    changed: list
    stats: encode.Stats

    def entry(self) -> dict:
        """The shard as a manifest lists it when it is read in place."""
        return {"file": self.path, "num_examples": len(self.offsets), "sha256": self.sha256}


@dataclasses.dataclass
class InPlace:
    """The source's own shards per split, for a manifest that reads them where they are."""
    splits: dict  # split -> [ShardScan]
    keys: tfrecord.RecordKeys

    def why_not(self) -> str:
        """Why the shards cannot be read as they are (the first record not usable as stored), or ""."""
        for scans in self.splits.values():
            for scan in scans:
                if scan.bad:
                    index, reason = scan.bad[0]
                    return f"record {index} of {scan.path} {reason}"
                if scan.changed:
                    index, how = scan.changed[0]
                    return f"record {index} of {scan.path} would be stored changed ({how}: {manifest_lib.ADJUSTED[how]})"
        return ""

    def first_bad(self):
        """(where, reason) of the first record that cannot be used at all, or None."""
        for scans in self.splits.values():
            for scan in scans:
                if scan.bad:
                    return f"{scan.path}: record {scan.bad[0][0]}", scan.bad[0][1]
        return None


def example_of(serialized: bytes, keys: tfrecord.RecordKeys):
    """(label with the offset added, image bytes) of one foreign record, or a phrase saying what is wrong with it
    ("has no 'image/class/label' (its keys: ...)")."""
    problem = tfrecord.missing_feature(serialized, keys.required(labelled=True))
    if problem:
        return problem
    features = tf.train.Example.FromString(serialized).features.feature
    images, labels = features[keys.image].bytes_list.value, features[keys.label].int64_list.value
    if len(images) != 1 or len(labels) != 1:
        return f"holds {len(images)} image(s) under {keys.image!r} and {len(labels)} label(s) under {keys.label!r}, " \
               "not one each"
    label = labels[0] + keys.label_offset
    if label < 0:
        offset = f" with --label_offset={keys.label_offset}" if keys.label_offset else ""
        return f"has label {labels[0]}, below 0{offset} (labels are class indices from 0; 1-based labels need " \
               "--label_offset=-1)"
    return label, images[0]


def _read(path: str, offset: int) -> bytes:
    from tensorflow.python.lib.io import _pywrap_record_io

    return _pywrap_record_io.RandomRecordReader(path).read(offset - shards.HEADER_BYTES)[0]


def scan_shard(path: str, keys: tfrecord.RecordKeys) -> ShardScan:
    """Reads every record of one source shard: located by its length headers, read (checksums), parsed, its
    label checked and its image decoded. Costs one read of the shard, its sha256 and one decode per record."""
    from tensorflow.python.lib.io import _pywrap_record_io

    with fileio.open_file(path, "rb") as f:
        if f.read(2) == b"\x1f\x8b":
            raise ConfigError("source", f"{path} is gzip-compressed; tfgpu reads foreign TFRecords uncompressed: "
                              "gunzip the shards first")
    walked = shards.scan(path, "none", sha256=True, data=False)
    if walked.damage or walked.lost:
        raise ConfigError("source", f"{path}: {walked.damage or 'a record length header is damaged'}, so its "
                          "records cannot be located; that shard needs writing again by the tool that made it")
    reader = _pywrap_record_io.RandomRecordReader(path)
    labels, bad, changed, stats = [], [], [], encode.Stats()
    for index, offset in enumerate(walked.offsets):
        try:
            serialized = reader.read(offset - shards.HEADER_BYTES)[0]
        except tf.errors.DataLossError:
            found = "is unreadable (it fails its checksum)"
        else:
            found = example_of(serialized, keys)
        if isinstance(found, tuple):
            try:
                _, shape, adjusted = encode.example_to_record("", found[0], found[1], _KEEP, f"{path}: record {index}")
            except encode.BadImageError as e:
                found = e.reason
            else:
                stats.add(found[0], shape)
                if adjusted:
                    changed.append((index, adjusted))
        if isinstance(found, str):
            bad.append((index, found))
            labels.append(-1)
        else:
            labels.append(found[0])
    return ShardScan(path, walked.sha256, list(walked.offsets), np.asarray(labels, np.int64), bad, changed, stats)


def split_of(path: str):
    """The split a shard's name gives (``train-00000-of-01024`` -> train), or None."""
    match = _SHARD_NAME.match(os.path.basename(path))
    return match.group("split") if match and match.group("split") in SPLIT_NAMES else None


@dataclasses.dataclass
class RecordPayload:
    """Records of source shards, each (shard path, record offset), yielded as the converter's examples."""
    items: list
    keys: tfrecord.RecordKeys

    def __len__(self):
        return len(self.items)

    def fingerprint(self) -> str:
        h = hashlib.sha256(b"tfrecord\0")
        h.update(json.dumps([self.items, dataclasses.astuple(self.keys)]).encode())
        return h.hexdigest()

    def examples(self):
        for path, offset, index in self.items:
            try:
                found = example_of(_read(path, offset), self.keys)
            except tf.errors.DataLossError:
                found = "is unreadable (it fails its checksum)"
            name = f"{os.path.basename(path)}/{index}"
            if isinstance(found, str):
                yield name, -1, source_lib.Unreadable(found), f"{path}: record {index}"
            else:
                yield name, int(found[0]), found[1], f"{path}: record {index}"


@dataclasses.dataclass
class RecordSplit:
    """A split's records: (shard path, record offset, record index) each, with their labels."""
    items: list
    labels: np.ndarray
    keys: tfrecord.RecordKeys

    def __len__(self):
        return len(self.items)

    def subset(self, idx):
        return RecordSplit([self.items[i] for i in idx], self.labels[idx], self.keys)

    def payload(self, lo, hi):
        return RecordPayload(self.items[lo:hi], self.keys)


def open_tfrecords(pattern: str, keys: tfrecord.RecordKeys, threads: int = 0) -> source_lib.Source:
    """The records of the shards ``pattern`` matches, every one read and checked (``scan_shard``, shards read
    side by side in ``threads``); their split from the shard names (Model Garden's ``train-*``, ``validation-*``)
    or, when the names give none, all ``train``."""
    if not pattern:
        raise ConfigError("source", "tfrecord: needs a glob of TFRecord files, e.g. tfrecord:/data/train-*")
    files = sorted(fileio.absolute(f) for f in fileio.glob(os.path.expanduser(pattern)) if not fileio.isdir(f))
    if not files:
        raise ConfigError("source", f"tfrecord:{pattern} matches no file")
    named = {f: split_of(f) for f in files}
    presplit = all(named.values())
    threads = threads or min(len(files), os.cpu_count() or 1)
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:  # decoding releases the GIL
        scans = list(pool.map(lambda f: scan_shard(f, keys), files))
    by_split = {}
    for scan in scans:
        by_split.setdefault(named[scan.path] if presplit else "train", []).append(scan)
    labels = np.concatenate([s.labels for s in scans])
    num_classes = int(labels.max()) + 1 if len(labels) else 0
    if num_classes < 1:
        where = scans[0].bad[0] if scans and scans[0].bad else (0, "holds no records")
        raise ConfigError("source", f"tfrecord:{pattern}: no usable record (first: record {where[0]} of "
                          f"{scans[0].path} {where[1]})")
    notices = [] if presplit else [f"tfrecord:{pattern}: the shard names give no split (train-*, validation-*), so "
                                   "all its records are split 'train'"]
    empty = sorted(set(range(num_classes)) - set(labels[labels >= 0].tolist()))
    if empty:
        hint = " (1-based labels? pass --label_offset=-1)" if empty[0] == 0 and not keys.label_offset else ""
        notices.append(f"labels run 0..{num_classes - 1} but {len(empty)} class(es) have no record (first: "
                       f"{empty[0]}){hint}")
    splits = {split: RecordSplit([(s.path, o, i) for s in group for i, o in enumerate(s.offsets)],
                                 np.concatenate([s.labels for s in group]), keys)
              for split, group in by_split.items()}
    identity = hashlib.sha256(json.dumps([[s.path, s.sha256] for s in scans] + [dataclasses.astuple(keys)])
                              .encode()).hexdigest()
    source = source_lib.Source(f"tfrecord-{os.path.basename(os.path.dirname(files[0])) or 'records'}", "tfrecord",
                            [str(c) for c in range(num_classes)], splits, presplit, encoded=True,
                            identity=f"tfrecord:{identity}", notices=notices)
    source.in_place = InPlace(by_split, keys)
    return source


def rewrites(o) -> str:
    """Which converter option makes new shards of the source's records necessary, or ""."""
    if o.split:
        return f"--split={o.split} cuts records out of the source's shards"
    if o.image_format != "keep" or o.resize:
        return "--image_format/--resize re-encode the images"
    if o.compression != "none":
        return f"--compression={o.compression} compresses them"
    if o.num_shards or o.shard_size_mb:
        return "--num_shards/--shard_size_mb re-shard them"
    return ""


def check_apart(directory: str, source) -> None:
    """Refuses, for new shards, an output directory that holds source shards (a finished conversion there
    replaces files of shard names, and no source file is ever written over)."""
    inside = [s.path for scans in source.in_place.splits.values() for s in scans
              if os.path.dirname(s.path) == fileio.absolute(directory).rstrip("/")]
    if inside:
        raise ConfigError("output_dir", f"{directory} holds the source shards ({os.path.basename(inside[0])}); new "
                          "shards go into another directory")


def write_references(o, source, key: str, out) -> dict:
    """Writes ``<output_dir>/dataset.json`` naming the source's shards where they are (absolute paths, their
    record counts and sha256s) with the keys and label offset they are read by; no shard is written or moved."""
    with outdir.claim(o, source.kind, o.source, key) as directory:
        tasks, results = [], []
        for split, scans in source.in_place.splits.items():
            for scan in scans:
                tasks.append({"split": split, "num_sources": len(scan.offsets)})
                results.append({"entry": scan.entry(), "stats": scan.stats.to_json()})
        manifest = manifest_lib.build(o, source, source.splits, tasks, results, _KEEP, key)
        manifest.update(record_keys=source.in_place.keys.to_manifest(), in_place=True)
        fileio.remove(os.path.join(directory, tfrecord.MANIFEST), missing_ok=True)
        tfrecord.write_manifest(directory, manifest)
        outdir.make_readable(os.path.join(directory, tfrecord.MANIFEST))
    for split, entry in manifest["splits"].items():
        print(f"{split}: {entry['num_examples']} examples in {len(entry['shards'])} shard(s), read in place",
              file=out)
    print(f"wrote {os.path.join(directory, tfrecord.MANIFEST)} (it names the source shards; none copied)", file=out,
          flush=True)
    return manifest
