"""A ``tf.data.Dataset`` of unbatched ``(image, label)`` examples, written once as a converted dataset.

``tfgpu.fit`` takes a user's ``tf.data.Dataset`` and trains on it through the normal
input pipeline, which reads converted directories (``dataset.json`` + shards): that is
where exactly-once epochs, sharding over workers and exact resume come from. So the
dataset is materialized once, by the converter's own shard writer
(``workers.build_shard``: ``encode.example_to_record`` -> ``tfrecord.write_shard``, PNG
records named ``<split>/<index>``, as ``tfrecord.write_arrays`` names them) and the
converter's manifest (``manifest.build``), published with ``outdir.publish`` so
``dataset.json`` comes last. Nothing here is a second format.

What a dataset must hold, and how what Keras' loaders give is taken (batches unbatched, float pixels
checked and rounded, one-hot labels, ``class_names``), is ``tfgpu.data.elements``.

The manifest keeps a fingerprint of what was written (``from_dataset``): per split the
element spec, the number of examples and a content hash computed while writing. The
hash is the sum mod 2**256 of each example's sha256 (of its shape, label and pixels),
so it does not depend on the order the dataset yields its examples in: a dataset that
shuffles (tfgpu shuffles anyway) still matches itself, one whose examples change from
pass to pass (random augmentation inside the dataset) does not. ``ensure`` reuses a
directory whose fingerprint matches and refuses one that does not.

The directory may be on any file system TensorFlow opens (``gs://``, ``ram://``): every check, the state
directory and the wait for the chief go through ``tfgpu.runtime.fileio``, as the shards and manifest do.
"""
import hashlib
import json
import logging
import math
import os
import sys
import time

import numpy as np
import tensorflow as tf

from tfgpu.config import ConfigError
from tfgpu.data import convert, elements, outdir, sources, tfrecord, workers
from tfgpu.data import manifest as manifest_lib
from tfgpu.data.encode import Encoding
from tfgpu.runtime import fileio

log = logging.getLogger("tfgpu")

KEY = "from_dataset"  # the manifest's fingerprint entry
VERSION = 1
ENCODING = Encoding(image_format="png", jpeg_quality=95, resize=(), channels=0, skip_bad=False)
SHARD_BYTES = convert.DEFAULT_SHARD_SIZE_MB * 2 ** 20  # raw pixels per shard (PNG records are smaller)
WAIT_STALL_S = 1800.0  # a non-chief gives up when the chief's directory shows no progress this long
_POLL_S = 1.0
_MOD = 1 << 256

class _Examples:
    """Walks one pass of a dataset as numpy, checking each example (what ``element_spec`` left open, labels
    against ``num_classes``) and accumulating the count, the content hash and the largest label."""

    def __init__(self, dataset, argument: str, num_classes: int = 0):
        self.dataset, self.argument, self.num_classes = dataset, argument, num_classes
        self.count, self.digest_sum, self.max_label = 0, 0, -1
        self.intake = elements.Intake(argument)

    def __iter__(self):
        for image, label in self.dataset.as_numpy_iterator():
            where = f"example {self.count}"
            image, label = self.intake.example(image, label, where)
            if label < 0 or (self.num_classes and label >= self.num_classes):
                bound = f" (num_classes={self.num_classes})" if self.num_classes else ""
                raise ConfigError(self.argument, f"{where}: label {label} is not a class index 0..N-1{bound}")
            h = hashlib.sha256(np.asarray([*image.shape, label], np.int64).tobytes())
            h.update(np.ascontiguousarray(image).tobytes())
            self.digest_sum = (self.digest_sum + int.from_bytes(h.digest(), "big")) % _MOD
            self.count += 1
            self.max_label = max(self.max_label, label)
            yield image, label
        self.intake.finish()

    def fingerprint(self) -> dict:
        return {"element_spec": elements.describe_spec(self.dataset), "num_examples": self.count,
                "content_hash": f"{self.digest_sum:064x}"}


def fingerprint(datasets: dict, arguments: dict, num_classes: int = 0) -> dict:
    """The fingerprint ``materialize`` records, from one pass over each dataset (no encoding, no writing)."""
    splits = {}
    for split, dataset in datasets.items():
        examples = _Examples(dataset, arguments[split], num_classes)
        for _ in examples:
            pass
        splits[split] = examples.fingerprint()
    return {"version": VERSION, "splits": splits}


# -- writing ---------------------------------------------------------------------------------------------------------

