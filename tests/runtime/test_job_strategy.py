"""runtime/job_strategy: ``import tfgpu`` makes the job's strategy in a script that is one of several workers (tested
across processes in tests/training/fit/test_run.py), and nothing in tfgpu's own commands or on one device."""
import json
import os
import subprocess
import sys

from tests.conftest import REPO
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
