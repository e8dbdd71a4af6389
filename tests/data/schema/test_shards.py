"""Shards checked against dataset.json before a run reads them (issue 28 items 1-4), with data another tool wrote:
records written here with tf.io.TFRecordWriter and a hand-written manifest.

Records are told apart by their label: record i of the split has label i (``classes`` lists them all)."""
import collections
import json
import os
import re

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tfgpu.config import Config, ConfigError
from tfgpu.data import catalog
from tfgpu.data.input import pipeline, records
from tfgpu.data.schema import shards, tfrecord
from tfgpu.tasks.registry import input_config

PNG = tf.io.encode_png(np.zeros((2, 2, 1), np.uint8)).numpy()


def example(label=None, label_key=tfrecord.LABEL) -> bytes:
    """A record as another tool may write it: the image and (optionally) a label under ``label_key``."""
    feature = {tfrecord.ENCODED: tf.train.Feature(bytes_list=tf.train.BytesList(value=[PNG]))}
    if label is not None:
        feature[label_key] = tf.train.Feature(int64_list=tf.train.Int64List(value=[label]))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def write_dataset(directory, shard_records, num_classes, counts=None, sha256=False, compression="none"):
    """Shards of serialized records (one list per shard) and a manifest claiming ``counts`` (default: the truth);
    returns (directory, shard paths)."""
    os.makedirs(directory, exist_ok=True)
    entries, paths = [], []
    for i, records in enumerate(shard_records):
        path = os.path.join(directory, f"train-{i:05d}-of-{len(shard_records):05d}.tfrecord")
        with tf.io.TFRecordWriter(path, tfrecord.COMPRESSIONS[compression]) as writer:
            for record in records:
                writer.write(record)
        entry = {"file": os.path.basename(path), "num_examples": len(records) if counts is None else counts[i]}
        if sha256:
            entry["sha256"] = tfrecord.sha256_file(path)
        entries.append(entry)
        paths.append(path)
    manifest = {"format_version": tfrecord.FORMAT_VERSION, "name": "foreign", "compression": compression,
                "classes": [str(c) for c in range(num_classes)],
                "image_shape": {"height": 2, "width": 2, "channels": 1},
                "splits": {"train": {"num_examples": sum(e["num_examples"] for e in entries), "shards": entries}}}
    with open(os.path.join(directory, tfrecord.MANIFEST), "w") as f:
        json.dump(manifest, f)
    return str(directory), paths


def ids(sizes):
    """Shards of records labelled 0..N-1 in order."""
    starts = np.cumsum((0,) + tuple(sizes))
    return [[example(int(label)) for label in range(starts[i], starts[i + 1])] for i in range(len(sizes))]


def config(directory, cache_dir, **overrides):
    return Config(**{"model_dir": "unused", "data_dir": directory, "data_cache_dir": str(cache_dir),
                     "global_batch_size": 1, "shuffle_buffer": 1, **overrides})


def flip(path, offset):
    data = bytearray(open(path, "rb").read())
    data[offset] ^= 0x40
    with open(path, "wb") as f:
        f.write(bytes(data))


# -- item 1: counts and checksums -----------------------------------------------------------------------------------


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_a_manifest_count_the_shard_does_not_hold_is_refused_naming_both(tmp_path, compression):
    """The pipeline used to fill the claimed 30 records per epoch with repeats of the 20 there are."""
    directory, paths = write_dataset(tmp_path / "d", ids([20]), 20, counts=[30], compression=compression)
    with pytest.raises(ConfigError) as e:
        catalog.prepare(config(directory, tmp_path / "cache"))
    message = str(e.value)
    assert message.startswith("--data_dir: ") and "\n" not in message
    assert "dataset.json says train-00000-of-00001.tfrecord holds 30 records" in message
    assert f"{paths[0]} holds 20" in message