class _Payload:
    """The next ``size`` examples of a shared walk, as the converter's shard writer reads a payload."""

    def __init__(self, walk, argument: str, split: str, first: int, size: int):
        self.walk, self.argument, self.split, self.first, self.size = walk, argument, split, first, size

    def __len__(self):
        return self.size

    def examples(self):
        for i in range(self.first, self.first + self.size):
            image, label = next(self.walk, (None, None))
            if image is None:
                raise ConfigError(self.argument, f"ended after {i} examples, but reported (or counted on a first "
                                  f"pass) {self.first + self.size} or more: its examples change from pass to pass")
            name = f"{self.split}/{i}"
            yield name, label, image, name


def _num_examples(dataset, argument: str, num_classes: int) -> int:
    cardinality = int(dataset.cardinality())
    if cardinality >= 0:
        return cardinality
    counted = _Examples(dataset, argument, num_classes)  # e.g. after .filter(): count it once
    for _ in counted:
        pass
    if not counted.count:
        raise ConfigError(argument, "has no examples")
    return counted.count


def _num_shards(dataset, num_examples: int) -> int:
    """Shards of at most ``SHARD_BYTES`` raw pixels (the first example's size stands for all)."""
    image, _ = next(iter(dataset.take(1).as_numpy_iterator()))
    return max(1, min(num_examples, math.ceil(num_examples * image.size / SHARD_BYTES)))


def _class_bound(num_classes: int, names: tuple) -> int:
    """The number of classes labels must stay under (0: any): ``num_classes``, else the number of class names."""
    if names and num_classes and num_classes != len(names):
        raise ConfigError("num_classes", f"is {num_classes}, but train_data's class_names name {len(names)} classes")
    return num_classes or len(names)


def materialize(directory: str, datasets: dict, arguments: dict, num_classes: int = 0, stream=None,
                class_names: tuple = ()) -> dict:
    """Writes ``datasets`` ({split: Dataset}) into ``directory`` as a converted dataset; returns its manifest.

    ``arguments`` names each split's argument for errors; ``num_classes`` (0 = largest label + 1, or the width of
    one-hot labels) bounds the labels and sets the manifest's classes, named by ``class_names`` when given. Shards are written in place (each atomically) and ``dataset.json``
    last, so an interrupted write leaves no dataset; the next call writes it again."""
    stream = stream or sys.stderr
    num_classes = _class_bound(num_classes, class_names)
    state = os.path.join(directory, convert.STATE_DIR)
    fileio.makedirs(state)
    tasks, walks, walking, plan = [], {}, {}, {}
    for split, dataset in datasets.items():
        n = _num_examples(dataset, arguments[split], num_classes)
        walks[split] = _Examples(dataset, arguments[split], num_classes)
        walk = walking[split] = iter(walks[split])
        num_shards = _num_shards(dataset, n)
        bounds = np.linspace(0, n, num_shards + 1).astype(int)
        plan[split] = n
        for i in range(num_shards):
            path = outdir.inside(directory, os.path.join(directory, tfrecord.shard_name(split, i, num_shards)))
            payload = _Payload(walk, arguments[split], split, int(bounds[i]), int(bounds[i + 1] - bounds[i]))
            tasks.append({"split": split, "path": path, "write_path": path, "payload": payload,
                          "encoding": ENCODING, "compression": "none", "plan": "", "num_sources": len(payload),
                          "sidecar": os.path.join(state, os.path.basename(path) + ".json")})
    total = sum(plan.values())
    print(f"tfgpu.fit: writing {total} examples ({', '.join(f'{s}: {n}' for s, n in plan.items())}) once into "
          f"{directory}", file=stream, flush=True)
    progress = workers.conversion_progress(total, stream)
    results = workers.run_in_process(tasks, progress)
    progress.close()
    for split, walk in walking.items():
        if next(walk, None) is not None:
            raise ConfigError(arguments[split], f"yields more than the {plan[split]} examples it reported (or "
                              "counted on a first pass): its examples change from pass to pass")
    largest = max(max(w.max_label + 1, w.intake.one_hot_width) for w in walks.values())
    classes = list(class_names) or [str(c) for c in range(num_classes or largest)]
    options = convert.Options(source="tf.data.Dataset", output_dir=directory, image_format="png")
    source = sources.Source("tf.data", "tf.data", classes, {}, presplit=True, encoded=False)
    found = {"version": VERSION, "splits": {split: walk.fingerprint() for split, walk in walks.items()}}
    key = hashlib.sha256(json.dumps(found, sort_keys=True).encode()).hexdigest()
    manifest = manifest_lib.build(options, source, {s: range(n) for s, n in plan.items()}, tasks, results, ENCODING,
                                 key)
    manifest[KEY] = found
    outdir.publish(directory, tasks, results, lambda: tfrecord.write_manifest(directory, manifest))
    return tfrecord.read_manifest(directory)


