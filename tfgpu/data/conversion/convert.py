"""Converts a source (tfgpu.data.sources.source) into sharded TFRecords plus ``dataset.json``, safely and resumably.

The steps, each in its own module: open the source (``source_formats.SOURCE_FORMATS``: ``sources``, ``folders``,
``csvlist``, ``foreign`` or ``tfds_source``) and say what will not be converted; check split names and classes;
claim the output directory (``outdir``); plan one task per shard; reuse the shards a previous run finished and
verified, write the rest (``workers``; records by ``encode``); ``outdir.publish`` puts them in place and writes
``dataset.json`` last.
Nothing a reader uses is touched before every shard is done: a stopped run leaves what was there.

``--output_dir`` may be any path TensorFlow opens (``gs://``, ``ram://``); the source is read from local disk or TFDS.
"""
import concurrent.futures
import contextlib
import dataclasses
import functools
import gzip
import hashlib
import json
import math
import os
import sys

import numpy as np

from tfgpu.config import ConfigError
from tfgpu.data.conversion import outdir, workers
from tfgpu.data.schema import tfrecord
from tfgpu.data.sources import csvlist, folders, foreign, source as source_lib, source_formats
from tfgpu.data.conversion import manifest as manifest_lib
from tfgpu.data.conversion.encode import (BadImageError, Encoding, example_to_record,  # noqa: F401 (API)
                                          visible_channels)
from tfgpu.data.sources.folders import display
from tfgpu.data.conversion.workers import WorkerDiedError  # noqa: F401 (API: tfgpu.convert catches it)
from tfgpu.runtime import fileio


IMAGE_FORMATS = ("keep", "png", "jpeg", "raw")
STATE_DIR = outdir.STATE_DIR
DEFAULT_SHARD_SIZE_MB = 100.0


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
    image_key: str = tfrecord.ENCODED  # tfrecord: sources: the features holding the image and the label,
    label_key: str = tfrecord.LABEL
    label_offset: int = 0  # and what makes a label a class index from 0 (-1 for 1-based labels)


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
    fileio.check_scheme(o.output_dir, "output_dir")
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
    parse_resize(o.resize)
    parse_num_shards(o.num_shards)
    if o.split:
        source_lib.parse_split_spec(o.split)
    for flag in ("image_key", "label_key"):
        if not getattr(o, flag):
            raise ConfigError(flag, "is empty: name the feature key of the records (e.g. image/encoded)")
    if (o.image_key, o.label_key, o.label_offset) != (tfrecord.ENCODED, tfrecord.LABEL, 0) and \
            not o.source.startswith("tfrecord:"):
        raise ConfigError("image_key" if o.image_key != tfrecord.ENCODED else "label_key" if
                          o.label_key != tfrecord.LABEL else "label_offset", "applies to --source=tfrecord:GLOB only")


# -- planning -------------------------------------------------------------------------------------------------------

def _scan_channels(splits: dict) -> int:
    """3 if any source image has colour, else 1 (stops at the first colour image); for --image_format=raw."""
    from tfgpu.data.conversion import encode

    for data in splits.values():
        for _, _, encoded, origin in data.payload(0, len(data)).examples():
            if isinstance(encoded, source_lib.Unreadable):
                continue
            with contextlib.suppress(BadImageError):
                if visible_channels(encode.decode(encoded, origin)[0].shape[-1]) >= 3:
                    return 3
    return 1


def _sample_records(splits: dict, enc: Encoding, sample: int = 16) -> list:
    """A few serialized records, as they will be stored, from examples spread over the largest split."""
    data = max(splits.values(), key=len)
    if data.labels is None:  # TFDS: read a range, not an index
        payload = data.payload(0, min(sample, len(data)))
    else:
        idx = np.unique(np.linspace(0, len(data) - 1, min(sample, len(data))).astype(int))
        payload = data.subset(idx).payload(0, len(idx))
    records = []
    for name, label, item, _ in payload.examples():
        with contextlib.suppress(BadImageError):
            records.append(example_to_record(name, label, item, enc)[0])
    return records


def _mean_record_bytes(records: list) -> float:
    """Mean serialized record size (100 kB when no sample could be read)."""
    return float(np.mean([len(r) for r in records])) if records else 100e3


def _bytes_needed(records: list, num_examples: int, compression: str) -> int:
    """Estimated bytes of ``num_examples`` records on disk: the sample's mean size (gzipped as a whole when the
    shards are, plus TFRecord's 16 bytes of framing a record when not) times their number; 0 without a sample."""
    if not records:
        return 0
    if compression == "gzip":
        per_record = len(gzip.compress(b"".join(records), compresslevel=6)) / len(records)
    else:
        per_record = _mean_record_bytes(records) + 16
    return int(per_record * num_examples)