def test_a_split_count_its_shards_do_not_add_up_to_is_refused(tmp_path):
    directory, _ = write_dataset(tmp_path / "d", ids([5, 5]), 10)
    manifest = json.loads(open(os.path.join(directory, "dataset.json")).read())
    manifest["splits"]["train"]["num_examples"] = 12
    open(os.path.join(directory, "dataset.json"), "w").write(json.dumps(manifest))
    with pytest.raises(ConfigError, match=r"dataset.json says split 'train' holds 12 records, but its shards list 10"):
        catalog.prepare(config(directory, tmp_path / "cache"))


def test_a_shard_changed_since_conversion_is_refused_by_its_sha256(tmp_path):
    directory, paths = write_dataset(tmp_path / "d", ids([6]), 6, sha256=True)
    with tf.io.TFRecordWriter(paths[0]) as writer:  # other, readable records in the same number
        for label in (5, 4, 3, 2, 1, 0):
            writer.write(example(label))
    with pytest.raises(ConfigError, match=rf"{paths[0]}: its sha256 .* is not the .*/dataset.json records, though "
                                          "every record reads"):
        catalog.prepare(config(directory, tmp_path / "cache"))


def test_the_verdict_is_paid_once_per_shard_and_again_when_it_changes(tmp_path, monkeypatch):
    directory, paths = write_dataset(tmp_path / "d", ids([4, 4]), 8, sha256=True)
    walks = []
    real = shards._headers
    monkeypatch.setattr(shards, "_headers", lambda *a: walks.append(a[0]) or real(*a))
    catalog.prepare(config(directory, tmp_path / "cache"))
    catalog.prepare(config(directory, tmp_path / "cache"))
    assert sorted(walks) == sorted(paths)  # the second run reads the cached verdict
    flip(paths[1], os.path.getsize(paths[1]) - 30)
    with pytest.raises(ConfigError, match=rf"{paths[1]}: record 3 is unreadable"):
        catalog.prepare(config(directory, tmp_path / "cache"))
    assert walks[2:] == [paths[1]]


def test_a_corrupt_record_of_a_converted_dataset_is_named_before_training(tmp_path):
    """The manifest's sha256 finds it up front; the record is the one holding the flipped byte."""
    directory, paths = write_dataset(tmp_path / "d", ids([10]), 10, sha256=True)
    record_bytes = os.path.getsize(paths[0]) // 10
    flip(paths[0], 7 * record_bytes + 20)
    with pytest.raises(ConfigError) as e:
        catalog.prepare(config(directory, tmp_path / "cache"))
    assert f"{paths[0]}: record 7 is unreadable" in str(e.value) and "--skip_corrupt_records" in str(e.value)


# -- item 2: labels outside [0, num_classes) ------------------------------------------------------------------------


def first_error(cfg, info):
    """The one line explain_read_error gives for the train pipeline's failure."""
    ds = pipeline.train_dataset_fn(input_config(cfg), info, 0)(tf.distribute.InputContext())
    with pytest.raises(tf.errors.InvalidArgumentError) as e:
        for _ in ds.take(2 * info.num_train_examples):  # two epochs: every record parsed
            pass
    return records.explain_read_error(info, e.value)


@pytest.mark.parametrize("labels", [list(range(10, 20)), list(range(1, 11))], ids=["10-19", "1-based"])
def test_a_label_outside_the_classes_stops_naming_file_record_and_label(tmp_path, labels):
    """These used to train on all-zero one-hot targets."""
    directory, paths = write_dataset(tmp_path / "d", [[example(label) for label in labels]], 10)
    cfg = config(directory, tmp_path / "cache")
    message = first_error(cfg, catalog.prepare(cfg))
    named = re.match(rf"{paths[0]}: record (\d+) has label (\d+), outside \[0, 10\) for the 10 classes", message)
    assert named and labels[int(named[1])] == int(named[2]) >= 10, message


# -- item 3: a missing label key -----------------------------------------------------------------------------------


def test_records_that_store_the_label_under_another_key_are_refused_naming_both(tmp_path):
    """These used to train with label -1 (loss 0, accuracy 0, exit 0)."""
    directory, paths = write_dataset(tmp_path / "d", [[example(i % 3, label_key="label") for i in range(6)]], 3)
    with pytest.raises(ConfigError) as e:
        catalog.prepare(config(directory, tmp_path / "cache"))
    assert (f"{paths[0]}: record 0 has no 'image/class/label' (its keys: image/encoded (bytes_list), label "
            "(int64_list))") in str(e.value)


