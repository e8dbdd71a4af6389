"""Shards checked against their manifest before a run reads them: record counts, sha256s, unreadable records.

A TFRecord is ``[uint64 length][uint32 masked crc32c(length)][data][uint32 masked crc32c(data)]``. Counting a
shard's records walks the length headers (a 12-byte read and a seek per record; a gzip shard is decompressed on
the way). The manifest's sha256 of a shard, where it records one, is checked by hashing the file (a full read).
Which records are unreadable (data failing its crc32c) is looked up only when it matters: a shard whose sha256
is not the manifest's, or any shard under --skip_corrupt_records without a recorded sha256 (a full read,
TensorFlow's own reader checking each record). What a scan found is cached per shard, keyed by the shard's
path, size and modification time, so each check is paid once per shard and data cache; with every record's
byte offset (packed), the index the input pipeline reads records by (``record_table``).

``verify`` judges the scans against ``dataset.json`` and raises ShardError (one line naming the shard, the
manifest and the fix) for a count the shard does not hold, a damaged length header, a changed shard, or an
unreadable record without --skip_corrupt_records; with it, the unreadable records of each shard are returned
(``Damaged``) so the input pipeline reads around them.
"""
import base64
import dataclasses
import gzip
import hashlib
import json
import logging
import os
import struct
import zlib

import numpy as np

from tfgpu.runtime import fileio

log = logging.getLogger("tfgpu")

CACHE_VERSION = 2  # 2: every shard's record offsets kept (compact), for reading by index
HEADER_BYTES = 12  # uint64 length + uint32 masked crc32c of it
FOOTER_BYTES = 4  # uint32 masked crc32c of the data


class ShardError(ValueError):
    """A shard that is not what its manifest says, or cannot be read as one; the message is one line."""


@dataclasses.dataclass(frozen=True)
class Scan:
    """What the passes over a shard found. ``damage``: why the records from ``records`` on cannot be located
    ("" when every record was); ``lost``: records whose length header is damaged (the next one found again);
    ``unreadable``: records whose data fails its checksum (None: not looked up); ``offsets``/``lengths``: where
    each record's data is (None when not known; the cache keeps them compactly, ``_pack``)."""
    size: int
    mtime_ns: int
    records: int
    damage: str = ""
    sha256: str = ""
    lost: tuple = ()
    unreadable: tuple = None
    offsets: tuple = None
    lengths: tuple = None

    @property
    def bad(self) -> tuple:
        """Every record known to be unreadable, in order."""
        return tuple(sorted(set(self.lost) | set(self.unreadable or ())))



def _pack(values) -> str:
    """Integers (offsets, lengths) as base64 of the zlib of their int64 differences: short JSON."""
    deltas = np.diff(np.asarray(values, np.int64), prepend=np.int64(0)).astype("<i8")
    return base64.b64encode(zlib.compress(deltas.tobytes(), 6)).decode()


def _unpack(text: str) -> tuple:
    return tuple(np.cumsum(np.frombuffer(zlib.decompress(base64.b64decode(text)), "<i8")).tolist())


def record_table(result: Scan, compression: str):
    """Each record's byte offset (its length header's; -1: header damaged), then the shard's size; None for a
    gzip shard (offsets inside the compressed stream: read from its start)."""
    if compression == "gzip" or result.offsets is None:
        return None
    offsets = np.asarray(result.offsets, np.int64)
    return np.append(np.where(offsets < 0, -1, offsets - HEADER_BYTES), np.int64(result.size))


@dataclasses.dataclass(frozen=True)
class Damaged:
    """A shard with unreadable records, read around by the input pipeline: the record indices it cannot read,
    and where each record's data is in the (decompressed) shard."""
    unreadable: tuple
    offsets: tuple
    lengths: tuple

    def readable(self):
        """(index, data offset, data length) of every readable record, in order."""
        bad = set(self.unreadable)
        return [(i, o, n) for i, (o, n) in enumerate(zip(self.offsets, self.lengths)) if i not in bad]


def _crc32c_table():
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_CRC32C = _crc32c_table()


