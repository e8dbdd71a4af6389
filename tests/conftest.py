"""Shared fixtures: a private data cache, a runner for ``python -m tfgpu.train`` subprocesses, and one that runs
``tfgpu.train.main`` in this process.

Runs that need device settings (logical CPU devices for MirroredStrategy, XLA_FLAGS), a cluster or signals happen
in subprocesses, since those must be made before TensorFlow initialises; single-device runs use ``train_here``,
which saves a TensorFlow start-up (seconds on 2 cores) per run.
"""
import contextlib
import json
import logging
import os
import subprocess
import sys
import types

import pytest

from tfgpu.runtime import run_dir

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("data-cache"))


@pytest.fixture
def run_train(data_cache):
    """Runs tfgpu.train with ``args``; returns the CompletedProcess (stdout+stderr in .output)."""

    def run(*args, timeout=300, env=None, check=True):
        full_env = {**os.environ, "TFGPU_DATA_CACHE": data_cache, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
        full_env = {k: v for k, v in full_env.items() if v is not None}  # None: the variable unset
        proc = subprocess.run([sys.executable, "-m", "tfgpu.train", *args], cwd=REPO, env=full_env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
        proc.output = proc.stdout
        if check and proc.returncode != 0:
            raise AssertionError(f"tfgpu.train exited {proc.returncode}:\n{proc.output[-4000:]}")
        return proc

    return run


@pytest.fixture(autouse=True)
def _no_report_plots(monkeypatch):
    """Runs write their report without its PNG plots (TFGPU_REPORT_PLOTS=0, inherited by subprocesses): drawing
    them costs a second of CPU a run; tests of the plots ask for ``report_plots``."""
    monkeypatch.setenv("TFGPU_REPORT_PLOTS", "0")


@pytest.fixture
def report_plots(monkeypatch):
    """The run report with its PNG plots, as a user gets it."""
    monkeypatch.delenv("TFGPU_REPORT_PLOTS")


@pytest.fixture(autouse=True)
def _tfgpu_logger_as_python_leaves_it():
    """Every test starts with tfgpu's logger as Python leaves it (no handler, propagating to the root, where
    caplog listens) and leaves it so: a test that ran a command's main() (logs.setup) must not mute the next
    test's caplog."""
    logger = logging.getLogger("tfgpu")

    def reset():
        logger.handlers[:], logger.propagate = [], True
        logger.setLevel(logging.NOTSET)

    reset()
    yield
    reset()


@contextlib.contextmanager
def process_state_restored():
    """Puts back what a ``tfgpu.train.main`` run in this process changes for the whole process: tfgpu's logger,
    the Keras dtype policy and session, and op determinism (``--deterministic`` turns it on)."""
    import keras
    from tensorflow.python.framework import config as tf_config  # TF has no public switch to turn it off

    logger = logging.getLogger("tfgpu")
    saved = logger.handlers[:], logger.level, logger.propagate
    determinism = tf_config.is_op_determinism_enabled()
    try:
        yield
    finally:
        if not determinism:
            tf_config.disable_op_determinism()
        logger.handlers[:], logger.level, logger.propagate = saved
        keras.mixed_precision.set_global_policy("float32")
        keras.backend.clear_session(free_memory=False)  # a forced garbage collection: 0.3-0.5 s per run


def train_in_process(args, data_cache) -> int:
    """``tfgpu.train.main(args)`` in this process on one device, reading built-in datasets from ``data_cache``;
    the process's state is put back afterwards. Returns the exit code."""
    from tfgpu import train

    assert not any(a.startswith("--cpu_logical_devices") for a in args), \
        "a process-wide setting made before TensorFlow initialises: use run_train"
    with pytest.MonkeyPatch.context() as env, process_state_restored():
        env.setenv("TFGPU_DATA_CACHE", data_cache)
        env.delenv("TF_CONFIG", raising=False)
        return train.main(list(args))


@pytest.fixture
def train_here(data_cache, capsys):
    """Runs ``tfgpu.train.main(args)`` in this process on one device (``train_in_process``); returns an object
    with .returncode and .output (stdout then stderr), like ``run_train``."""

    def run(*args, check=True):
        capsys.readouterr()
        code = train_in_process(args, data_cache)
        out, err = capsys.readouterr()
        result = types.SimpleNamespace(returncode=code, output=out + err)
        if check and code != 0:
            raise AssertionError(f"tfgpu.train exited {code}:\n{result.output[-4000:]}")
        return result

    return run


def read_history(model_dir, kind="train"):
    """The ``kind`` records of the run's history.jsonl, in the order written (through tfgpu's one reader)."""
    from tfgpu.metrics import history

    return [r for r in history.read(str(model_dir)) if r["kind"] == kind]


def read_metrics(model_dir):
    with open(os.path.join(model_dir, "metrics.json")) as f:
        return json.load(f)


def checkpoint_weights(model_dir):
    """name -> array of every variable in the latest checkpoint: weights, BN statistics, optimizer slots, step.

    A checkpoint stores each variable once, under the first path that reaches it (often the optimizer's), so
    compare all of them rather than filtering by a "model/" prefix. The data position (JSON naming the topology,
    not a variable) is left out: runs on different topologies train the same weights."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(run_dir.checkpoints(model_dir)))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
            if not name.startswith(("_CHECKPOINTABLE_OBJECT_GRAPH", "save_counter", "data_position/",
                                             "model_fingerprint/"))}


def preempted(args, model_dir, train_lines: int = 1, env=None, timeout: float = 300,
              sig=None) -> subprocess.CompletedProcess:
    """Runs ``args`` (a training command) from the repository, sends it a real SIGTERM (or ``sig``) once
    ``model_dir``'s history.jsonl holds ``train_lines`` lines, and returns the CompletedProcess (stdout+stderr in
    .output)."""
    import signal
    import time

    full_env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
    full_env.pop("TF_CONFIG", None)
    proc = subprocess.Popen(args, cwd=REPO, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        deadline = time.time() + timeout
        history = os.path.join(model_dir, "history.jsonl")
        while not (os.path.exists(history) and open(history).read().count("\n") >= train_lines):
            assert proc.poll() is None and time.time() < deadline, "the run ended before it could be preempted"
            time.sleep(0.05)
        proc.send_signal(sig or signal.SIGTERM)
        output, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    return subprocess.CompletedProcess(args, proc.returncode, output)


def results_of_script(directory, source: str, name: str, timeout: float = 300) -> dict:
    """The dict a script prints last as ``RESULTS <json>``: ``source`` written to ``directory/name`` and run in a
    fresh Python (its own TensorFlow: logical devices can only be set up in a new process), alone (no TF_CONFIG,
    no job strategy), with ``directory/runs`` as its argument. A failed run fails the test with its output."""
    script = directory / name
    script.write_text(source)
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "TF_CPP_MIN_LOG_LEVEL": "2", "TFGPU_NO_JOB_STRATEGY": "1"}
    env.pop("TF_CONFIG", None)
    proc = subprocess.run([sys.executable, str(script), str(directory / "runs")], cwd=directory, env=env,
                          capture_output=True, text=True, timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULTS ")]
    assert proc.returncode == 0 and lines, f"exit {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return json.loads(lines[-1][len("RESULTS "):])