def test_a_record_without_a_label_mid_shard_stops_naming_it(tmp_path):
    records = [example(i % 3) for i in range(6)]
    records[4] = example(1, label_key="class")
    directory, paths = write_dataset(tmp_path / "d", [records], 3)
    cfg = config(directory, tmp_path / "cache")
    assert first_error(cfg, catalog.prepare(cfg)).startswith(f"{paths[0]}: record 4 has no 'image/class/label' "
                                                              "(its keys: class (int64_list)")


def test_unlabelled_data_without_classes_is_read_as_before(tmp_path):
    """An unconditional GAN's data may have no labels (and no classes): nothing to check, nothing refused."""
    directory, _ = write_dataset(tmp_path / "d", [[example() for _ in range(4)]], 0)
    cfg = config(directory, tmp_path / "cache")
    info = catalog.prepare(cfg)
    batch = next(iter(pipeline.train_dataset_fn(input_config(cfg), info, 0)(tf.distribute.InputContext())))
    assert batch[1].numpy().tolist() == [-1]


# -- item 4: --skip_corrupt_records costs the unreadable record only -------------------------------------------------


def epochs_seen(cfg, info, pipelines, num_epochs):
    """Per epoch, how often each label was yielded by all pipelines together."""
    epoch = sum(n for _, n in records.readable_files(info, "train")) // pipelines
    seen = [collections.Counter() for _ in range(num_epochs)]
    for p in range(pipelines):
        ds = pipeline.train_dataset_fn(input_config(cfg), info, 0)(tf.distribute.InputContext(pipelines, p, pipelines))
        labels = [int(y) for _, batch in ds.take(num_epochs * epoch).as_numpy_iterator() for y in batch]
        for e in range(num_epochs):
            seen[e].update(labels[e * epoch:(e + 1) * epoch])
    return seen


def refused_for_uncountable_gaps(damaged: set, headers: set) -> bool:
    """Whether a shard with these damaged records (``headers``: those whose length header is hit) cannot be
    counted: each damaged header starts a gap running over the damaged records right after it (the reader finds
    the next record whose header and data both pass); a gap longer than one record hides how many records it
    holds, which a shard with several gaps cannot tell from the manifest's count."""
    gaps = []
    for record in sorted(headers):
        end = record
        while end + 1 in damaged:
            end += 1
        if not gaps or record > gaps[-1][1]:
            gaps.append((record, end))
    return len(gaps) > 1 and any(end > start for start, end in gaps)


FLIPS = dict(sizes=st.lists(st.integers(3, 12), min_size=1, max_size=3),
             flips=st.lists(st.tuples(st.integers(0, 2), st.floats(0, 0.999)), min_size=1, max_size=3),
             pipelines=st.integers(1, 2), cache=st.booleans())


