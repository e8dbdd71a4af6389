"""Another tool's TFRecords in (``--source=tfrecord:GLOB``): every record checked, then read in place when every
one is usable as stored, else written anew with the reason said (issue 30 item 3).

The records are built here as Model Garden writes ImageNet (``image/encoded``, ``image/class/label`` 1-based,
``image/format``, ``image/height``...), from scikit-learn's real handwritten digits."""
import collections
import glob
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tests.data.conversion.test_convert import REPO, convert, manifest, read_back
from tfgpu.config import Config, ConfigError
from tfgpu.data import catalog
from tfgpu.data.schema import tfrecord
from tfgpu.data.sources import builtin


def _bytes(v):
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[v]))


def _int(v):
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(v)]))


def model_garden_record(image, label, drop=(), **keys):
    """One record as tensorflow/models' ImageNet converter writes it (PNG here; its label as given)."""
    features = {keys.get("image_key", "image/encoded"): _bytes(tf.io.encode_png(image).numpy()),
                "image/format": _bytes(b"PNG"), keys.get("label_key", "image/class/label"): _int(label),
                "image/height": _int(image.shape[0]), "image/width": _int(image.shape[1]),
                "image/filename": _bytes(b"n0144_1.JPEG")}
    for key in drop:
        del features[key]
    return tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()


def write_model_garden(directory, n_train=40, n_val=20, shards=2, offset=1, drop=None, **keys):
    """train-0000i-of-0000N and validation-00000-of-00001 with the first digits of the built-in train and val
    splits, labels ``+ offset``; ``drop``:
    ((split, shard), record, keys) whose record leaves those keys out. Returns {split: [(image, 0-based label)]}."""
    os.makedirs(directory, exist_ok=True)
    splits = builtin.load_builtin("digits")["splits"]
    data = {name: list(zip(splits[split][0][:n], splits[split][1][:n]))
            for name, split, n in (("train", "train", n_train), ("validation", "val", n_val))}
    for split, examples in data.items():
        count = shards if split == "train" else 1
        bounds = np.linspace(0, len(examples), count + 1).astype(int)
        for s in range(count):
            with tf.io.TFRecordWriter(os.path.join(directory, f"{split}-{s:05d}-of-{count:05d}")) as writer:
                for i, (image, label) in enumerate(examples[bounds[s]:bounds[s + 1]]):
                    gone = drop[2] if drop and drop[0] == (split, s) and drop[1] == i else ()
                    writer.write(model_garden_record(image, label + offset, gone, **keys))
    return data


def snapshot(directory):
    """Every file under ``directory`` with its bytes' hash and modification time: what must not change."""
    return {path: (os.stat(path).st_mtime_ns, hash(open(path, "rb").read()))
            for path in glob.glob(os.path.join(directory, "**"), recursive=True) if os.path.isfile(path)}


def pipeline_examples(info, split):
    """(label, image bytes) of every record of ``split`` as the training input parses it (the manifest's keys)."""
    files = [f for f, _ in info.split_files[split]]

    def parse(serialized):
        features = tfrecord.parse_example(serialized, labelled=True, keys=info.record_keys)
        return features[tfrecord.LABEL], tfrecord.decode_image(features, info.image_shape[2])

    return collections.Counter((int(label), image.tobytes())
                               for label, image in tf.data.TFRecordDataset(files).map(parse).as_numpy_iterator())


def expected(examples):
    return collections.Counter((int(label), image.tobytes()) for image, label in examples)


def test_model_garden_records_with_1_based_labels_are_read_in_place(tmp_path, capsys):
    """dataset.json names the source shards where they are (no shard written, the source untouched) with the keys
    and offset; the training input reads every record with its 0-based label."""
    source = tmp_path / "imagenet-style"
    data = write_model_garden(str(source))
    before = snapshot(str(source))
    out = tmp_path / "out"
    code, printed, _ = convert(f"--source=tfrecord:{source}/*", "--label_offset=-1", f"--output_dir={out}",
                               capsys=capsys)
    assert code == 0 and "read in place" in printed
    m = manifest(out)
    assert m["format_version"] == tfrecord.FORMAT_VERSION and m["in_place"] is True
    assert m["record_keys"] == {"image": "image/encoded", "label": "image/class/label", "label_offset": -1}
    assert [s["file"] for s in m["splits"]["train"]["shards"]] == sorted(glob.glob(f"{source}/train-*"))
    assert not glob.glob(f"{out}/*.tfrecord") and snapshot(str(source)) == before
    info = catalog.prepare(Config(model_dir="unused", data_dir=str(out), data_cache_dir=str(tmp_path / "cache")))
    assert info.eval_split == "validation" and info.num_classes == 10 and info.image_shape == (8, 8, 1)
    for split in ("train", "validation"):
        assert pipeline_examples(info, split) == expected(data[split])
    assert snapshot(str(source)) == before


