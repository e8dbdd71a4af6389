"""tfgpu.data.catalog: built-in datasets are converted once into the data cache by tfgpu's converter, also when processes race."""
import collections
import glob
import json
import os
import shutil
import threading

import pytest
import tensorflow as tf

from tests.data.conftest import _tfds_builder_class, tiny_tfds_examples
from tests.data.conversion.test_convert import read_back
from tfgpu.config import Config, ConfigError
from tfgpu.data import catalog
from tfgpu.data.schema import tfrecord


def test_builtin_digits_is_converted_once_by_the_converter_even_when_two_runs_start_together(tmp_path, caplog):
    """Two runs of one host (the workers of a job) preparing the same built-in dataset at once: both get the
    dataset, it is converted once, and its manifest is the converter's (with its fingerprint and split counts)."""
    config = Config(model_dir=str(tmp_path / "run"), dataset="digits", data_cache_dir=str(tmp_path / "cache"))
    infos, errors = [], []

    def prepare():
        try:
            infos.append(catalog.prepare(config))
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    with caplog.at_level("INFO", logger="tfgpu"):
        threads = [threading.Thread(target=prepare) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    assert not errors
    assert [i.split_sizes for i in infos] == [{"train": 1438, "val": 359}] * 2
    assert sum("converted digits to" in r.getMessage() for r in caplog.records) == 1
    assert infos[0].directory == infos[1].directory
    assert os.path.basename(infos[0].directory).startswith(f"digits-v{tfrecord.FORMAT_VERSION}-")
    with open(os.path.join(infos[0].directory, tfrecord.MANIFEST)) as f:
        manifest = json.load(f)
    assert manifest["name"] == "digits" and manifest["converter"]["fingerprint"]
    assert {s: e["num_examples"] for s, e in manifest["splits"].items()} == {"train": 1438, "val": 359}


def test_a_full_data_cache_is_one_line_naming_the_cache_flag(tmp_path, small_disk):
    """Issue 28 item 7 in the cache path: --dataset=digits converted into a --data_cache_dir without room for it."""
    cache = small_disk(64)
    config = Config(model_dir=str(tmp_path / "run"), dataset="digits", data_cache_dir=str(cache))
    with pytest.raises(ConfigError) as error:
        catalog.prepare(config)
    assert error.value.flag == "data_cache_dir" and "\n" not in str(error.value)
    assert str(error.value).startswith(f"--data_cache_dir: {cache}/digits-v{tfrecord.FORMAT_VERSION}-")
    assert "MiB free but this conversion needs about" in str(error.value)


# -- the TFDS cache is keyed by what the data is (issue 28 item 5) -------------------------------------------------

def prepare_tiny_shapes(data_dir, train_seed, test_seed):
    """Prepares tfgpu_tiny_shapes in ``data_dir`` from other random images than the shared ``tfds_dir`` holds."""
    base = _tfds_builder_class()

    class TfgpuTinyShapes(base, skip_registration=True):
        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples(20, train_seed), "test": self._generate_examples(6, test_seed)}

    TfgpuTinyShapes(data_dir=str(data_dir)).download_and_prepare()
    return str(data_dir)


def train_images(info):
    return collections.Counter((label, image.tobytes()) for _, label, image, _ in read_back(info.directory, "train"))


def expected_images(seed):
    return collections.Counter((label, image.tobytes()) for image, label in tiny_tfds_examples(20, seed))


def test_a_tfds_dataset_of_one_name_in_another_data_dir_or_prepared_again_gets_its_own_cache_entry(tfds_dir, tmp_path):
    """--dataset=tfds:NAME trains on the data --tfds_data_dir holds now: another data dir holding a dataset of the
    same name, or the same data dir prepared again, gets its own cache entry (a dataset.json naming its shards)."""
    def prepare(data_dir):
        return catalog.prepare(Config(model_dir="unused", dataset="tfds:tfgpu_tiny_shapes", tfds_data_dir=data_dir,
                                      data_cache_dir=str(tmp_path / "cache")))

    first = prepare(tfds_dir)
    assert train_images(first) == expected_images(0)
    other_dir = prepare_tiny_shapes(tmp_path / "b", 5, 6)
    other = prepare(other_dir)
    assert other.directory != first.directory and train_images(other) == expected_images(5)
    assert prepare(tfds_dir).directory == first.directory  # converted once: the same data, the same copy

    shutil.rmtree(os.path.join(other_dir, "tfgpu_tiny_shapes"))
    prepare_tiny_shapes(other_dir, 7, 8)
    again = prepare(other_dir)
    assert again.directory not in (first.directory, other.directory) and train_images(again) == expected_images(7)


