"""How a split's records are read: shards cut into segments, unreadable records read around
(--skip_corrupt_records), labels checked as they are parsed, and a failed read turned into one line naming the
shard and record. ``pipeline`` builds the train and eval pipelines over these; ``resume`` and
``tfgpu.audit_input`` count in the same readable records."""
import re

import numpy as np
import tensorflow as tf

from tfgpu.data.input import augment
from tfgpu.data.schema import shards, tfrecord
from tfgpu.data.input.dataset_info import DatasetInfo

# tf.data traces every function given to map/interleave/flat_map below. None branches on a tensor in Python, so
# autograph is off for them (as for the train loop): converting every call inside them took 0.6 s of the first
# pipeline's construction on 2 cores (0.71-0.76 s with it, 0.14 s without), on the way to the first step.
_no_autograph = tf.autograph.experimental.do_not_convert


def open_records(filename, compression):
    return tf.data.TFRecordDataset(filename, compression_type="GZIP" if compression == "gzip" else None)


def readable_files(info: DatasetInfo, split: str):
    """((file, readable records), ...) of ``split``: the manifest's counts less the unreadable records that
    --skip_corrupt_records reads around. Shares and epochs are cut from these, so every readable record is
    trained once per epoch and no epoch needs refilling."""
    return tuple((f, n - len(info.damaged[f].unreadable) if f in info.damaged else n)
                 for f, n in info.split_files[split])


def skipped_records(info: DatasetInfo) -> dict:
    """{split: unreadable records read around} for the splits the run reads (--skip_corrupt_records)."""
    return {split: sum(len(info.damaged[f].unreadable) for f, _ in info.split_files[split] if f in info.damaged)
            for split in dict.fromkeys((info.train_split, info.eval_split)) if split}


def readable_indices(info: DatasetInfo, split: str, file_index: int, first: int, count: int):
    """The record indices in the file of a segment of readable records ``[first, first + count)`` (positions
    among the file's readable records, as ``train_share`` cuts them)."""
    filename = info.split_files[split][file_index][0]
    if filename not in info.damaged:
        return np.arange(first, first + count)
    return np.array([i for i, _, _ in info.damaged[filename].readable()[first:first + count]], np.int64)


class Segments:
    """A split's segments ``(file_index, first, count)`` (positions among a file's readable records) as the
    tensors the readers take: whole-file reads (``TFRecordDataset.skip(first).take(count)``) for intact shards;
    for a damaged shard, rows of a table of its readable records' (index, offset, length), read from the shard's
    bytes (the whole shard in memory while its segment is read, once an epoch: a damaged shard costs that)."""

    def __init__(self, info: DatasetInfo, split: str, segments):
        files = info.split_files[split]
        self.compression = info.compression
        self.around = any(files[i][0] in info.damaged for i, _, _ in segments)
        columns, table = [], []
        for i, first, count in segments:
            filename = files[i][0]
            if filename in info.damaged:
                rows = info.damaged[filename].readable()[first:first + count]
                columns.append((filename, i, 0, 0, len(table), len(rows)))
                table += rows
            else:
                columns.append((filename, i, first, count, 0, 0))
        self.table = tuple(tf.constant(c, tf.int64) for c in zip(*table)) if table else None
        names, *numbers = zip(*columns)
        self.dataset = tf.data.Dataset.from_tensor_slices((list(names), *(tf.constant(c, tf.int64) for c in numbers)))
        self.count = len(columns)

    def read(self, filename, file_index, first, count, row, rows):
        """(key, record) of one segment; key = ``file_index * 2**32 + index in the file`` (tfgpu.audit_input counts
        keys; the label check names the record by it)."""
        base = file_index * (1 << 32)
        records = tf.data.Dataset.zip(tf.data.Dataset.counter(start=base), open_records(filename, self.compression))
        records = records.skip(first).take(count)
        if not self.around:
            return records
        index, offset, length = self.table

        def around(name):  # a damaged shard is never gzip (shards.verify refuses those)
            content = tf.io.read_file(name)
            return tf.data.Dataset.range(row, row + rows).map(
                lambda r: (base + index[r], tf.strings.substr(content, offset[r], length[r])))

        return records.concatenate(
            tf.data.Dataset.from_tensors(filename).take(tf.minimum(rows, 1)).flat_map(_no_autograph(around)))


def segment_records(segments: Segments, segment_ds, workers):
    """(key, record) of ``segment_ds``'s segments, interleaved in a fixed order (parallel reads)."""
    return segment_ds.interleave(_no_autograph(segments.read), cycle_length=min(segments.count, 16),
                                 block_length=1, num_parallel_calls=workers, deterministic=True)


