"""Converts a source (tfgpu.data.sources) into sharded TFRecords plus ``dataset.json``, safely and resumably.

Every shard is one task (in this process, or one per worker process): it is written
under a temporary name and renamed when complete (``tfrecord.write_shard``), then a
sidecar in ``<out>/.tfgpu-convert/`` records its sha256, the plan it was built from
and its statistics. A rerun of the same command reuses each shard whose sidecar
matches the plan and whose bytes still hash to the recorded sha256, and rebuilds the
rest. ``dataset.json`` is removed before any shard is rebuilt and written last, so
a directory never looks complete while it is not.
"""
import concurrent.futures
from concurrent.futures.process import BrokenProcessPool
import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import multiprocessing
import os
import re
import sys
import time

import numpy as np

from tfgpu.config import ConfigError
from tfgpu.data import sources, tfrecord
from tfgpu.fileio import atomic_write_bytes

log = logging.getLogger("tfgpu")

IMAGE_FORMATS = ("keep", "png", "jpeg", "raw")
STATE_DIR = ".tfgpu-convert"
DEFAULT_SHARD_SIZE_MB = 100.0
CONVERTER_VERSION = 1
_SHARD_FILE = re.compile(r"^[A-Za-z0-9_-]+-\d{5}-of-\d{5}\.tfrecord$")
_TEMP_FILE = re.compile(r"^\.([A-Za-z0-9_-]+-\d{5}-of-\d{5}\.tfrecord|dataset\.json|.+\.json)\..+\.tmp$")


class BadImageError(Exception):
    """A source image that cannot be read or decoded (and --skip_bad is off)."""

    def __init__(self, path: str, reason: str):
        super().__init__(path, reason)
        self.path, self.reason = path, reason

    def __str__(self):
        return f"{self.path}: {self.reason}; fix or remove it, or pass --skip_bad to skip such files"


@dataclasses.dataclass(frozen=True)
class Options:
    """Everything ``python -m tfgpu.convert`` accepts (see ``tfgpu/convert.py`` for the flag help)."""
    source: str
    output_dir: str
    split: str = ""
    seed: int = 0
    image_format: str = "keep"
    jpeg_quality: int = 95
    resize: str = ""
    num_shards: str = ""
    shard_size_mb: float = 0.0
    workers: int = 0
    compression: str = "none"
    skip_bad: bool = False
    overwrite: bool = False
    tfds_data_dir: str = ""
    download: bool = False


@dataclasses.dataclass(frozen=True)
class Encoding:
    """How each example becomes a record (sent to worker processes)."""
    image_format: str
    jpeg_quality: int
    resize: tuple  # () | ("short", n) | ("exact", width, height)
    channels: int  # force this many channels (raw images must agree); 0 = each image's own (1 or 3)
    skip_bad: bool


# -- option checks ------------------------------------------------------------------------------------------------

def parse_resize(spec: str) -> tuple:
    """``""`` -> (); ``256`` -> ("short", 256); ``320x240`` -> ("exact", 320, 240)."""
    spec = spec.strip().lower()
    if not spec:
        return ()
    try:
        if "x" in spec:
            w, h = (int(v) for v in spec.split("x"))
            if w > 0 and h > 0:
                return ("exact", w, h)
        elif int(spec) > 0:
            return ("short", int(spec))
    except ValueError:
        pass
    raise ConfigError("resize", f"{spec!r}: expected the shorter side in pixels (256) or WIDTHxHEIGHT (320x240)")


def parse_num_shards(spec: str):
    """``""`` -> None; ``8`` -> 8 (every split); ``train:64,val:8`` -> {"train": 64, "val": 8}."""
    spec = spec.strip()
    if not spec:
        return None
    try:
        if ":" not in spec:
            value = int(spec)
            if value > 0:
                return value
        else:
            counts = {}
            for item in spec.split(","):
                name, _, n = item.partition(":")
                counts[name.strip()] = int(n)
            if all(v > 0 for v in counts.values()) and all(counts):
                return counts
    except ValueError:
        pass
    raise ConfigError("num_shards", f"{spec!r}: expected a positive count (8) or per split (train:64,val:8)")