def masked_crc32c(data: bytes) -> int:
    """The TFRecord checksum of ``data`` (crc32c, masked). Pure Python: used on 8-byte length fields only."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC32C[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def _walk_headers(f, size, path=""):
    """(data offsets, data lengths, lost, damage) of the records in the open stream ``f`` of ``size`` bytes (None
    when unknown: a gzip stream, whose end is found by reading). ``lost``: records whose length header is
    damaged, found again by ``_resync`` (a seekable shard at ``path``); a record's data offset is -1 then."""
    offsets, lengths, lost, pos = [], [], [], 0
    while size is None or pos < size:
        f.seek(pos)
        header = f.read(HEADER_BYTES)
        if not header and size is None:
            break
        index = len(offsets)
        if len(header) < HEADER_BYTES:
            return offsets, lengths, lost, f"the file ends inside the length header of record {index}"
        length, crc = struct.unpack("<QI", header)
        if masked_crc32c(header[:8]) != crc:
            if size is None:
                return offsets, lengths, lost, f"the length header of record {index} (byte {pos}) is damaged"
            found = _resync(f, path, pos + 1, size)
            offsets.append(-1)
            lengths.append(0)
            lost.append(index)
            if found is None:  # no record follows: the damaged ones run to the end (the manifest sizes the run)
                break
            pos = found
            continue
        end = pos + HEADER_BYTES + length + FOOTER_BYTES
        if size is not None and end > size:
            return offsets, lengths, lost, (f"record {index} is cut short (the file ends at byte {size}, the record "
                                            f"at {end})")
        if size is None:
            f.seek(end - 1)
            if len(f.read(1)) != 1:
                return offsets, lengths, lost, f"record {index} is cut short (the stream ends before its byte {end})"
        offsets.append(pos + HEADER_BYTES)
        lengths.append(length)
        pos = end
    return offsets, lengths, lost, ""


def _resync(f, path: str, start: int, size: int, block: int = 1 << 20):
    """The offset of the next record after a damaged length header: the first position from ``start`` whose 12
    bytes are a valid length header of a record that fits in the file and whose data passes its checksum
    (TensorFlow's reader). Most positions fail the length bound, so scanning costs well under a microsecond a
    byte; None when no record follows."""
    import tensorflow as tf
    from tensorflow.python.lib.io import _pywrap_record_io

    reader = _pywrap_record_io.RandomRecordReader(path)
    pos = start
    while pos + HEADER_BYTES + FOOTER_BYTES <= size:
        f.seek(pos)
        buf = f.read(block + HEADER_BYTES)
        for p in range(0, min(block, len(buf) - HEADER_BYTES + 1)):
            length, crc = struct.unpack_from("<QI", buf, p)
            if pos + p + HEADER_BYTES + length + FOOTER_BYTES > size or masked_crc32c(buf[p:p + 8]) != crc:
                continue
            try:
                reader.read(pos + p)
                return pos + p
            except tf.errors.DataLossError:
                continue
        pos += block
    return None


def _headers(path: str, compression: str, size: int):
    with fileio.open_file(path, "rb") as raw:
        if compression != "gzip":
            return _walk_headers(raw, size, path)
        try:
            with gzip.GzipFile(fileobj=raw, mode="rb") as f:
                walked = _walk_headers(f, None)
                f.read()  # to the end: the gzip trailer's crc32 covers every byte
                return walked
        except (OSError, EOFError, zlib.error) as e:
            return [], [], [], f"the gzip stream is damaged ({e})"


def _unreadable(path: str, offsets) -> tuple:
    """Indices of the records whose data fails its checksum, read by TensorFlow's own record reader."""
    import tensorflow as tf
    from tensorflow.python.lib.io import _pywrap_record_io

    reader = _pywrap_record_io.RandomRecordReader(path)
    bad = []
    for index, offset in enumerate(offsets):
        if offset < 0:  # its length header is damaged: lost already
            continue
        try:
            reader.read(offset - HEADER_BYTES)
        except tf.errors.DataLossError:
            bad.append(index)
    return tuple(bad)


def read_record(path: str, compression: str, index: int, damaged: "Damaged" = None) -> bytes:
    """Record ``index`` of a shard, read on the host: at its offset when the shard is ``damaged`` (known),
    else by reading the records before it."""
    from tensorflow.python.lib.io import _pywrap_record_io

    from tfgpu.data.schema import tfrecord

    if damaged is not None:
        return _pywrap_record_io.RandomRecordReader(path).read(damaged.offsets[index] - HEADER_BYTES)[0]
    reader = _pywrap_record_io.RecordIterator(path, tfrecord.COMPRESSIONS[compression])
    for _ in range(index):
        next(reader)
    return next(reader)


