"""examples/fit_dataset.py: a user's model on a tf.data pipeline through tfgpu.fit, as its docstring runs it.

Default suite: the script's main() in this process on 320 of the digits for 2 steps (its data, its model, its
tfgpu.fit call and the line it prints), and the launcher's command for ``-- python script.py``. Marked slow: the
full default run (300 steps, val_accuracy >= 0.95; 50 s on 2 cores), two workers through tfgpu.launch, and a
SIGTERM to the script (exit 143 after the checkpoint; 11 s). The
equality of tfgpu.fit with python -m tfgpu.train, and its errors and resume, are tests/training/test_fit.py's.
"""
import importlib.util
import json
import logging
import os
import subprocess
import sys
import types

import pytest

from tests.conftest import REPO, preempted, read_metrics
from tfgpu.training import run_dir

SCRIPT = os.path.join(REPO, "examples", "fit_dataset.py")


@pytest.fixture
def example(monkeypatch):
    """The example as a module, and afterwards the process state a run changes put back (no report.md: its plots
    take seconds and have tests of their own)."""
    import keras

    from tfgpu.training import experiment

    monkeypatch.setattr(experiment, "_write_report", lambda model_dir: None)
    spec = importlib.util.spec_from_file_location("fit_dataset_example", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    logger = logging.getLogger("tfgpu")
    saved = logger.handlers[:], logger.level, logger.propagate
    yield module
    logger.handlers[:], logger.level, logger.propagate = saved
    keras.mixed_precision.set_global_policy("float32")
    keras.backend.clear_session(free_memory=False)


def test_the_script_trains_its_model_on_its_datasets(example, tmp_path, capsys):
    train, val = example.digits()
    assert train.element_spec[0].shape == (8, 8, 1) and train.element_spec[0].dtype.name == "uint8"
    assert int(train.cardinality()) + int(val.cardinality()) == 1797
    example.digits = lambda: (train.take(256), val.take(64))
    metrics = example.main([f"--model_dir={tmp_path}", "--train_steps=2"])
    assert metrics == read_metrics(tmp_path) and metrics["step"] == 2 and metrics["val_examples"] == 64
    assert metrics["model"] == "fit:fit_dataset_example.build_model"
    assert f"val_accuracy={metrics['val_accuracy']:.4f} after 2 steps" in capsys.readouterr().out
    assert (tmp_path / "export" / "model.keras").exists() and (tmp_path / "data" / "dataset.json").exists()


def test_launch_runs_a_script_given_after_the_separator():
    from tfgpu.runtime import launcher

    args = types.SimpleNamespace(python="/usr/bin/python3", module=None)  # no --module given
    assert launcher.worker_command(args, ["python", "examples/fit_dataset.py", "--train_steps=5"]) == \
        ["python", "examples/fit_dataset.py", "--train_steps=5"]
    assert launcher.worker_command(args, ["--flagfile=f"]) == ["/usr/bin/python3", "-m", "tfgpu.train", "--flagfile=f"]
    assert launcher.worker_command(args, []) == ["/usr/bin/python3", "-m", "tfgpu.train"]
    # An explicit --module takes every worker arg, positional ones too (a worker module given a directory).
    args.module = "fit_worker"
    assert launcher.worker_command(args, ["/tmp/run", "1"]) == ["/usr/bin/python3", "-m", "fit_worker", "/tmp/run", "1"]


def _run(args, timeout):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("TF_CONFIG", None)
    return subprocess.run(args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)


@pytest.mark.slow
def test_the_default_run_reaches_095(tmp_path):
    proc = _run([sys.executable, SCRIPT, f"--model_dir={tmp_path}"], timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert read_metrics(tmp_path)["val_accuracy"] >= 0.95


@pytest.mark.slow
def test_two_workers_through_launch_train_one_model_on_the_chiefs_records(tmp_path):
    """Both workers run the script; the chief alone writes the data, the other checks its own Dataset against it;
    one multi-worker run of 2 replicas whose evaluation every worker reports alike."""
    proc = _run([sys.executable, "-m", "tfgpu.launch", "--num_workers=2", "--worker_timeout_s=500", "--",
                 "python", "examples/fit_dataset.py", f"--model_dir={tmp_path}", "--train_steps=10"], timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:]
    out = proc.stdout
    assert out.count("tfgpu.fit: writing 1797 examples") == 1 and "[worker 0] tfgpu.fit: writing" in out
    assert any(line.startswith("[worker 1]") and "reusing" in line for line in out.splitlines())
    metrics = read_metrics(tmp_path)
    assert metrics["num_workers"] == 2 and metrics["strategy"] == "multi_worker_mirrored" and metrics["step"] == 10
    line = f"val_accuracy={metrics['val_accuracy']:.4f} after 10 steps"
    assert f"[worker 0] {line}" in out and f"[worker 1] {line}" in out
    manifest = json.loads((tmp_path / "data" / "dataset.json").read_text())
    assert manifest["splits"]["train"]["num_examples"] == 1438


@pytest.mark.slow
def test_a_sigterm_to_the_script_saves_a_checkpoint_and_exits_143(tmp_path):
    """tfgpu.fit raises tfgpu.Preempted after the SIGTERM's checkpoint; the script ends with the table's 143, which
    tfgpu.launch and clusters retry (before the script caught it: exit 1 and a traceback)."""
    proc = preempted([sys.executable, SCRIPT, f"--model_dir={tmp_path}"], tmp_path)
    assert proc.returncode == 143, proc.stdout[-3000:]
    assert "stopped: preempted by SIGTERM: checkpoint saved at step" in proc.stdout and "Traceback" not in proc.stdout
    assert any(name.endswith(".index") for name in os.listdir(tmp_path / run_dir.CHECKPOINTS_DIR))