# Default: 3 examples (about 1.5 s each, loaded); test_..._many_flips below draws 30 (-m slow).
@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(**FLIPS)
def test_every_readable_record_is_trained_exactly_once_per_epoch(tmp_path_factory, sizes, flips, pipelines, cache):
    """A flipped byte anywhere in a record (length header, data or checksum) costs that record only: the others
    are read once per epoch (but fewer than ``pipelines`` left out as the remainder), and the audit agrees; or,
    where damaged length headers leave the records between them uncountable, the run is refused naming them.
    This used to end the shard at the first bad record and refill the epoch with repeats."""
    tmp = tmp_path_factory.mktemp("flips")
    directory, paths = write_dataset(tmp / "d", ids(sizes), sum(sizes))  # foreign: no sha256
    starts = np.cumsum((0,) + tuple(sizes))
    record_bytes = [os.path.getsize(p) // n for p, n in zip(paths, sizes)]  # records of one length here
    flipped = {(shard % len(sizes), int(where * os.path.getsize(paths[shard % len(sizes)]))) for shard, where in flips}
    damaged, headers = collections.defaultdict(set), collections.defaultdict(set)
    for shard, offset in flipped:
        flip(paths[shard], offset)
        damaged[shard].add(offset // record_bytes[shard])
        if offset % record_bytes[shard] < shards.HEADER_BYTES:
            headers[shard].add(offset // record_bytes[shard])
    cfg = config(directory, tmp / "cache", skip_corrupt_records=True, cache=cache, global_batch_size=pipelines)
    if any(refused_for_uncountable_gaps(damaged[s], headers[s]) for s in damaged):
        with pytest.raises(ConfigError, match="are damaged, so the records between them cannot be counted"):
            catalog.prepare(cfg)
        return
    info = catalog.prepare(cfg)
    lost = {int(starts[s]) + r for s in damaged for r in damaged[s]}
    assert records.skipped_records(info) == {"train": len(lost)}
    readable = set(range(sum(sizes))) - lost
    if len(readable) < 2 * pipelines:
        return
    for seen in epochs_seen(cfg, info, pipelines, 2):
        assert set(seen) <= readable and max(seen.values()) == 1
        assert len(readable) - len(seen) == len(readable) % pipelines  # the remainder, fewer than pipelines

    from tfgpu import audit_input

    for epoch in audit_input.audit(cfg, pipelines, epochs=2)["epochs"]:
        assert (epoch["missing"], epoch["duplicated"]) == (0, 0), epoch


@pytest.mark.slow
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(**FLIPS)
def test_every_readable_record_is_trained_exactly_once_per_epoch_many_flips(tmp_path_factory, sizes, flips,
                                                                           pipelines, cache):
    test_every_readable_record_is_trained_exactly_once_per_epoch.hypothesis.inner_test(
        tmp_path_factory, sizes, flips, pipelines, cache)


def test_each_skipped_record_is_logged_once_with_its_shard_and_index(tmp_path, caplog):
    directory, paths = write_dataset(tmp_path / "d", ids([8]), 8)
    record_bytes = os.path.getsize(paths[0]) // 8
    flip(paths[0], 2 * record_bytes + 3)  # record 2's length header
    flip(paths[0], 6 * record_bytes + 30)  # record 6's data
    with caplog.at_level("WARNING", logger="tfgpu"):
        catalog.prepare(config(directory, tmp_path / "cache", skip_corrupt_records=True))
    lines = [r.getMessage() for r in caplog.records if "unreadable" in r.getMessage()]
    assert lines == [f"--skip_corrupt_records: skipping 2 unreadable record(s) of {paths[0]}, every epoch: "
                     "record(s) 2, 6"]


def test_every_record_is_addressable_by_its_offset_from_the_cached_index(tmp_path, monkeypatch):
    """The index the pipelines read by: record k of a shard starts at tables[shard][k] (TensorFlow's reader finds
    that record there), kept in the shard cache compactly and read back unchanged without walking the shard."""
    from tensorflow.python.lib.io import _pywrap_record_io

    directory, paths = write_dataset(tmp_path / "d", [[example(i % 3) for i in range(n)] for n in (5, 9)], 3)
    info = catalog.prepare(config(directory, tmp_path / "cache"))
    for path, n in zip(paths, (5, 9)):
        table = info.tables[path]
        assert len(table) == n + 1 and table[-1] == os.path.getsize(path)
        reader = _pywrap_record_io.RandomRecordReader(path)
        for k in range(n):
            assert reader.read(int(table[k]))[0] == example(k % 3)
    monkeypatch.setattr(shards, "_headers", lambda *a: pytest.fail("walked a cached shard"))
    again = catalog.prepare(config(directory, tmp_path / "cache"))
    assert {p: t.tolist() for p, t in again.tables.items()} == {p: t.tolist() for p, t in info.tables.items()}
    cached = json.loads(open(shards.Cache(str(tmp_path / "cache"), directory).path).read())
    assert all(isinstance(entry["offsets"], str) for entry in cached["shards"].values())  # packed, not a list
