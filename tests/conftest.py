"""Shared fixtures: a private data cache and a runner for ``python -m tfgpu.train`` subprocesses.

Training runs happen in subprocesses because device settings (logical CPU
devices for MirroredStrategy) must be made before TensorFlow initialises.
"""
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("data-cache"))


@pytest.fixture
def run_train(data_cache):
    """Runs tfgpu.train with ``args``; returns the CompletedProcess (stdout+stderr in .output)."""

    def run(*args, timeout=300, env=None, check=True):
        full_env = {**os.environ, "TFGPU_DATA_CACHE": data_cache, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
        proc = subprocess.run([sys.executable, "-m", "tfgpu.train", *args], cwd=REPO, env=full_env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
        proc.output = proc.stdout
        if check and proc.returncode != 0:
            raise AssertionError(f"tfgpu.train exited {proc.returncode}:\n{proc.output[-4000:]}")
        return proc

    return run


def read_history(model_dir, kind="train"):
    with open(os.path.join(model_dir, "history.jsonl")) as f:
        return [r for r in map(json.loads, f) if r["kind"] == kind]


def read_metrics(model_dir):
    with open(os.path.join(model_dir, "metrics.json")) as f:
        return json.load(f)


def checkpoint_weights(model_dir):
    """name -> array of every variable in the latest checkpoint: weights, BN statistics, optimizer slots, step.

    A checkpoint stores each variable once, under the first path that reaches it (often the optimizer's), so
    compare all of them rather than filtering by a "model/" prefix."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(os.path.join(model_dir, "checkpoints")))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
            if not name.startswith(("_CHECKPOINTABLE_OBJECT_GRAPH", "save_counter"))}