def test_1_based_labels_without_the_offset_are_named_in_a_notice(tmp_path, capsys):
    source = tmp_path / "src"
    write_model_garden(str(source))
    code, _, err = convert(f"--source=tfrecord:{source}/*", f"--output_dir={tmp_path / 'out'}", capsys=capsys)
    assert code == 0
    assert "labels run 0..10 but 1 class(es) have no record (first: 0) (1-based labels? pass --label_offset=-1)" \
        in err


def test_a_record_without_its_label_stops_the_conversion_naming_it(tmp_path, capsys):
    source = tmp_path / "src"
    write_model_garden(str(source), drop=(("train", 1), 3, ("image/class/label",)))
    out = tmp_path / "out"
    code, _, err = convert(f"--source=tfrecord:{source}/*", "--label_offset=-1", f"--output_dir={out}",
                           capsys=capsys)
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert f"error: {source}/train-00001-of-00002: record 3: has no 'image/class/label' (its keys: " in err
    assert not os.path.exists(out / tfrecord.MANIFEST)


def test_skipping_bad_records_writes_new_shards_and_says_why(tmp_path, capsys):
    """--skip_bad: the source shards hold a record the reader cannot use, so new shards are written without it,
    and one line says which record made it."""
    source = tmp_path / "src"
    data = write_model_garden(str(source), drop=(("train", 0), 5, ("image/encoded",)))
    before = snapshot(str(source))
    out = tmp_path / "out"
    code, _, err = convert(f"--source=tfrecord:{source}/*", "--label_offset=-1", f"--output_dir={out}",
                           "--skip_bad", capsys=capsys)
    assert code == 0
    assert (f"writing new shards (the source's cannot be read in place): record 5 of {source}/train-00000-of-00002 "
            "has no 'image/encoded'") in err
    m = manifest(out)
    assert "record_keys" not in m and m["num_skipped"] == 1 and len(glob.glob(f"{out}/*.tfrecord")) == 2
    got = collections.Counter((label, image.tobytes()) for _, label, image, _ in read_back(str(out), "train"))
    assert got == expected(data["train"][:5] + data["train"][6:])
    assert snapshot(str(source)) == before


def test_split_cuts_records_into_new_shards_saying_why(tmp_path, capsys):
    source = tmp_path / "src"
    data = write_model_garden(str(source), n_val=0, shards=3)
    for path in glob.glob(f"{source}/validation-*"):
        os.remove(path)
    out = tmp_path / "out"
    code, _, err = convert(f"--source=tfrecord:{source}/train-*", "--label_offset=-1", "--split=train:0.75,val:0.25",
                           f"--output_dir={out}", capsys=capsys)
    assert code == 0 and "--split=train:0.75,val:0.25 cuts records out of the source's shards" in err
    m = manifest(out)
    assert set(m["splits"]) == {"train", "val"} and m["splits"]["val"]["num_examples"] >= 8
    both = sum((collections.Counter((label, image.tobytes()) for _, label, image, _ in read_back(str(out), s))
                for s in ("train", "val")), collections.Counter())
    assert both == expected(data["train"])


def test_other_keys_and_a_glob_matching_nothing(tmp_path, capsys):
    source = tmp_path / "src"
    data = write_model_garden(str(source), n_train=12, n_val=6, offset=0, image_key="jpg", label_key="cls")
    out = tmp_path / "out"
    assert convert(f"--source=tfrecord:{source}/*", "--image_key=jpg", "--label_key=cls", f"--output_dir={out}",
                   capsys=capsys)[0] == 0
    info = catalog.prepare(Config(model_dir="unused", data_dir=str(out), data_cache_dir=str(tmp_path / "cache")))
    assert pipeline_examples(info, "train") == expected(data["train"])
    code, _, err = convert(f"--source=tfrecord:{source}/*", "--image_key=jpg", "--label_key=cls", "--num_shards=1",
                           f"--output_dir={tmp_path / 'one'}", capsys=capsys)
    assert code == 0 and "--num_shards/--shard_size_mb re-shard them" in err
    assert len(manifest(tmp_path / "one")["splits"]["train"]["shards"]) == 1
    code, _, err = convert(f"--source=tfrecord:{tmp_path}/nothing-*", f"--output_dir={tmp_path / 'o2'}",
                           capsys=capsys)
    assert code == 1 and err.strip() == f"error: --source: tfrecord:{tmp_path}/nothing-* matches no file"
    code, _, err = convert(f"--source={source}", "--label_offset=-1", f"--output_dir={tmp_path / 'o3'}", capsys=capsys)
    assert code == 1 and err.strip() == "error: --label_offset: applies to --source=tfrecord:GLOB only"


