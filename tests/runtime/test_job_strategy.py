"""runtime/job_strategy: ``import tfgpu`` makes the job's strategy in a script that is one of several workers (tested
across processes in tests/training/fit/test_run.py), and nothing in tfgpu's own commands or on one device."""
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tfgpu.config import ConfigError
from tfgpu.runtime import job_strategy


def test_tfgpu_commands_make_their_own_strategy():
    assert job_strategy.is_command(["-m", "--flag"])
    assert job_strategy.is_command(["/usr/bin/tfgpu-train"])
    assert not job_strategy.is_command(["script.py"]) and not job_strategy.is_command(["-c"])


def test_the_gpu_count_is_read_without_tensorflow(monkeypatch):
    monkeypatch.setattr(job_strategy, "_listdir", lambda path: ["nvidia0", "nvidia1", "nvidiactl", "null"])
    assert job_strategy.visible_gpus_hint({}) == 2
    assert job_strategy.visible_gpus_hint({"CUDA_VISIBLE_DEVICES": "1"}) == 1
    assert job_strategy.visible_gpus_hint({"CUDA_VISIBLE_DEVICES": "-1"}) == 0


def _script(code: str, env: dict) -> subprocess.CompletedProcess:
    full = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": REPO, **env}
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=120)


def test_one_device_makes_nothing_and_a_bad_tf_config_is_one_line():
    alone = _script("import tfgpu\nfrom tfgpu.runtime import job_strategy\nprint(job_strategy.strategy())", {})
    assert alone.returncode == 0 and alone.stdout.strip() == "None", alone.stderr[-2000:]
    bad = _script("import tfgpu", {"TF_CONFIG": json.dumps({"cluster": {"worker": ["a:1", "b:2"]},
                                                            "task": {"type": "worker", "index": 5}})})
    assert bad.returncode == 1
    assert "tfgpu.config.ConfigError" in bad.stderr and "TF_CONFIG" in bad.stderr.splitlines()[-1]


def test_tensorflow_started_before_import_tfgpu_is_told_to_move_the_import_up():
    code = ("import tensorflow as tf\ntf.constant(1.0) + 1\nfrom tfgpu.runtime import job_strategy\n"
            "job_strategy.make({'num_workers': 2, 'cluster_spec': {}, 'worker_index': 0})")
    proc = _script(code, {})
    assert proc.returncode == 1
    assert "put `import tfgpu` first in the script" in proc.stderr.splitlines()[-1]


def test_cpu_replicas_are_read_and_checked_without_tensorflow():
    assert job_strategy.cpu_replicas({}) is None and job_strategy.cpu_replicas({"TFGPU_CPU_REPLICAS": ""}) is None
    assert job_strategy.cpu_replicas({"TFGPU_CPU_REPLICAS": "4"}) == 4
    for bad in ("0", "-2", "two", "2.5", "65"):
        with pytest.raises(ConfigError, match="TFGPU_CPU_REPLICAS.*from 1 to 64") as error:
            job_strategy.cpu_replicas({"TFGPU_CPU_REPLICAS": bad})
        assert error.value.flag == "TFGPU_CPU_REPLICAS"
    with pytest.raises(ConfigError, match="worker 1 of 2.*unset TFGPU_CPU_REPLICAS"):
        job_strategy.cpu_replicas({"TFGPU_CPU_REPLICAS": "2"}, {"num_workers": 2, "worker_index": 1})


DRY_RUN = """
import tfgpu
import keras
import numpy as np
import tensorflow as tf
from tfgpu.runtime import job_strategy
strategy = tf.distribute.get_strategy()
print("STRATEGY", type(strategy).__name__, strategy.num_replicas_in_sync, job_strategy.strategy() is strategy)
x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
y = (x[:, 0] > 0).astype("int32")
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
history = tfgpu.fit(model, x, y, batch_size=16, epochs=1, verbose=0, model_dir={model_dir!r})
print("MODEL", model.distribute_strategy is strategy, len(history.history["loss"]))
"""


def test_cpu_replicas_dry_run_the_gpu_path_on_logical_cpus(tmp_path):
    proc = _script(DRY_RUN.format(model_dir=str(tmp_path / "run")), {"TFGPU_CPU_REPLICAS": "2"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "STRATEGY MirroredStrategy 2 True" in proc.stdout and "MODEL True 1" in proc.stdout, proc.stdout
    first = next(line for line in proc.stderr.splitlines() if "tfgpu" in line)
    assert "replicas=2" in first and "TFGPU_CPU_REPLICAS=2" in first, proc.stderr[-3000:]
    assert "strategy=mirrored replicas=2" in proc.stderr


def test_a_bad_cpu_replicas_value_is_one_line_naming_it():
    proc = _script("import tfgpu", {"TFGPU_CPU_REPLICAS": "many"})
    assert proc.returncode == 1
    assert "TFGPU_CPU_REPLICAS" in proc.stderr.splitlines()[-1] and "'many'" in proc.stderr.splitlines()[-1]