def check_options(o: Options) -> None:
    """Raises ConfigError naming the flag for any bad value, before any work starts."""
    if not o.output_dir:
        raise ConfigError("output_dir", "is required")
    if o.image_format not in IMAGE_FORMATS:
        raise ConfigError("image_format", f"unknown format {o.image_format!r}; use one of {', '.join(IMAGE_FORMATS)}")
    if not 1 <= o.jpeg_quality <= 100:
        raise ConfigError("jpeg_quality", f"{o.jpeg_quality} is not in 1..100")
    if o.compression not in tfrecord.COMPRESSIONS:
        raise ConfigError("compression", f"unknown compression {o.compression!r}; use none or gzip")
    if o.workers < 0:
        raise ConfigError("workers", f"{o.workers} is negative; use 0 for automatic")
    if o.shard_size_mb < 0:
        raise ConfigError("shard_size_mb", f"{o.shard_size_mb} is negative")
    if o.num_shards and o.shard_size_mb:
        raise ConfigError("num_shards", "give --num_shards or --shard_size_mb, not both")
    if o.resize and o.image_format == "keep":
        raise ConfigError("resize", "resizing re-encodes images; use it with --image_format=png, jpeg or raw")
    parse_resize(o.resize)
    parse_num_shards(o.num_shards)
    if o.split:
        sources.parse_split_spec(o.split)


# -- one example -> one record ------------------------------------------------------------------------------------

def _sniff(encoded: bytes) -> str:
    if encoded[:3] == b"\xff\xd8\xff":
        return "jpeg"
    if encoded[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    if encoded[:4] in (b"GIF8",):
        return "gif"
    if encoded[:2] == b"BM":
        return "bmp"
    if encoded[:4] == b"RIFF" and encoded[8:12] == b"WEBP":
        return "webp"
    return "unknown"


def _visible_channels(c: int) -> int:
    """Channels the reader gets from an image stored with ``c``: alpha is dropped (2 -> 1, 4 -> 3)."""
    return {2: 1, 4: 3}.get(c, c)


def _resize(image: np.ndarray, resize: tuple) -> np.ndarray:
    import tensorflow as tf

    h, w = image.shape[:2]
    if resize[0] == "short":
        scale = resize[1] / min(h, w)
        size = [max(1, round(h * scale)), max(1, round(w * scale))]
    else:
        size = [resize[2], resize[1]]
    if size == [h, w]:
        return image
    out = tf.image.resize(image, size, method="bilinear", antialias=True)
    return np.clip(np.round(out.numpy()), 0, 255).astype(np.uint8)


def _op_error_text(e) -> str:
    """TensorFlow's error text without the op/function decorations."""
    text = getattr(e, "message", None) or str(e) or type(e).__name__
    text = re.sub(r"\{\{[^}]*\}\}\s*", "", text.strip().splitlines()[0])
    return re.sub(r"\s*\[Op:\w+\]", "", text).strip()


def example_to_record(name: str, label: int, data, enc: Encoding, origin: str = ""):
    """One source example -> (serialized tf.train.Example, stored (h, w, channels)).

    Raises BadImageError naming ``origin`` (the source path) when it cannot be read or decoded."""
    import tensorflow as tf

    origin = origin or name
    if isinstance(data, sources.Unreadable):
        raise BadImageError(origin, data.reason)
    encoded = None
    if isinstance(data, (bytes, np.bytes_)):
        encoded = bytes(data)
        try:
            image = tf.io.decode_image(encoded, expand_animations=False).numpy()
        except (tf.errors.OpError, ValueError) as e:
            raise BadImageError(origin, f"cannot decode ({_op_error_text(e)})") from None
        if image.size == 0:
            raise BadImageError(origin, "empty image")
    else:
        image = np.asarray(data)
        if image.ndim == 2:
            image = image[..., None]
    if enc.image_format == "keep" and encoded is not None:
        h, w, c = image.shape
        return tfrecord.make_example(encoded, _sniff(encoded), label, h, w, c, name), (h, w, _visible_channels(c))
    if encoded is not None and image.shape[-1] in (2, 4):
        image = image[..., :-1]  # decoded files: drop alpha, as the reader does
    if enc.resize:
        image = _resize(image, enc.resize)
    if enc.channels and image.shape[-1] != enc.channels:
        if image.shape[-1] == 1:
            image = np.repeat(image, enc.channels, axis=-1)
        else:
            raise BadImageError(origin, f"has {image.shape[-1]} channels, the dataset {enc.channels}")
    fmt = "png" if enc.image_format == "keep" else enc.image_format
    if fmt == "jpeg" and image.shape[-1] not in (1, 3):
        raise BadImageError(origin, f"JPEG cannot store {image.shape[-1]} channels; use --image_format=png or raw")
    stored = tfrecord.encode_image(np.ascontiguousarray(image), fmt, enc.jpeg_quality)
    h, w, c = image.shape
    return tfrecord.make_example(stored, fmt, label, h, w, c, name), (h, w, c)


class _Stats:
    """Per-shard counts and image shape statistics (merged across shards for the manifest)."""

    def __init__(self):
        self.num_examples = 0
        self.class_counts = {}
        self.h = [None, None, 0]  # min, max, sum
        self.w = [None, None, 0]
        self.channels = {}
        self.skipped = []

    def add(self, label, shape):
        self.num_examples += 1
        self.class_counts[str(label)] = self.class_counts.get(str(label), 0) + 1
        for acc, v in ((self.h, shape[0]), (self.w, shape[1])):
            acc[0] = v if acc[0] is None else min(acc[0], v)
            acc[1] = v if acc[1] is None else max(acc[1], v)
            acc[2] += int(v)
        self.channels[str(shape[2])] = self.channels.get(str(shape[2]), 0) + 1

    def to_json(self):
        return {"num_examples": self.num_examples, "class_counts": self.class_counts, "height": self.h,
                "width": self.w, "channels": self.channels, "skipped": self.skipped}


# -- worker side ----------------------------------------------------------------------------------------------------

class _LocalCounter:
    """In-process stand-in for the shared multiprocessing counter; reports progress as it counts."""

    def __init__(self, on_change=None):
        self.value = 0
        self.on_change = on_change

    def add(self, k):
        self.value += k
        if self.on_change:
            self.on_change(self.value)


class _SharedCounter:
    def __init__(self, value):
        self.shared = value

    def add(self, k):
        with self.shared.get_lock():
            self.shared.value += k


_COUNTER = _LocalCounter()


def _init_worker(shared_value):
    global _COUNTER
    _COUNTER = _SharedCounter(shared_value)
    import tensorflow as tf

    # One process per core: keep each worker's TensorFlow ops single-threaded.
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)