def _stat(path: str):
    """(size, modification time in ns): the os's own for a local file (TensorFlow's rounds to the second, which
    would miss a byte flipped within a second of the last scan)."""
    if not fileio.has_scheme(path):
        stat = os.stat(path)
        return stat.st_size, stat.st_mtime_ns
    import tensorflow as tf

    stat = tf.io.gfile.stat(path)
    return int(stat.length), int(stat.mtime_nsec)


def scan(path: str, compression: str, sha256: bool, data: bool, known: Scan = None) -> Scan:
    """Scans one shard: its records (always), its sha256 (``sha256``) and its unreadable records (``data``; not
    for gzip shards, whose stream checksum covers every record). ``known``: an earlier scan of the same bytes,
    whose findings are reused."""
    from tfgpu.data.schema import tfrecord

    size, mtime_ns = _stat(path)
    result = known
    if known is None or (known.size, known.mtime_ns) != (size, mtime_ns):
        offsets, lengths, lost, damage = _headers(path, compression, size)
        result = Scan(size, mtime_ns, len(offsets), damage, lost=tuple(lost), offsets=tuple(offsets),
                      lengths=tuple(lengths))
    if sha256 and not result.sha256:
        result = dataclasses.replace(result, sha256=tfrecord.sha256_file(path))
    if data and result.unreadable is None and compression != "gzip":
        result = with_offsets(path, compression, result)
        result = dataclasses.replace(result, unreadable=_unreadable(path, result.offsets))
    return result


def with_offsets(path: str, compression: str, result: Scan) -> Scan:
    """``result`` with its records' offsets and lengths (walking the length headers again if not kept)."""
    if result.offsets is not None:
        return result
    offsets, lengths, _, _ = _headers(path, compression, result.size)
    return dataclasses.replace(result, offsets=tuple(offsets), lengths=tuple(lengths))


_PACKED = ("offsets", "lengths")