def checked_label(split: str, key, label, num_classes: int):
    """``label``, once it is a class index; else the step fails with an error ``explain_read_error`` turns into
    one line naming the file, record and label (one comparison per example)."""
    ok = tf.logical_and(label >= 0, label < num_classes)
    with tf.control_dependencies([tf.debugging.Assert(ok, [LABEL_ERROR, split, key, label])]):
        return tf.identity(label)


def checked_labels(split: str, keys, labels, num_classes: int):
    """``labels`` (a batch, with their records' ``keys``) once every one is a class index: one vectorized
    comparison a batch; the error names the first bad record as ``checked_label`` does."""
    bad = tf.logical_or(labels < 0, labels >= num_classes)
    first = tf.argmax(tf.cast(bad, tf.int32), output_type=tf.int32)
    ok = tf.logical_not(tf.reduce_any(bad))
    with tf.control_dependencies([tf.debugging.Assert(ok, [LABEL_ERROR, split, tf.gather(keys, first),
                                                           tf.gather(labels, first)])]):
        return tf.identity(labels)


LABEL_ERROR = "tfgpu: bad label in split"
RECORD_ERROR = "tfgpu: bad record in split"


def checked(value, ok, split: str, key, problem):
    """``value`` once ``ok``; else the step fails with an error ``explain_read_error`` turns into one line
    "<shard>: record <index> <problem>" (``problem``: a string tensor without brackets). A task's own check of
    what its records hold (``Examples.example``) goes through here."""
    with tf.control_dependencies([tf.debugging.Assert(ok, [RECORD_ERROR, split, key, problem])]):
        return tf.identity(value)


class Examples:
    """What a record holds and how it becomes one example ``(x, y)``: the hook a task gives the input pipelines
    (``Task.examples``), which keep the shares, epochs, segments and resume. This default is classification's:
    the image under ``tfrecord.ENCODED``, decoded, augmented (--augment) and scaled to --input_range; one class
    index under ``tfrecord.LABEL``, checked as it is parsed (``checked_label``) when the dataset has classes.
    A task with other labels overrides ``feature_spec``, ``label`` and ``synthetic_labels``."""

    def __init__(self, config, info: DatasetInfo):
        self.config = config  # tfgpu.config.InputConfig
        self.info = info
        self.labelled = info.num_classes > 0

    def feature_spec(self) -> dict:
        """The ``tf.io`` feature spec a record is parsed with."""
        return tfrecord.LABELLED_SPEC if self.labelled else tfrecord.FEATURE_SPEC

    def image(self, features, seed=None):
        """The model's input: decoded, augmented when ``seed`` is given (training), in --input_range."""
        config = self.config
        h, w, c = self.info.image_shape
        if seed is None:
            image = augment.preprocess_eval(features, config.image_size, c, config.augment, config.input_range)
        else:
            image = augment.preprocess_train(features, config.image_size, c, config.augment, seed,
                                             config.input_range)
        return tf.ensure_shape(image, [h, w, c])

    def label(self, features, split: str, key):
        """The target, checked as it is parsed."""
        label = features[tfrecord.LABEL]
        return checked_label(split, key, label, self.info.num_classes) if self.labelled else label

    def train_example(self, serialized, split: str, key, seed):
        """``example`` as the train pipeline calls it per record: classification's label check is left to
        ``check_batch`` (one vectorized check a batch instead of an assertion a record); a task's own ``label``
        checks as it parses, and a task's own ``example`` (a sample weight, say) is called as it is."""
        if not self._labels_checked_per_batch():
            return self.example(serialized, split, key, seed)
        features = self.parse(serialized)
        return self.image(features, seed), features[tfrecord.LABEL]

    def check_batch(self, labels, keys, split: str):
        """``labels`` of a batch once each is a class index (classification's labels, left unchecked by
        ``train_example``); else the step fails naming the first bad record, as ``checked_label`` does."""
        if not self._labels_checked_per_batch():
            return labels
        return checked_labels(split, keys, labels, self.info.num_classes)

    def holds_decoded(self) -> bool:
        """Whether the train pipeline may hold this task's images decoded in memory (``data.input.memory``):
        classification's own ``parse``, ``image``, ``label`` and ``example`` (a task overriding one of them is
        called per record)."""
        cls = type(self)
        return self._labels_checked_per_batch() and cls.parse is Examples.parse and cls.image is Examples.image

    def _labels_checked_per_batch(self) -> bool:
        """Whether the train pipeline parses records itself and checks their labels a batch at a time: only for
        classification's own ``label`` and ``example`` (a task overriding either is called per record)."""
        cls = type(self)
        return self.labelled and cls.label is Examples.label and cls.example is Examples.example

    def example(self, serialized, split: str, key, seed=None):
        """``(x, y)`` of one serialized record of ``split`` (``key``: its identity for errors); ``seed`` given:
        augmented for training. A task may return ``(x, y, sample_weight)``: the weight of the example in the
        loss and the metrics (evaluation's padding has weight 0)."""
        features = self.parse(serialized)
        return self.image(features, seed), self.label(features, split, key)

    def parse(self, serialized) -> dict:
        """The record's features: by ``feature_spec``, or, for another writer's records read in place (the
        manifest's ``record_keys``), its image and label under tfgpu's names, the label offset added."""
        if self.info.record_keys != tfrecord.OWN_KEYS:
            return tfrecord.parse_example(serialized, labelled=self.labelled, keys=self.info.record_keys)
        return tf.io.parse_single_example(serialized, self.feature_spec())

    def synthetic_labels(self, rng: np.random.Generator, count: int) -> np.ndarray:
        """``count`` random targets for --dataset=synthetic."""
        return rng.integers(0, self.info.num_classes, count).astype(np.int64)