def build_shard(task: dict) -> dict:
    """Writes one shard (atomically) and its sidecar; returns the sidecar content."""
    stats = _Stats()
    enc = task["encoding"]

    def records():
        pending = 0
        for name, label, data, origin in task["payload"].examples():
            try:
                record, shape = example_to_record(name, label, data, enc, origin)
            except BadImageError as e:
                if not enc.skip_bad:
                    raise
                stats.skipped.append({"path": e.path, "reason": e.reason})
            else:
                stats.add(label, shape)
                yield record
            pending += 1
            if pending == 16:
                _COUNTER.add(pending)
                pending = 0
        _COUNTER.add(pending)

    with contextlib.suppress(FileNotFoundError):
        os.unlink(task["sidecar"])
    entry = tfrecord.write_shard(task["path"], records(), task["compression"])
    _make_readable(task["path"])
    result = {"plan": task["plan"], "entry": entry, "stats": stats.to_json()}
    atomic_write_bytes(task["sidecar"], json.dumps(result, sort_keys=True).encode())
    return result


def _make_readable(path: str):
    """Temporary files are created 0600; a dataset is meant to be shared, so give it the umask's mode."""
    umask = os.umask(0)
    os.umask(umask)
    with contextlib.suppress(OSError):
        os.chmod(path, 0o666 & ~umask)


def verified_shard(task: dict):
    """The sidecar of a shard already built from this plan whose file still matches its sha256, else None."""
    try:
        with open(task["sidecar"]) as f:
            done = json.load(f)
        if done.get("plan") != task["plan"] or not os.path.exists(task["path"]):
            return None
        if done["stats"]["skipped"] and not task["encoding"].skip_bad:
            return None  # rebuild it, so the bad image stops this run as it should without --skip_bad
        return done if tfrecord.sha256_file(task["path"]) == done["entry"]["sha256"] else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


# -- progress -------------------------------------------------------------------------------------------------------