def _check_num_shards(splits: dict, o: Options) -> None:
    requested = parse_num_shards(o.num_shards)
    if isinstance(requested, dict) and set(requested) != set(splits):
        raise ConfigError("num_shards", f"{o.num_shards!r} must name exactly the splits {', '.join(splits)}")


def _shard_counts(splits: dict, o: Options, sample) -> dict:
    """Shards per split; ``sample()`` gives the sampled records that size them when no --num_shards is given."""
    requested = parse_num_shards(o.num_shards)
    if isinstance(requested, dict):
        return {s: min(requested[s], len(d)) for s, d in splits.items()}
    if requested:
        return {s: min(requested, len(d)) for s, d in splits.items()}
    size = (o.shard_size_mb or DEFAULT_SHARD_SIZE_MB) * 2 ** 20
    mean = _mean_record_bytes(sample())
    return {s: max(1, min(len(d), math.ceil(len(d) * mean / size))) for s, d in splits.items()}


def _plan_tasks(directory, splits, counts, enc, compression, fingerprint, staged):
    """One task per shard; ``staged``: a finished dataset is in the directory, so shards are written beside it."""
    tasks = []
    for split, data in splits.items():
        n = counts[split]
        bounds = np.linspace(0, len(data), n + 1).astype(int)
        for i in range(n):
            payload = data.payload(int(bounds[i]), int(bounds[i + 1]))
            file = tfrecord.shard_name(split, i, n)
            path = outdir.inside(directory, os.path.join(directory, file))
            how = dataclasses.replace(enc, skip_bad=None)  # skipping changes no record that was written
            plan = hashlib.sha256(f"{fingerprint}\0{file}\0{how}\0{payload.fingerprint()}".encode()).hexdigest()
            tasks.append({"split": split, "path": path, "write_path": outdir.staged_path(path) if staged else path,
                          "payload": payload, "encoding": enc, "compression": compression, "plan": plan,
                          "num_sources": len(payload), "sidecar": os.path.join(directory, STATE_DIR, file + ".json")})
    return tasks


# -- checking and reporting the source ------------------------------------------------------------------------------

def _check_source(o: Options, source: source_lib.Source, splits: dict, stream) -> None:
    """Refuses what cannot become a sound dataset and says, before any work, what will not be converted."""
    where = display(o.source)
    for name in splits:
        csvlist.check_split_name(name, where)
    unreadable = source.not_converted.get("unreadable_folder")
    if unreadable and not o.skip_bad:
        raise BadImageError(unreadable[0], "cannot list this folder (permissions?); its images would be left out")
    labelled = [d.labels for d in splits.values() if d.labels is not None]
    used = sorted({int(v) for labels in labelled for v in np.unique(labels)})
    if labelled and len(used) == 1:
        print(f"warning: only one class ({source.classes[used[0]]}) has images: fine for an unconditional GAN, but "
              "a classifier needs two or more", file=stream)
    for line in source.notices:
        print(line, file=stream)
    if source.followed_outside:
        print(f"took {len(source.followed_outside)} image(s) through symlinks that lead outside their class folder "
              f"(first: {display(source.followed_outside[0])})", file=stream)
    if source.not_converted:
        counts = ", ".join(f"{len(source.not_converted[reason])} {text}" for reason, text in folders.REASONS.items()
                           if reason in source.not_converted)
        print(f"not converted: {counts}; listed under not_converted in dataset.json", file=stream)
    stream.flush()


def _check_records(o: Options, source: source_lib.Source) -> None:
    """Stops at the first foreign record that cannot be used at all (no image or label under the keys, a label
    below 0, an image that does not decode), unless --skip_bad leaves such records out of new shards."""
    bad = source.in_place.first_bad()
    if bad and not o.skip_bad:
        raise BadImageError(*bad)


def _check_examples(manifest: dict) -> None:
    """Refuses to publish a split left without examples (every image skipped as bad)."""
    for split, entry in manifest["splits"].items():
        if entry["num_sources"] and not entry["num_examples"]:
            first = next((s for s in manifest["skipped"] if s["split"] == split), {})
            raise ConfigError("skip_bad", f"every image of split {split!r} was skipped as bad ({entry['num_skipped']}"
                              f" of {entry['num_sources']}; first: {first.get('path')}: {first.get('reason')}); "
                              "nothing to train on")


# -- running ----------------------------------------------------------------------------------------------------------