def test_a_cache_copy_recording_other_data_is_refused_in_one_line(tfds_dir, tmp_path):
    """A cache directory whose dataset.json records another conversion than the flags name (copied in from another
    machine, or written by another converter) is never used."""
    config = Config(model_dir="unused", dataset="tfds:tfgpu_tiny_shapes", tfds_data_dir=tfds_dir,
                    data_cache_dir=str(tmp_path / "cache"))
    directory = catalog.prepare(config).directory
    path = os.path.join(directory, tfrecord.MANIFEST)
    with open(path) as f:
        manifest = json.load(f)
    manifest["converter"]["fingerprint"] = "0" * 64
    with open(path, "w") as f:
        json.dump(manifest, f)
    with pytest.raises(ConfigError) as error:
        catalog.prepare(config)
    assert error.value.flag == "data_cache_dir" and "\n" not in str(error.value)
    assert str(error.value) == (f"--data_cache_dir: {directory} is not the conversion --dataset=tfds:tfgpu_tiny_shapes"
                                " names now: its dataset.json records other data or options (copied there, or made "
                                "by another converter); remove it to convert again")


# -- a prepared TFDS dataset is read in place (issue 30 item 4) -----------------------------------------------------

def _keys_of_pipeline(info, start_step, pipelines, pipeline_id, num_records, batch=2):
    """The record keys (file, index) one training input pipeline yields, in order."""
    from tfgpu.data.input import pipeline
    from tfgpu.tasks.registry import input_config

    config = input_config(Config(model_dir="unused", dataset=info.name, global_batch_size=batch * pipelines, seed=3))
    ctx = tf.distribute.InputContext(pipelines, pipeline_id, pipelines)
    ds = pipeline.train_dataset_fn(config, info, start_step, record_keys=True)(ctx)
    return [int(k) for keys in ds.take(-(-num_records // batch)).as_numpy_iterator() for k in keys][:num_records]


def test_a_prepared_tfds_dataset_is_read_in_place_every_record_once_and_resumed_exactly(tfds_dir, tmp_path):
    """--dataset=tfds:NAME of an image + class label builder: the data cache holds only a dataset.json naming the
    builder's own shards; the training input reads each record once per epoch over two pipelines, its labels and
    pixels those the builder was given, and a run resumed at step 3 reads on exactly as the uninterrupted one."""
    cache = tmp_path / "cache"
    info = catalog.prepare(Config(model_dir="unused", dataset="tfds:tfgpu_tiny_shapes", tfds_data_dir=tfds_dir,
                                  data_cache_dir=str(cache)))
    assert os.listdir(info.directory) == [tfrecord.MANIFEST]
    assert not [f for f in glob.glob(f"{cache}/**", recursive=True) if "tfrecord" in os.path.basename(f)]
    assert all(f.startswith(str(tfds_dir)) for files in info.split_files.values() for f, _ in files)
    assert info.eval_split == "test" and info.classes == ("cat", "dog", "eel") and info.image_shape == (12, 10, 3)
    assert train_images(info) == expected_images(0)
    streams = [_keys_of_pipeline(info, 0, 2, p, 20) for p in range(2)]
    for epoch in range(2):
        seen = collections.Counter(k for s in streams for k in s[epoch * 10:(epoch + 1) * 10])
        assert sorted(seen) == list(range(20)) and max(seen.values()) == 1  # one shard: keys are record indices
    assert _keys_of_pipeline(info, 3, 2, 1, 12) == streams[1][6:18]


def test_a_tfds_dataset_tfgpu_cannot_read_in_place_is_copied_saying_why(tmp_path, caplog):
    """A builder whose records are array_record files is converted into the data cache, and the log says why."""
    class TfgpuTinyShapes(_tfds_builder_class(), skip_registration=True):
        pass

    TfgpuTinyShapes(data_dir=str(tmp_path / "tfds"), file_format="array_record").download_and_prepare()
    with caplog.at_level("INFO", logger="tfgpu"):
        info = catalog.prepare(Config(model_dir="unused", dataset="tfds:tfgpu_tiny_shapes",
                                      tfds_data_dir=str(tmp_path / "tfds"), data_cache_dir=str(tmp_path / "cache")))
    assert ("tfds:tfgpu_tiny_shapes is copied into the data cache, not read in place: its records are stored as "
            "array_record files, not TFRecords") in caplog.messages
    assert info.directory.startswith(str(tmp_path / "cache")) and len(glob.glob(f"{info.directory}/*.tfrecord")) == 2
    assert train_images(info) == expected_images(0)


@pytest.mark.slow
def test_training_on_a_tfds_dataset_read_in_place(tfds_dir, tmp_path):
    """tfgpu.train --dataset=tfds:NAME trains and evaluates on the builder's own shards: no shard in the cache."""
    import subprocess
    import sys

    from tests.data.conversion.test_convert import REPO

    cache, run = tmp_path / "cache", tmp_path / "run"
    subprocess.run([sys.executable, "-m", "tfgpu.train", "--dataset=tfds:tfgpu_tiny_shapes",
                    f"--tfds_data_dir={tfds_dir}", f"--data_cache_dir={cache}", f"--model_dir={run}",
                    "--model=small_cnn", "--global_batch_size=4", "--train_steps=10", "--precision=float32"],
                   check=True, cwd=REPO, capture_output=True)
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["step"] == 10 and metrics["val_examples"] == 6
    assert not [f for f in glob.glob(f"{cache}/**", recursive=True) if "tfrecord" in os.path.basename(f)]