class Progress:
    """Images done, images/sec and ETA on one line (redrawn on a tty; a plain line every ``interval`` s otherwise)."""

    def __init__(self, total: int, stream=None, interval: float | None = None):
        self.total, self.stream = total, stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.interval = interval if interval is not None else (0.5 if self.tty else 10.0)
        self.start = self.last = time.monotonic()
        self.first = None
        self.done = 0

    def update(self, done: int, force: bool = False):
        self.done = done
        now = time.monotonic()
        if self.first is None and done:
            self.first = (now, done)
        if not force and now - self.last < self.interval:
            return
        self.last = now
        # The rate counts from the first images done: worker start-up is not conversion speed.
        t0, d0 = self.first or (self.start, 0)
        rate = (done - d0) / (now - t0) if now - t0 > 0.05 else done / max(now - self.start, 1e-9)
        eta = (self.total - done) / rate if rate > 0 else float("nan")
        eta_text = "%d:%02d:%02d" % (eta // 3600, eta % 3600 // 60, eta % 60) if math.isfinite(eta) else "-:--:--"
        pct = 100.0 * done / self.total if self.total else 100.0
        line = f"convert: {done}/{self.total} images ({pct:.1f}%)  {rate:.1f} images/s  ETA {eta_text}"
        if self.tty:
            self.stream.write("\r" + line + ("\n" if force else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def finish(self):
        self.update(self.done, force=True)


# -- output directory -----------------------------------------------------------------------------------------------

def _fingerprint(o: Options, source: sources.Source) -> str:
    """Identifies a conversion: the source and every option that changes the output (not workers/skip_bad)."""
    key = {"converter": CONVERTER_VERSION, "source": source.identity, "split": o.split, "seed": o.seed,
           "image_format": o.image_format, "jpeg_quality": o.jpeg_quality if o.image_format == "jpeg" else None,
           "resize": o.resize, "num_shards": o.num_shards, "shard_size_mb": o.shard_size_mb,
           "compression": o.compression}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def _existing_fingerprint(directory: str):
    """(fingerprint, what) of the conversion already in ``directory``, if any."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        with open(os.path.join(directory, tfrecord.MANIFEST)) as f:
            return (json.load(f).get("converter") or {}).get("fingerprint"), "another dataset (dataset.json)"
    with contextlib.suppress(OSError, ValueError, AttributeError):
        with open(os.path.join(directory, STATE_DIR, "plan.json")) as f:
            return json.load(f).get("fingerprint"), "an unfinished conversion of a different source or options"
    return None, None


def _remove_dataset_files(directory: str, keep=()):
    """Removes what a conversion writes (manifest first, then shards, temp files, sidecars); nothing else."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(directory, tfrecord.MANIFEST))
    for name in os.listdir(directory):
        if (_SHARD_FILE.match(name) or _TEMP_FILE.match(name)) and name not in keep:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(directory, name))
    state = os.path.join(directory, STATE_DIR)
    if os.path.isdir(state):
        for name in os.listdir(state):
            if name != "lock" and name[:-len(".json")] not in keep:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(state, name))


def _remove_temp_files(directory: str):
    for folder in (directory, os.path.join(directory, STATE_DIR)):
        with contextlib.suppress(FileNotFoundError):
            for name in os.listdir(folder):
                if _TEMP_FILE.match(name):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(folder, name))


