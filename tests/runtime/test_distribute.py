"""tfgpu.runtime.distribute: which strategy a run gets, and that a single-worker strategy never trains inside a cluster."""
import json

import pytest

from tfgpu.runtime import distribute
from tfgpu.config import Config, ConfigError


@pytest.mark.parametrize("strategy, gpus, workers, cpus, expected", [
    ("auto", 0, 1, 0, "one_device"),
    ("auto", 1, 1, 0, "one_device"),
    ("auto", 4, 1, 0, "mirrored"),
    ("auto", 0, 1, 2, "mirrored"),
    ("auto", 8, 2, 0, "multi_worker_mirrored"),
    ("multi_worker_mirrored", 0, 1, 0, "multi_worker_mirrored"),
])
def test_auto_picks_the_strategy_from_gpus_and_workers(strategy, gpus, workers, cpus, expected):
    config = Config(model_dir="/unused", distribution_strategy=strategy, cpu_logical_devices=cpus)
    assert distribute.choose_kind(config, gpus, workers) == expected


@pytest.mark.parametrize("strategy", ["mirrored", "one_device"])
def test_single_worker_strategy_in_a_cluster_is_refused_before_any_strategy_exists(strategy, monkeypatch):
    """experiment.setup resolves the cluster once, before it touches model_dir or builds a strategy from it."""
    from tfgpu.training import experiment

    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["localhost:1", "localhost:2"]},
                                                "task": {"type": "worker", "index": 1}}))

    def must_not_run(*args, **kwargs):
        raise AssertionError("a strategy was built")

    for name in ("MirroredStrategy", "OneDeviceStrategy", "MultiWorkerMirroredStrategy"):
        monkeypatch.setattr(distribute.tf.distribute, name, must_not_run)
    config = Config(model_dir="/unused", dataset="digits", distribution_strategy=strategy)
    with pytest.raises(ConfigError) as e:
        experiment.setup(config)
    assert e.value.flag == "distribution_strategy"
    assert "TF_CONFIG describes 2 workers (this is worker 1)" in str(e.value)
    assert "--distribution_strategy=multi_worker_mirrored" in str(e.value)
