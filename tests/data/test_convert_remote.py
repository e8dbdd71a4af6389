"""The converter writing to a TensorFlow file system (``ram://``, standing in for ``gs://``): shards and
dataset.json land there, a rerun reuses verified shards, --overwrite swaps a finished dataset for a new one, and
nothing lands on the local disk under a ``ram:`` folder."""
import json
import os
import uuid

import numpy as np
import pytest

from tfgpu.data.conversion import convert
from tfgpu.runtime import fileio


@pytest.fixture
def out_dir():
    root = f"ram://convert-{uuid.uuid4().hex[:8]}"
    yield f"{root}/out"
    fileio.rmtree(root)


def test_a_dataset_is_written_reused_and_replaced_on_ram(tmp_path, out_dir, monkeypatch, capsys):
    import tensorflow as tf

    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    images, labels = rng.integers(0, 256, (12, 6, 6), dtype=np.uint8), np.arange(12) % 3
    np.savez(tmp_path / "tiny.npz", x=images, y=labels)
    options = convert.Options(source=str(tmp_path / "tiny.npz"), output_dir=out_dir, num_shards="2")
    convert.convert(options)
    manifest = json.loads(fileio.read_bytes(f"{out_dir}/dataset.json"))
    files = [f"{out_dir}/{s['file']}" for s in manifest["splits"]["train"]["shards"]]
    records = [tf.train.Example.FromString(r.numpy()) for r in tf.data.TFRecordDataset(files)]
    stored = [r.features.feature["image/class/label"].int64_list.value[0] for r in records]
    assert sorted(stored) == sorted(labels.tolist())

    capsys.readouterr()
    convert.convert(options)
    assert "reusing 2 complete, verified shard(s)" in capsys.readouterr().err

    convert.convert(convert.Options(**{**options.__dict__, "num_shards": "3", "overwrite": True}))
    names = sorted(n for n in fileio.listdir(out_dir) if n != ".tfgpu-convert")
    assert names == ["dataset.json"] + [f"train-0000{i}-of-00003.tfrecord" for i in range(3)]
    assert json.loads(fileio.read_bytes(f"{out_dir}/dataset.json"))["splits"]["train"]["num_examples"] == 12
    assert sorted(os.listdir(tmp_path)) == ["tiny.npz"]


def test_an_output_dir_on_a_file_system_tensorflow_lacks_names_the_flag(tmp_path):
    with pytest.raises(convert.ConfigError, match=r"^--output_dir: 's3://bucket/out'.*tensorflow-io"):
        convert.convert(convert.Options(source="digits", output_dir="s3://bucket/out"))