@contextlib.contextmanager
def _claim_output_dir(o: Options, source: sources.Source, fingerprint: str):
    """Checks the output directory may take this conversion, locks it against a second converter, yields."""
    directory = os.path.abspath(o.output_dir)
    if source.kind == "folder" and (directory + os.sep).startswith(os.path.join(os.path.abspath(o.source), "")):
        raise ConfigError("output_dir", f"{directory} is inside the source folder {o.source}")
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise ConfigError("output_dir", f"{directory} exists and is not a directory")
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as e:
        raise ConfigError("output_dir", f"cannot create {directory}: {e.strerror}") from None
    # Only the state of a conversion that never finished a shard (and its temp files): nothing to lose.
    entries = [e for e in os.listdir(directory) if e != STATE_DIR and not _TEMP_FILE.match(e)]
    existing, what = _existing_fingerprint(directory)
    if not entries:
        existing = what = None
    if entries and existing != fingerprint and not o.overwrite:
        what = what or f"{len(entries)} file(s) that are not a tfgpu conversion"
        raise ConfigError("output_dir", f"{directory} is not empty: it holds {what}; choose an empty directory "
                          "or pass --overwrite to replace it")
    state = os.path.join(directory, STATE_DIR)
    os.makedirs(state, exist_ok=True)
    import fcntl

    with open(os.path.join(state, "lock"), "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise ConfigError("output_dir", f"another tfgpu.convert is writing to {directory}") from None
        if existing != fingerprint:
            _remove_dataset_files(directory)
        _remove_temp_files(directory)
        atomic_write_bytes(os.path.join(state, "plan.json"),
                           json.dumps({"fingerprint": fingerprint, "options": dataclasses.asdict(o)},
                                      indent=2, sort_keys=True).encode())
        yield directory


# -- planning -------------------------------------------------------------------------------------------------------

def _scan_channels(splits: dict) -> int:
    """3 if any source image has colour, else 1 (stops at the first colour image); for --image_format=raw."""
    import tensorflow as tf

    for data in splits.values():
        for _, _, encoded, _ in data.payload(0, len(data)).examples():
            if isinstance(encoded, sources.Unreadable):
                continue
            with contextlib.suppress(tf.errors.OpError, ValueError):
                if _visible_channels(tf.io.decode_image(encoded, expand_animations=False).shape[-1]) >= 3:
                    return 3
    return 1


def _estimate_record_bytes(splits: dict, enc: Encoding, sample: int = 16) -> float:
    """Mean serialized record size over a few examples spread over the largest split."""
    data = max(splits.values(), key=len)
    if isinstance(data, sources.TfdsSplit):
        payload = data.payload(0, min(sample, len(data)))
    else:
        idx = np.unique(np.linspace(0, len(data) - 1, min(sample, len(data))).astype(int))
        payload = data.subset(idx).payload(0, len(idx))
    sizes = []
    for name, label, item, _ in payload.examples():
        with contextlib.suppress(BadImageError):
            sizes.append(len(example_to_record(name, label, item, enc)[0]))
    return float(np.mean(sizes)) if sizes else 100e3


def _check_num_shards(splits: dict, o: Options) -> None:
    requested = parse_num_shards(o.num_shards)
    if isinstance(requested, dict) and set(requested) != set(splits):
        raise ConfigError("num_shards", f"{o.num_shards!r} must name exactly the splits {', '.join(splits)}")


def _shard_counts(splits: dict, o: Options, enc: Encoding) -> dict:
    requested = parse_num_shards(o.num_shards)
    if isinstance(requested, dict):
        return {s: min(requested[s], len(d)) for s, d in splits.items()}
    if requested:
        return {s: min(requested, len(d)) for s, d in splits.items()}
    size = (o.shard_size_mb or DEFAULT_SHARD_SIZE_MB) * 2 ** 20
    mean = _estimate_record_bytes(splits, enc)
    return {s: max(1, min(len(d), math.ceil(len(d) * mean / size))) for s, d in splits.items()}


def _plan_tasks(directory, splits, counts, enc, compression, fingerprint):
    tasks = []
    for split, data in splits.items():
        n = counts[split]
        bounds = np.linspace(0, len(data), n + 1).astype(int)
        for i in range(n):
            payload = data.payload(int(bounds[i]), int(bounds[i + 1]))
            file = tfrecord.shard_name(split, i, n)
            how = dataclasses.replace(enc, skip_bad=None)  # skipping changes no record that was written
            plan = hashlib.sha256(f"{fingerprint}\0{file}\0{how}\0{payload.fingerprint()}".encode()).hexdigest()
            tasks.append({"split": split, "path": os.path.join(directory, file), "payload": payload,
                          "encoding": enc, "compression": compression, "plan": plan, "num_sources": len(payload),
                          "sidecar": os.path.join(directory, STATE_DIR, file + ".json")})
    return tasks


# -- running ----------------------------------------------------------------------------------------------------------

def _auto_workers(o: Options, num_tasks: int, num_examples: int) -> int:
    if o.workers:
        return min(o.workers, num_tasks)
    if num_examples < 20_000:
        return 1  # starting worker processes (each imports TensorFlow) costs more than it saves
    return max(1, min(os.cpu_count() or 1, num_tasks))


def _run_in_process(tasks, progress):
    global _COUNTER
    _COUNTER = _LocalCounter(progress.update)
    try:
        return [build_shard(t) for t in tasks]
    finally:
        _COUNTER = _LocalCounter()


class WorkerDiedError(RuntimeError):
    """A worker process ended abruptly (killed, out of memory) while writing shards."""


def _run_in_pool(tasks, workers, progress, directory):
    ctx = multiprocessing.get_context("spawn")  # TensorFlow is not fork-safe
    shared = ctx.Value("q", 0)
    saved = os.environ.get("TF_CPP_MIN_LOG_LEVEL")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        pool = concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker,
                                                      initargs=(shared,))
        futures = [pool.submit(build_shard, t) for t in tasks]
    finally:
        if saved is None:
            os.environ.pop("TF_CPP_MIN_LOG_LEVEL", None)
    try:
        while True:
            done, pending = concurrent.futures.wait(futures, timeout=0.2,
                                                    return_when=concurrent.futures.FIRST_EXCEPTION)
            progress.update(shared.value)
            for f in done:
                if f.exception() is not None:
                    raise f.exception()
            if not pending:
                break
        progress.update(shared.value)
        pool.shutdown()
        return [f.result() for f in futures]
    except BrokenProcessPool:
        _stop(pool, directory)
        raise WorkerDiedError("a worker process died while writing shards (killed, or out of memory?); the "
                              "shards it finished are kept: rerun the same command to finish") from None
    except BaseException:
        _stop(pool, directory)
        raise