def _auto_workers(o: Options, num_tasks: int, num_examples: int) -> int:
    if fileio.scheme(o.output_dir) == "ram":
        return 1  # ram:// lives in one process: what a worker process wrote there would be lost
    if o.workers:
        return min(o.workers, num_tasks)
    if num_examples < 20_000:
        return 1  # starting worker processes (each imports TensorFlow) costs more than it saves
    return max(1, min(os.cpu_count() or 1, num_tasks))


def convert(o: Options, stream=None, out=None) -> dict:
    """Runs one conversion; returns the manifest written to ``<output_dir>/dataset.json``.

    Raises ConfigError (a bad flag or source) or BadImageError (a source image, without --skip_bad)."""
    stream, out = stream or sys.stderr, out or sys.stdout
    check_options(o)
    if o.resize and o.image_format == "keep":
        print(f"--resize re-encodes every image: JPEG sources as JPEG at --jpeg_quality={o.jpeg_quality}, the "
              "others as PNG (--image_format=png stores every one losslessly)", file=stream, flush=True)
    source = source_formats.open_source(o.source, o)
    parts = source_lib.parse_split_spec(o.split) if o.split else []
    splits = source_lib.apply_split(source, parts, o.seed)
    _check_num_shards(splits, o)
    _check_source(o, source, splits, stream)
    key = outdir.fingerprint(dataclasses.asdict(o), source.identity)
    if source.in_place is not None:
        _check_records(o, source)
        why = foreign.rewrites(o) or source.in_place.why_not()
        if not why:
            return foreign.write_references(o, source, key, out)
        print(f"writing new shards (the source's cannot be read in place): {why}", file=stream, flush=True)
        foreign.check_apart(o.output_dir, source)
    with outdir.claim(o, source.kind, o.source, key) as directory:
        staged = fileio.exists(os.path.join(directory, tfrecord.MANIFEST))
        channels = 0
        if o.image_format == "raw":
            channels = source.channels or _scan_channels(splits)
        enc = Encoding(o.image_format, o.jpeg_quality, parse_resize(o.resize), channels, o.skip_bad)
        sample = functools.cache(lambda: _sample_records(splits, enc))
        counts = _shard_counts(splits, o, sample)
        tasks = _plan_tasks(directory, splits, counts, enc, o.compression, key, staged)
        total = sum(t["num_sources"] for t in tasks)
        num_workers = _auto_workers(o, len(tasks), total)
        with concurrent.futures.ThreadPoolExecutor(max(1, num_workers)) as pool:
            results = list(pool.map(workers.verified_shard, tasks))
        todo = [t for t, r in zip(tasks, results) if r is None]
        done_before = sum(t["num_sources"] for t, r in zip(tasks, results) if r is not None)
        if len(todo) < len(tasks):
            print(f"reusing {len(tasks) - len(todo)} complete, verified shard(s) of {len(tasks)} "
                  f"({done_before} images)", file=stream, flush=True)
        needed = 0
        if todo:
            todo_images = sum(t["num_sources"] for t in todo)
            needed = _bytes_needed(sample(), todo_images, o.compression)
            outdir.check_space(directory, needed)
            beside = " (beside the finished dataset there, swapped in when all are done)" if staged else ""
            print(f"converting {todo_images} images into {len(todo)} shard(s) in {display(directory)} with "
                  f"{num_workers} worker(s){beside}", file=stream, flush=True)
            progress = workers.conversion_progress(todo_images, stream)
            with outdir.reporting_no_space(directory, needed):
                built = workers.run_in_pool(todo, num_workers, progress, directory) if num_workers > 1 else \
                    workers.run_in_process(todo, progress)
            progress.close()
            built = iter(built)
            results = [r if r is not None else next(built) for r in results]
        manifest = manifest_lib.build(o, source, splits, tasks, results, enc, key)
        _check_examples(manifest)
        with outdir.reporting_no_space(directory, needed + len(json.dumps(manifest, indent=2, sort_keys=True))):
            outdir.publish(directory, tasks, results, lambda: tfrecord.write_manifest(directory, manifest))
    for split, entry in manifest["splits"].items():
        print(f"{split}: {entry['num_examples']} examples in {len(entry['shards'])} shard(s)"
              f"{', skipped ' + str(entry['num_skipped']) if entry['num_skipped'] else ''}", file=out)
    where = display(os.path.join(directory, tfrecord.MANIFEST))
    if manifest["skipped"]:
        print(f"skipped {len(manifest['skipped'])} bad image(s), listed under 'skipped' in {where}", file=out)
    if manifest["adjusted"]:
        print("adjusted: " + ", ".join(f"{n} {manifest_lib.ADJUSTED[k]}" for k, n in sorted(manifest["adjusted"].items())),
              file=out)
    print(f"wrote {where}", file=out, flush=True)
    return manifest
