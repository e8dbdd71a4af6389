"""A ``tf.data.Dataset`` of unbatched ``(image, label)`` examples, written once as a converted dataset.

``tfgpu.fit`` takes a user's ``tf.data.Dataset`` and trains on it through the normal
input pipeline, which reads converted directories (``dataset.json`` + shards): that is
where exactly-once epochs, sharding over workers and exact resume come from. So the
dataset is materialized once, by the converter's own shard writer
(``workers.build_shard``: ``encode.example_to_record`` -> ``tfrecord.write_shard``, PNG
records named ``<split>/<index>``, as ``tfrecord.write_arrays`` names them) and the
converter's manifest (``convert._manifest``), published with ``outdir.publish`` so
``dataset.json`` comes last. Nothing here is a second format.

What a dataset must hold: elements ``(image, label)``; images ``HxWxC`` with C 1 or 3,
uint8 or float, in the converter's pixels 0..255 (``input_range`` sets what the model
sees); labels class indices >= 0 (integer, or whole floats) or one-hot vectors. What
Keras' loaders give (``keras.utils.image_dataset_from_directory``: batches of float32
pixels in [0, 255], int or one-hot labels, ``class_names``) is taken as it is: ``accept``
unbatches a batched dataset, saying so in one line; float pixels are checked as each
example is written (every value in [0, 255], else an error naming the example; a
split whose pixels all lie in [0, 1] is refused as unscaled) and rounded to uint8 (one
line says so; resizing interpolates fractions, which the uint8 records cannot keep);
one-hot labels become their class index (anything but exactly one 1 is refused);
``class_names`` become the manifest's classes. Anything else is one ``ConfigError``
naming the argument, found from ``element_spec`` before any example is read where the
spec tells. The float checks cost one min/max and one rounding per image, on the pass
that writes it.

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
from tfgpu.data import convert, outdir, sources, tfrecord, workers
from tfgpu.data.encode import Encoding
from tfgpu.runtime import fileio

log = logging.getLogger("tfgpu")

KEY = "from_dataset"  # the manifest's fingerprint entry
VERSION = 1
CHANNELS = (1, 3)
ENCODING = Encoding(image_format="png", jpeg_quality=95, resize=(), channels=0, skip_bad=False)
SHARD_BYTES = convert.DEFAULT_SHARD_SIZE_MB * 2 ** 20  # raw pixels per shard (PNG records are smaller)
WAIT_STALL_S = 1800.0  # a non-chief gives up when the chief's directory shows no progress this long
_POLL_S = 1.0
_MOD = 1 << 256

_FIX = {
    "batched": "pass unbatched examples (ds.unbatch(), or drop the .batch() call): tfgpu batches them itself",
    "pair": "map it to (image, label) pairs, e.g. ds.map(lambda d: (d['image'], d['label'])) or TFDS's "
            "as_supervised=True",
    "dtype": "images must be uint8 or float pixels in [0, 255], as the converter stores them (input_range sets "
             "the range the model sees)",
    "range": "tfgpu takes pixels in [0, 255] (input_range sets what the model sees); for floats in [0, 1]: "
             "ds.map(lambda x, y: (x * 255, y)); for Keras' loaders, keep their default interpolation='bilinear'",
}


# -- what Keras' loaders give --------------------------------------------------------------------------------------

def accept(dataset, argument: str):
    """(dataset as the writer takes it, the line to log about it or ""): a batched dataset (images of rank 4, or
    labels of rank 2, as Keras' loaders give) is unbatched; then ``check_spec``. Cheap: reads no example."""
    _check_pairs(dataset, argument)
    notes = []
    image, label = dataset.element_spec
    if _batched(image, label):
        notes.append(f"elements are batches (image {_shape(image)}, label {_shape(label)}): unbatched, as tfgpu "
                     "batches examples itself")
        dataset = dataset.unbatch()
        image, label = dataset.element_spec
    check_spec(dataset, argument)
    if image.dtype.is_floating:
        notes.append(f"{image.dtype.name} images: stored as uint8, each checked as it is written to lie in "
                     "[0, 255] and rounded to whole values")
    if label.shape.rank == 1:
        notes.append("one-hot labels: stored as their class index")
    return dataset, f"{argument}: {'; '.join(notes)}" if notes else ""


def class_names(train_data, eval_data=None) -> tuple:
    """The ``class_names`` Keras' loaders attach to their datasets (``()`` when there are none); eval_data's must
    equal train_data's."""
    names = tuple(getattr(train_data, "class_names", None) or ())
    if not all(isinstance(n, str) for n in names) or len(set(names)) != len(names):
        raise ConfigError("train_data", f"its class_names {list(names)} are not distinct strings")
    other = tuple(getattr(eval_data, "class_names", None) or ())
    if names and other and other != names:
        raise ConfigError("eval_data", f"its class_names {list(other)} differ from train_data's {list(names)}")
    return names


def _batched(image, label) -> bool:
    """Whether an element is a batch: images of rank 4, labels of rank 2 (one-hot batches), or (N, H, W)
    grayscale batches whose leading dimension matches their (N,) integer labels."""
    leading_match = (image.shape.rank == 3 and label.shape.rank == 1 and label.dtype.is_integer
                     and image.shape[0] == label.shape[0])
    return image.shape.rank == 4 or label.shape.rank == 2 or leading_match


# -- what an element must be ----------------------------------------------------------------------------------------

def check_spec(dataset, argument: str) -> None:
    """Raises ConfigError(argument) when ``dataset`` is not a finite, non-empty Dataset of unbatched (image, label)
    examples as far as its ``element_spec`` and cardinality tell; cheap (reads no example)."""
    _check_pairs(dataset, argument)
    image, label = dataset.element_spec
    if _batched(image, label):
        raise ConfigError(argument, f"elements look batched (image {_shape(image)}, label {_shape(label)}); "
                          f"{_FIX['batched']}")
    if image.dtype != tf.uint8 and not image.dtype.is_floating:
        raise ConfigError(argument, f"images are {image.dtype.name}; {_FIX['dtype']}")
    if image.shape.rank not in (None, 3):
        raise ConfigError(argument, f"images must be HxWxC, got shape {_shape(image)} (for HxW grayscale: "
                          "ds.map(lambda x, y: (x[..., None], y)))")
    if image.shape.rank == 3 and image.shape[-1] is not None and image.shape[-1] not in CHANNELS:
        raise ConfigError(argument, f"images have {image.shape[-1]} channels; tfgpu stores 1 (grayscale) or 3 "
                          "(RGB)")
    if not (label.dtype.is_integer or label.dtype.is_floating):
        raise ConfigError(argument, f"labels must be class indices or one-hot vectors, got {label.dtype.name}")
    if label.shape.rank not in (None, 0, 1):
        raise ConfigError(argument, f"labels must be scalars (one class index per image) or one-hot vectors, got "
                          f"shape {_shape(label)}")
    cardinality = int(dataset.cardinality())
    if cardinality == tf.data.INFINITE_CARDINALITY:
        raise ConfigError(argument, "is infinite (a .repeat()?); pass one pass over the examples: tfgpu repeats "
                          "them for epochs/train_steps")
    if cardinality == 0:
        raise ConfigError(argument, "has no examples")


def _check_pairs(dataset, argument: str) -> None:
    """Raises ConfigError(argument) unless ``dataset`` is a Dataset of (image, label) pairs of tensors."""
    if not isinstance(dataset, tf.data.Dataset):
        raise ConfigError(argument, f"expected a tf.data.Dataset, got {type(dataset).__name__}")
    spec = dataset.element_spec
    if isinstance(spec, dict):
        raise ConfigError(argument, f"elements are dicts ({', '.join(map(str, spec))}), not (image, label) "
                          f"pairs; {_FIX['pair']}")
    if not isinstance(spec, tuple) or len(spec) != 2 or not all(isinstance(s, tf.TensorSpec) for s in spec):
        raise ConfigError(argument, f"elements must be (image, label) pairs of tensors, got {_describe(spec)}; "
                          f"{_FIX['pair']}")


def _shape(spec) -> str:
    return str(tuple(spec.shape.as_list())) if spec.shape.rank is not None else "(unknown rank)"


def _describe(spec) -> str:
    if isinstance(spec, tf.TensorSpec):
        return f"a single tensor {_shape(spec)} {spec.dtype.name} (no label)"
    if isinstance(spec, tuple):
        return f"tuples of {len(spec)}"
    return type(spec).__name__


def describe_spec(dataset) -> str:
    """The element spec as the fingerprint records it."""
    image, label = dataset.element_spec
    return f"image {image.shape} {image.dtype.name}, label {label.shape} {label.dtype.name}"


class _Examples:
    """Walks one pass of a dataset as numpy, checking each example (what ``element_spec`` left open, labels
    against ``num_classes``) and accumulating the count, the content hash and the largest label."""

    def __init__(self, dataset, argument: str, num_classes: int = 0):
        self.dataset, self.argument, self.num_classes = dataset, argument, num_classes
        self.count, self.digest_sum, self.max_label = 0, 0, -1
        self.one_hot_width = 0  # the classes one-hot labels count (0: none seen)
        self.float_max = None  # the largest float pixel (None: no float images)

    def __iter__(self):
        for image, label in self.dataset.as_numpy_iterator():
            where = f"example {self.count}"
            if image.ndim != 3 or image.shape[-1] not in CHANNELS:
                raise ConfigError(self.argument, f"{where}: image shape {image.shape}; expected HxWxC with C 1 or 3")
            image, label = self._pixels(image, where), self._class_index(label, where)
            if label < 0 or (self.num_classes and label >= self.num_classes):
                bound = f" (num_classes={self.num_classes})" if self.num_classes else ""
                raise ConfigError(self.argument, f"{where}: label {label} is not a class index 0..N-1{bound}")
            h = hashlib.sha256(np.asarray([*image.shape, label], np.int64).tobytes())
            h.update(np.ascontiguousarray(image).tobytes())
            self.digest_sum = (self.digest_sum + int.from_bytes(h.digest(), "big")) % _MOD
            self.count += 1
            self.max_label = max(self.max_label, label)
            yield image, label
        if self.count and self.float_max is not None and self.float_max <= 1.0:
            raise ConfigError(self.argument, f"its float pixels all lie in [0, 1] (largest {self.float_max:.4g}); "
                              f"{_FIX['range']}")

    def _pixels(self, image: np.ndarray, where: str) -> np.ndarray:
        """uint8 pixels; float ones checked to lie in [0, 255] and rounded."""
        if image.dtype == np.uint8:
            return image
        low, high = float(np.min(image)), float(np.max(image))
        if not 0.0 <= low <= high <= 255.0:
            raise ConfigError(self.argument, f"{where}: pixel values span [{low:.4g}, {high:.4g}], not within "
                              f"[0, 255]; {_FIX['range']}")
        self.float_max = max(self.float_max or 0.0, high)
        return np.rint(image).astype(np.uint8)

    def _class_index(self, label, where: str) -> int:
        """The class index of an integer or whole-float label, a one-value vector, or a one-hot vector."""
        value = np.asarray(label)
        if value.ndim > 1:
            raise ConfigError(self.argument, f"{where}: label shape {value.shape}; expected a scalar or one-hot "
                              "vector")
        if value.ndim == 1 and value.size > 1:
            if not (np.isin(value, (0, 1)).all() and value.sum() == 1):
                raise ConfigError(self.argument, f"{where}: label {np.array2string(value, threshold=12)} is not "
                                  "one-hot (exactly one 1, else 0); pass class indices (label_mode='int')")
            self.one_hot_width = max(self.one_hot_width, value.size)
            return int(np.argmax(value))
        if value.size != 1 or not np.isfinite(value).all() or value.reshape(-1)[0] != np.floor(value.reshape(-1)[0]):
            raise ConfigError(self.argument, f"{where}: label {value.tolist()} is not a class index")
        return int(value.reshape(-1)[0])

    def fingerprint(self) -> dict:
        return {"element_spec": describe_spec(self.dataset), "num_examples": self.count,
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
    largest = max(max(w.max_label + 1, w.one_hot_width) for w in walks.values())
    classes = list(class_names) or [str(c) for c in range(num_classes or largest)]
    options = convert.Options(source="tf.data.Dataset", output_dir=directory, image_format="png")
    source = sources.Source("tf.data", "tf.data", classes, {}, presplit=True, encoded=False)
    found = {"version": VERSION, "splits": {split: walk.fingerprint() for split, walk in walks.items()}}
    key = hashlib.sha256(json.dumps(found, sort_keys=True).encode()).hexdigest()
    manifest = convert._manifest(options, source, {s: range(n) for s, n in plan.items()}, tasks, results, ENCODING,
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