def _stop(pool, directory):
    """Stops the workers now (their half-written shards are temp files, removed here) rather than letting them
    finish their shards."""
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        with contextlib.suppress(Exception):
            process.terminate()
    pool.shutdown(wait=True, cancel_futures=True)
    _remove_temp_files(directory)


def convert(o: Options, stream=None, out=None) -> dict:
    """Runs one conversion; returns the manifest written to ``<output_dir>/dataset.json``.

    Raises ConfigError (a bad flag) or BadImageError (a source image, without --skip_bad)."""
    stream, out = stream or sys.stderr, out or sys.stdout
    check_options(o)
    source = sources.open_source(o.source, o.tfds_data_dir, o.download)
    parts = sources.parse_split_spec(o.split) if o.split else []
    splits = sources.apply_split(source, parts, o.seed)
    _check_num_shards(splits, o)
    fingerprint = _fingerprint(o, source)
    with _claim_output_dir(o, source, fingerprint) as directory:
        channels = 0
        if o.image_format == "raw":
            channels = source.channels or _scan_channels(splits)
        enc = Encoding(o.image_format, o.jpeg_quality, parse_resize(o.resize), channels, o.skip_bad)
        counts = _shard_counts(splits, o, enc)
        tasks = _plan_tasks(directory, splits, counts, enc, o.compression, fingerprint)
        total = sum(t["num_sources"] for t in tasks)
        workers = _auto_workers(o, len(tasks), total)
        with concurrent.futures.ThreadPoolExecutor(max(1, workers)) as pool:
            reused = list(pool.map(verified_shard, tasks))
        todo = [t for t, r in zip(tasks, reused) if r is None]
        done_before = sum(t["num_sources"] for t, r in zip(tasks, reused) if r is not None)
        if len(todo) < len(tasks):
            print(f"reusing {len(tasks) - len(todo)} complete, verified shard(s) of {len(tasks)} "
                  f"({done_before} images)", file=stream, flush=True)
        if todo:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(directory, tfrecord.MANIFEST))  # the dataset is incomplete from here on
            todo_images = sum(t["num_sources"] for t in todo)
            print(f"converting {todo_images} images into {len(todo)} shard(s) in {directory} with {workers} "
                  f"worker(s)", file=stream, flush=True)
            progress = Progress(todo_images, stream)
            built = _run_in_pool(todo, workers, progress, directory) if workers > 1 else \
                _run_in_process(todo, progress)
            progress.finish()
            built = iter(built)
            reused = [r if r is not None else next(built) for r in reused]
        manifest = _manifest(o, source, splits, tasks, reused, enc, fingerprint)
        _remove_stale(directory, {r["entry"]["file"] for r in reused})
        tfrecord.write_manifest(directory, manifest)
        _make_readable(os.path.join(directory, tfrecord.MANIFEST))
    for split, entry in manifest["splits"].items():
        print(f"{split}: {entry['num_examples']} examples in {len(entry['shards'])} shard(s)"
              f"{', skipped ' + str(entry['num_skipped']) if entry['num_skipped'] else ''}", file=out)
    if manifest["skipped"]:
        print(f"skipped {len(manifest['skipped'])} bad image(s), listed under 'skipped' in "
              f"{os.path.join(directory, tfrecord.MANIFEST)}", file=out)
    print(f"wrote {os.path.join(directory, tfrecord.MANIFEST)}", file=out, flush=True)
    return manifest


