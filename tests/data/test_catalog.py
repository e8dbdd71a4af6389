"""tfgpu.data.catalog: built-in datasets are converted once into the data cache by tfgpu's converter, also when processes race."""
import json
import threading

from tfgpu.config import Config
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