# -- reuse, refuse, wait -------------------------------------------------------------------------------------------

def difference(stored: dict, current: dict, arguments: dict):
    """(argument, how it differs) for the first way fingerprint ``current`` differs from ``stored``, or None."""
    old, new = stored.get("splits", {}), current["splits"]
    for split in sorted(set(old) | set(new)):
        argument = arguments.get(split, split)
        if split not in new:
            return argument, "is None now but was given when the data was written"
        if split not in old:
            return argument, "is given now but was None when the data was written"
        for key, what in (("element_spec", "element spec"), ("num_examples", "number of examples"),
                          ("content_hash", "content")):
            if old[split].get(key) != new[split][key]:
                shown = "" if key == "content_hash" else f" ({old[split].get(key)} then, {new[split][key]} now)"
                return argument, f"its {what} differs from the data written{shown}"
    return None


def ensure(directory: str, datasets: dict, arguments: dict, is_chief: bool, num_classes: int = 0,
           worker: str = "", stream=None, class_names: tuple = ()) -> dict:
    """Makes ``directory`` hold ``datasets`` ({split: Dataset}) as a converted dataset, once; returns its manifest.

    The chief writes it, or, when it is there already (a resumed run), reuses it after checking this call's
    datasets against its fingerprint (one pass, no writing). Every other worker of a multi-worker job checks its
    own datasets the same way and waits for the chief's ``dataset.json``, so all train on the chief's records and
    a worker whose dataset differs (other files, an unseeded random map) stops with a ConfigError naming it."""
    path = os.path.join(directory, tfrecord.MANIFEST)
    if is_chief and not fileio.exists(path):
        return materialize(directory, datasets, arguments, num_classes, stream, class_names)
    current = fingerprint(datasets, arguments, _class_bound(num_classes, class_names))
    if not is_chief:
        _wait_for(path, directory)
    try:
        manifest = tfrecord.read_manifest(directory)
    except (FileNotFoundError, ValueError) as e:
        raise ConfigError("model_dir", str(e)) from None
    stored = manifest.get(KEY)
    if not isinstance(stored, dict):
        raise ConfigError("model_dir", f"{directory} holds a dataset that tfgpu.fit did not write; use another "
                          "model_dir")
    different = difference(stored, current, arguments)
    if different:
        argument, how = different
        if is_chief:
            why = "a run resumes only on the data it started with: use a new model_dir for new data"
        else:
            why = f"{worker or 'this worker'} differs from the chief, and every worker must pass the same examples"
        raise ConfigError(argument, f"{how} in {directory}; {why} (a dataset whose examples change from pass to "
                          "pass, e.g. random augmentation inside it, never matches: use augment=... instead)")
    log.info("reusing %s: the data given matches its fingerprint", directory)
    return manifest


def _wait_for(path: str, directory: str) -> None:
    """Waits for the chief's manifest; ConfigError when the chief's directory shows no progress for too long."""
    last, changed = None, time.monotonic()
    while not fileio.exists(path):
        state = _written_so_far(directory)
        if state != last:
            last, changed = state, time.monotonic()
        elif time.monotonic() - changed > WAIT_STALL_S:
            raise ConfigError("model_dir", f"waited {WAIT_STALL_S:.0f} s for the chief to write {path} and saw no "
                              "progress: model_dir must be storage every worker sees (as for checkpoints)")
        time.sleep(_POLL_S)


def _written_so_far(directory: str):
    """The names and sizes of what the chief has written in ``directory`` and its state directory (a shard's
    sidecar appears there when the shard is done; an object store shows an object only once it is whole), or
    None while there is nothing to list."""
    state = []
    for folder in (directory, os.path.join(directory, convert.STATE_DIR)):
        try:
            names = fileio.listdir(folder)
        except OSError:
            continue
        for name in names:
            state.append((folder, name, _size(os.path.join(folder, name))))
    return sorted(state) or None


def _size(path: str) -> int:
    """The size of file ``path`` in bytes (-1 when it is gone, or a directory without one)."""
    try:
        if not fileio.has_scheme(path):
            return os.stat(path).st_size
        return int(tf.io.gfile.stat(path).length)
    except (OSError, tf.errors.OpError):
        return -1