def find_corrupt_record(info: DatasetInfo):
    """Scans the dataset's shards on the host for the first unreadable record: (file, index, reason) or None.

    Called after a read failed, because tf.data's DataLossError names neither the file nor the record."""
    for split in info.split_files:
        for filename, _ in info.split_files[split]:
            index = 0
            try:
                for _ in tf.data.TFRecordDataset(filename, compression_type="GZIP" if info.compression == "gzip"
                                                 else None):
                    index += 1
            except (tf.errors.DataLossError, tf.errors.OutOfRangeError) as e:
                return filename, index, e.message.split("\n")[0].strip()
    return None


def explain_read_error(info: DatasetInfo, error: tf.errors.OpError):
    """One line naming the shard and record behind a read failure tf.data reports without them (an unreadable
    record, a label outside [0, num_classes), a record without a label), or None for other errors."""
    if isinstance(error, tf.errors.DataLossError):
        found = find_corrupt_record(info)
        where = f"{found[0]}: record {found[1]} is unreadable ({found[2]})" if found else "a record is unreadable"
        return f"{where}; convert the dataset again, or pass --skip_corrupt_records to train on the other records"
    if not isinstance(error, tf.errors.InvalidArgumentError):
        return None
    if re.search(rf"Key: {re.escape(info.record_keys.label)}\.\s+Can't parse serialized Example", error.message or ""):
        return (f"{info.directory}: its records hold several values under {info.record_keys.label!r}: multi-label "
                "labels: use --task=multilabel")  # classification parses one class index per record
    problem = re.search(rf"\[{RECORD_ERROR}\] \[(.*?)\] \[(\d+)\] \[([^\]]*)\]", error.message or "")
    if problem:
        split, key = problem.group(1), int(problem.group(2))
        said = re.sub(r"\\(['\"\\])", r"\1", problem.group(3))  # the Assert's message escapes quotes
        return f"{info.split_files[split][key >> 32][0]}: record {key & 0xFFFFFFFF} {said}"
    match = re.search(rf"\[{LABEL_ERROR}\] \[(.*?)\] \[(\d+)\] \[(-?\d+)\]", error.message or "")
    if not match:
        return None
    split, key, label = match.group(1), int(match.group(2)), int(match.group(3))
    filename = info.split_files[split][key >> 32][0]
    index = key & 0xFFFFFFFF
    if label == tfrecord.MISSING_LABEL:
        damaged = info.damaged.get(filename)
        keys = info.record_keys
        problem = tfrecord.missing_feature(shards.read_record(filename, info.compression, index, damaged),
                                           keys.required(labelled=True))
        return (f"{filename}: record {index} {problem or 'has no ' + repr(keys.label)}; the {split!r} split needs "
                f"a label in every record (under {keys.label!r}, {info.directory}/{tfrecord.MANIFEST}'s record "
                "keys)")
    offset = info.record_keys.label_offset
    stored = f" (stored {label - offset}, label_offset {offset})" if offset else ""
    return (f"{filename}: record {index} has label {label}{stored}, outside [0, {info.num_classes}) for the "
            f"{info.num_classes} classes of {info.directory}/{tfrecord.MANIFEST}; labels must be class indices from 0 "
            "(1-based labels, as some ImageNet TFRecords have, need 1 subtracted: tfgpu.convert "
            "--source=tfrecord:GLOB --label_offset=-1), or the manifest must list every class")


def train_records(info: DatasetInfo) -> int:
    """The train split's readable records (the manifest's count less those --skip_corrupt_records reads around):
    what epochs, shares and a run's data position are counted in."""
    return sum(n for _, n in readable_files(info, info.train_split))
