"""tfgpu.data.catalog: built-in datasets are converted once into the data cache by tfgpu's converter, also when processes race."""
import json
import threading

import pytest

from tfgpu.config import Config, ConfigError
from tfgpu.data import catalog, tfrecord


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
    with open(tmp_path / "cache" / f"digits-v{tfrecord.FORMAT_VERSION}" / tfrecord.MANIFEST) as f:
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
    assert str(error.value).startswith(f"--data_cache_dir: {cache}/digits-v{tfrecord.FORMAT_VERSION} has ")
    assert "MiB free but this conversion needs about" in str(error.value)