def _remove_stale(directory, keep):
    """Shards (and sidecars) of this directory that the new manifest does not list: from earlier plans."""
    for name in os.listdir(directory):
        if _SHARD_FILE.match(name) and name not in keep:
            os.unlink(os.path.join(directory, name))
    state = os.path.join(directory, STATE_DIR)
    for name in os.listdir(state):
        if name.endswith(".tfrecord.json") and name[:-len(".json")] not in keep:
            os.unlink(os.path.join(state, name))


def _manifest(o, source, splits, tasks, results, enc, fingerprint) -> dict:
    split_entries, skipped = {}, []
    h, w, channels = [None, None, 0], [None, None, 0], {}
    for split, data in splits.items():
        mine = [(t, r) for t, r in zip(tasks, results) if t["split"] == split]
        class_counts = {str(i): 0 for i in range(len(source.classes))}
        num_examples = num_skipped = 0
        for t, r in mine:
            st = r["stats"]
            if st["num_examples"] + len(st["skipped"]) != t["num_sources"] or \
                    st["num_examples"] != r["entry"]["num_examples"]:
                raise RuntimeError(f"{r['entry']['file']}: {st['num_examples']} records + {len(st['skipped'])} "
                                   f"skipped != {t['num_sources']} sources")
            num_examples += st["num_examples"]
            num_skipped += len(st["skipped"])
            skipped.extend({**s, "split": split} for s in st["skipped"])
            for label, n in st["class_counts"].items():
                class_counts[label] = class_counts.get(label, 0) + n
            for acc, part in ((h, st["height"]), (w, st["width"])):
                if part[0] is not None:
                    acc[0] = part[0] if acc[0] is None else min(acc[0], part[0])
                    acc[1] = part[1] if acc[1] is None else max(acc[1], part[1])
                    acc[2] += part[2]
            for c, n in st["channels"].items():
                channels[c] = channels.get(c, 0) + n
        if num_examples + num_skipped != len(data):
            raise RuntimeError(f"split {split}: {num_examples} examples + {num_skipped} skipped != {len(data)}")
        split_entries[split] = {"num_examples": num_examples, "num_skipped": num_skipped, "num_sources": len(data),
                                "shards": [r["entry"] for _, r in mine], "class_counts": class_counts}
    total = sum(e["num_examples"] for e in split_entries.values())
    image_shape = {"channels": max((int(c) for c in channels), default=source.channels or 0),
                   "channels_seen": channels}
    if total:
        image_shape.update(height_min=h[0], height_max=h[1], height_mean=round(h[2] / total, 2),
                           width_min=w[0], width_max=w[1], width_mean=round(w[2] / total, 2))
        if h[0] == h[1] and w[0] == w[1]:
            image_shape.update(height=h[0], width=w[0])
    return {
        "name": source.name, "source": o.source, "source_kind": source.kind, "classes": list(source.classes),
        "splits": split_entries, "compression": o.compression,
        "image_format": o.image_format if source.encoded or o.image_format != "keep" else "png",
        "image_shape": image_shape, "skipped": skipped, "num_skipped": len(skipped),
        "converter": {"fingerprint": fingerprint, "seed": o.seed, "split": o.split, "resize": o.resize,
                      "jpeg_quality": o.jpeg_quality if o.image_format == "jpeg" else None,
                      "channels": enc.channels or None},
    }


def main(argv=None):
    """Runs ``python -m tfgpu.convert``'s argument list; raises ConfigError/BadImageError instead of exiting."""
    from tfgpu import convert as cli

    return convert(cli.parse_args(argv))
