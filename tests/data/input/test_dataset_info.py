"""tfgpu.data.input.dataset_info: a converted directory described from its dataset.json alone, as the read half
sees it."""
import numpy as np
import pytest

from tfgpu.config import Config, ConfigError, DatasetConfig
from tfgpu.data.input import dataset_info
from tfgpu.data.schema import tfrecord


def _converted(directory, sizes=(3, 5)) -> str:
    """A train split of one shard per entry of ``sizes`` and a val split, written by tfgpu's own writer."""
    shards = []
    for i, n in enumerate(sizes):
        shards += tfrecord.write_arrays(str(directory), f"train{i}", np.zeros((n, 4, 4, 1), np.uint8),
                                        np.arange(n) % 2, num_shards=1)["shards"]
    val = tfrecord.write_arrays(str(directory), "val", np.zeros((2, 4, 4, 1), np.uint8), np.arange(2), num_shards=1)
    tfrecord.write_manifest(str(directory), {
        "name": "tiny", "classes": ["a", "b"], "compression": "none",
        "image_shape": {"height": 4, "width": 4, "channels": 1},
        "splits": {"train": {"num_examples": sum(sizes), "shards": shards}, "val": val}})
    return str(directory)


def _config(**flags) -> DatasetConfig:
    return DatasetConfig.of(Config(model_dir="unused", **flags))


def test_a_converted_directory_is_described_by_its_manifest(tmp_path):
    directory = _converted(tmp_path)
    info = dataset_info.describe(_config(data_dir=directory, data_cache_dir=str(tmp_path / "cache")), directory,
                                 "data_dir")
    assert (info.name, info.classes, info.image_shape) == ("tiny", ("a", "b"), (4, 4, 1))
    assert (info.train_split, info.eval_split, info.split_sizes) == ("train", "val", {"train": 8, "val": 2})
    assert [n for _, n in info.split_files["train"]] == [3, 5]


def test_a_glob_keeps_only_the_train_shards_it_matches(tmp_path):
    directory = _converted(tmp_path)
    pattern = f"{directory}/train1*"
    info = dataset_info.describe(_config(data_dir=pattern, data_cache_dir=str(tmp_path / "cache")), directory,
                                 "data_dir", pattern)
    assert info.split_sizes["train"] == 5 and [n for _, n in info.split_files["train"]] == [5]


def test_a_split_the_manifest_lacks_is_one_error_naming_the_flag(tmp_path):
    directory = _converted(tmp_path)
    with pytest.raises(ConfigError) as e:
        dataset_info.describe(_config(data_dir=directory, train_split="extra"), directory, "data_dir")
    assert str(e.value).startswith("--train_split: split 'extra' not in") and "train, val" in str(e.value)