def test_a_moved_source_shard_is_named_when_training(tmp_path):
    source = tmp_path / "src"
    write_model_garden(str(source), n_train=10, n_val=4, shards=1)
    out = tmp_path / "out"
    assert convert(f"--source=tfrecord:{source}/*", "--label_offset=-1", f"--output_dir={out}")[0] == 0
    os.rename(source / "train-00000-of-00001", tmp_path / "elsewhere")
    with pytest.raises(ConfigError) as error:
        catalog.prepare(Config(model_dir="unused", data_dir=str(out), data_cache_dir=str(tmp_path / "cache")))
    assert str(error.value) == (f"--data_dir: {out} is incomplete: {source}/train-00000-of-00001 is missing (a shard "
                                "dataset.json reads where another tool wrote it: it was moved or deleted; convert the "
                                "source again)")


def test_source_shards_of_one_name_in_two_folders_are_checked_apart(tmp_path):
    """Shard checks are cached per shard path, not name: two source shards called train-00000-of-00001 in two
    folders, of equal size and time but other records, each pass their own sha256 check."""
    for folder, offset in (("a", 1), ("b", 2)):
        write_model_garden(str(tmp_path / folder), n_train=6, n_val=0, shards=1, offset=offset)
        os.remove(tmp_path / folder / "validation-00000-of-00001")
        os.utime(tmp_path / folder / "train-00000-of-00001", ns=(10 ** 18, 10 ** 18))
    out = tmp_path / "out"
    assert convert(f"--source=tfrecord:{tmp_path}/?/train-*", "--label_offset=-1", f"--output_dir={out}")[0] == 0
    info = catalog.prepare(Config(model_dir="unused", data_dir=str(out), data_cache_dir=str(tmp_path / "cache")))
    assert info.split_sizes == {"train": 12}


@pytest.mark.slow
def test_training_on_model_garden_records_reaches_the_accuracy_of_the_same_images_from_folders(tmp_path):
    """The digits as Model Garden-style records with 1-based labels, read in place with --label_offset=-1, train
    configs/quickstart.flags to the val_accuracy the same PNG images reach converted from class folders."""
    data = write_model_garden(str(tmp_path / "src"), n_train=1438, n_val=359)
    assert len(data["train"]) + len(data["validation"]) == 1797  # every digit
    for split, examples in (("train", data["train"]), ("val", data["validation"])):
        for i, (image, label) in enumerate(examples):
            path = tmp_path / "folders" / split / str(label) / f"{i}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(tf.io.encode_png(image).numpy())
    assert convert(f"--source=tfrecord:{tmp_path}/src/*", "--label_offset=-1",
                   f"--output_dir={tmp_path / 'mg'}")[0] == 0
    assert convert(f"--source={tmp_path}/folders", f"--output_dir={tmp_path / 'fo'}")[0] == 0
    accuracy = {}
    for name in ("mg", "fo"):
        subprocess.run([sys.executable, "-m", "tfgpu.train", f"--flagfile={REPO}/configs/quickstart.flags",
                        f"--data_dir={tmp_path / name}", f"--model_dir={tmp_path / ('run-' + name)}",
                        "--precision=float32"], check=True, cwd=REPO, capture_output=True)
        accuracy[name] = json.loads((tmp_path / f"run-{name}" / "metrics.json").read_text())["val_accuracy"]
    assert accuracy["mg"] >= 0.97 and abs(accuracy["mg"] - accuracy["fo"]) <= 0.02, accuracy


def test_training_on_foreign_shards_without_a_manifest_names_the_converter_route(tmp_path):
    """--data_dir at another tool's shards: the one line says how to read them in place."""
    write_model_garden(str(tmp_path / "src"), n_train=4, n_val=2, shards=1)
    with pytest.raises(ConfigError) as error:
        catalog.prepare(Config(model_dir="unused", data_dir=str(tmp_path / "src")))
    assert str(error.value) == (
        f"--data_dir: {tmp_path}/src/dataset.json not found: '{tmp_path}/src' is not a converted tfgpu dataset (or "
        "its conversion did not finish); its files look like TFRecords another tool wrote: `python -m tfgpu.convert "
        f"--source='tfrecord:{tmp_path}/src/*' --output_dir=DIR` reads them in place (with --label_offset=-1 for "
        "1-based labels)")