class Cache:
    """Scans of a dataset's shards, kept in ``<data cache>/verified/<hash of the dataset directory>.json``.

    Under the data cache, not beside the data: a dataset directory may be read-only, shared, or a bucket, and a
    stray file there would make the converter take it for someone else's output. Entries are keyed by shard
    name (path, for a shard outside the directory) and checked against size and modification time, so a changed
    shard is scanned again."""

    def __init__(self, cache_dir: str, directory: str):
        key = hashlib.sha256(fileio.absolute(directory).encode()).hexdigest()[:20]
        self.path = os.path.join(cache_dir, "verified", f"{key}.json")
        self.directory = directory
        self.scans, self.changed = {}, False
        try:
            stored = json.loads(fileio.read_text(self.path))
            if stored.get("version") == CACHE_VERSION and stored.get("directory") == directory:
                self.scans = {name: Scan(**{k: _unpack(v) if k in _PACKED and isinstance(v, str) else
                                            tuple(v) if isinstance(v, list) else v for k, v in entry.items()})
                              for name, entry in stored["shards"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            self.scans = {}  # no cache yet, or one this version cannot read: scanned again and rewritten

    def _key(self, path: str) -> str:
        """The shard's name, or its whole path when it lies outside the dataset directory (a shard the manifest
        reads where another tool wrote it: two such may share a name)."""
        inside = os.path.dirname(os.path.normpath(path)) == os.path.normpath(self.directory)
        return os.path.basename(path) if inside else path

    def get(self, path: str):
        return self.scans.get(self._key(path))

    def put(self, path: str, result: Scan):
        name = self._key(path)
        if self.scans.get(name) != result:
            self.scans[name], self.changed = result, True

    def save(self):
        if not self.changed:
            return
        body = {"version": CACHE_VERSION, "directory": self.directory,
                "shards": {name: {k: _pack(v) if k in _PACKED and v is not None else v
                                  for k, v in dataclasses.asdict(s).items()} for name, s in self.scans.items()}}
        try:
            fileio.makedirs(os.path.dirname(self.path))
            fileio.atomic_write_bytes(self.path, json.dumps(body).encode())
        except OSError as e:
            log.warning("could not cache the shard checks in %s (%s): they are repeated on the next run", self.path,
                        e.strerror or e)


def verify(directory: str, manifest: dict, split_files: dict, compression: str, skip_corrupt: bool,
           cache_dir: str, tables: dict = None) -> dict:
    """Checks every shard of ``split_files`` (split -> ((path, count), ...)) against ``manifest``; returns
    {path: Damaged} for the shards whose unreadable records --skip_corrupt_records reads around, and fills
    ``tables`` (when given) with {path: record_table} for the shards whose records can be read by offset. Raises
    ShardError naming the shard."""
    from tfgpu.data.schema import tfrecord

    manifest_path = os.path.join(directory, tfrecord.MANIFEST)
    cache = Cache(cache_dir, directory)
    damaged = {}
    try:
        for split, files in split_files.items():
            entry = manifest["splits"][split]
            listed = sum(n for _, n in files)
            if listed != entry["num_examples"] and len(files) == len(entry["shards"]):
                raise ShardError(f"{manifest_path} says split {split!r} holds {entry['num_examples']} records, but "
                                 f"its shards list {listed}; convert the dataset again")
            expected_sha = {os.path.join(directory, s["file"]): s.get("sha256") for s in entry["shards"]}
            for path, count in files:
                found, table = _verified(path, count, expected_sha.get(path), compression, skip_corrupt, cache,
                                         manifest_path)
                if found is not None:
                    damaged[path] = found
                if tables is not None and table is not None:
                    tables[path] = table
    finally:
        cache.save()
    return damaged


def _counted(result: Scan, count: int, path: str, manifest_path: str) -> Scan:
    """``result`` once its records are the ``count`` the manifest says. Consecutive damaged length headers hide
    how many records lie between the last good one and the next: when a shard has one such gap, it holds the
    records the count is short of; with several gaps the split between them is unknown (ShardError)."""
    if result.records == count:
        return result
    if result.records > count or len(result.lost) != 1:
        damaged = (f" (the length headers of records {', '.join(map(str, result.lost))} are damaged, so the records "
                   "between them cannot be counted)" if result.lost else "")
        raise ShardError(f"{manifest_path} says {os.path.basename(path)} holds {count} records, but {path} holds "
                         f"{result.records}{damaged}; convert the dataset again")
    gap, extra = result.lost[0], count - result.records
    shift = [i + extra if i > gap else i for i in result.unreadable or ()]
    return dataclasses.replace(
        result, records=count, lost=tuple(range(gap, gap + extra + 1)),
        unreadable=None if result.unreadable is None else tuple(shift),
        offsets=None if result.offsets is None else result.offsets[:gap + 1] + (-1,) * extra + result.offsets[gap + 1:],
        lengths=None if result.lengths is None else result.lengths[:gap + 1] + (0,) * extra + result.lengths[gap + 1:])


def _verified(path, count, expected_sha, compression, skip_corrupt, cache, manifest_path):
    """Judges one shard (scanning it as far as needed): (its Damaged or None, its record_table)."""
    result = scan(path, compression, sha256=bool(expected_sha), data=skip_corrupt and not expected_sha,
                  known=cache.get(path))
    changed = bool(expected_sha) and result.sha256 != expected_sha
    if changed:  # what changed: unreadable records (damage), or other records (a different shard)
        result = scan(path, compression, sha256=True, data=True, known=result)
    cache.put(path, result)
    if result.damage:
        raise ShardError(f"{path}: {result.damage}, so the records after it cannot be located; convert the "
                         "dataset again")
    result = _counted(result, count, path, manifest_path)
    if changed and not result.bad:
        raise ShardError(f"{path}: its sha256 {result.sha256[:16]}... is not the {expected_sha[:16]}... "
                         f"{manifest_path} records, though every record reads: the shard changed since "
                         "conversion; convert the dataset again")
    bad = result.bad
    if not bad:
        return None, record_table(result, compression)
    if not skip_corrupt:
        raise ShardError(f"{path}: record {bad[0]} is unreadable (it fails its checksum; {len(bad)} of "
                         f"{result.records} in this shard); convert the dataset again, or pass --skip_corrupt_records "
                         "to train on the other records")
    log.warning("--skip_corrupt_records: skipping %d unreadable record(s) of %s, every epoch: record(s) %s",
                len(bad), path, ", ".join(map(str, bad)))
    result = with_offsets(path, compression, result)
    return Damaged(bad, result.offsets, result.lengths), record_table(result, compression)
