"""What the tests of ``tfgpu.fit`` share: tiny seeded data and models, and ``both``, which trains the same model
with plain ``model.fit`` and with ``tfgpu.fit`` and checks that the histories and weights agree."""
import os

import numpy as np

TOL = 1e-5


def digits(n=None):
    """sklearn's 8x8 digits as (N, 64) float32 in [0, 1] and int64 labels (1797 of them)."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x, y = (x / 16.0).astype("float32"), y.astype("int64")
    return (x, y) if n is None else (x[:n], y[:n])


def tabular(n=256, features=30, seed=0):
    """Seeded regression data: (N, features) float32 and a noisy linear target of shape (N, 1)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, features)).astype("float32")
    y = (x @ rng.normal(size=(features, 1)) + 0.1 * rng.normal(size=(n, 1))).astype("float32")
    return x, y


def classifier(compile_kwargs=None, inputs=64, hidden=16, seed=0, **kwargs):
    """A seeded two-layer softmax classifier, compiled with SGD unless told otherwise."""
    import keras

    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((inputs,)), keras.layers.Dense(hidden, activation="relu"),
                              keras.layers.Dense(10, activation="softmax")])
    model.compile(**{**dict(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy",
                            metrics=["accuracy"]), **(compile_kwargs or {}), **kwargs})
    return model


class Run:
    """One training: its model, History (``None`` if it raised) and what the test's ``record`` gathered."""

    def __init__(self, model, history, record):
        self.model, self.history, self.record = model, history, record

    @property
    def iterations(self) -> int:
        return int(self.model.optimizer.iterations.numpy())


def keras_run(make_model, make_args, seed=0):
    """``model.fit(*args, **kwargs)`` with ``make_args(record) -> (args, kwargs)``, after seeding every generator."""
    import keras

    model = make_model()
    record = {}
    keras.utils.set_random_seed(seed)
    args, kwargs = make_args(record)
    history = model.fit(*args, **kwargs)
    return Run(model, history, record)


def tfgpu_run(make_model, make_args, model_dir, seed=0, **options):
    """As ``keras_run`` through ``tfgpu.fit`` (its checkpoints in ``model_dir``)."""
    import keras

    import tfgpu

    model = make_model()
    record = {}
    keras.utils.set_random_seed(seed)
    args, kwargs = make_args(record)
    history = tfgpu.fit(model, *args, model_dir=os.fspath(model_dir), **kwargs, **options)
    return Run(model, history, record)


def assert_same_history(expected, got, tol=TOL):
    """Keras' History of one run equals the other's: the same keys, epochs and values within ``tol``."""
    assert got.history.keys() == expected.history.keys()
    assert got.epoch == expected.epoch
    for key, values in expected.history.items():
        assert len(got.history[key]) == len(values), key
        np.testing.assert_allclose(got.history[key], values, rtol=tol, atol=tol, err_msg=key)


def assert_same_weights(expected, got, tol=TOL):
    a, b = expected.get_weights(), got.get_weights()
    assert len(a) == len(b)
    for i, (u, v) in enumerate(zip(a, b)):
        np.testing.assert_allclose(v, u, rtol=tol, atol=tol, err_msg=f"weight {i}")


def both(make_model, make_args, tmp_path, tol=TOL, seed=0, **options):
    """Trains ``make_model()`` with ``model.fit`` and another with ``tfgpu.fit`` on ``make_args(record)`` (called
    once per run, so generators and Datasets are made afresh); asserts equal histories, weights and optimizer steps;
    returns (keras_run, tfgpu_run)."""
    plain = keras_run(make_model, make_args, seed)
    ours = tfgpu_run(make_model, make_args, tmp_path / "run", seed, **options)
    assert_same_history(plain.history, ours.history, tol)
    assert_same_weights(plain.model, ours.model, tol)
    assert ours.iterations == plain.iterations
    assert ours.model.history is ours.history
    return plain, ours


def weights_changed(before, model):
    return any(not np.array_equal(a, b) for a, b in zip(before, model.get_weights()))



def sigterm_at(stop_at: str):
    """A Keras callback that sends SIGTERM to its own process after batch ``"epoch:batch"`` (the audit scripts'
    preemption; run after ``import tfgpu``, which installs the handler that makes it a stop)."""
    import signal

    import keras

    class SigtermAt(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            if f"{self.epoch}:{batch}" == stop_at:
                os.kill(os.getpid(), signal.SIGTERM)

    return SigtermAt()


def printed(script: str, marker: str, args, cwd, launch_workers=0, expect=0, timeout=900, launch_args=()):
    """The JSON after ``marker`` (``"AUDIT"``, ``"RESULT"``) on each line a script beside this file (``fit_script.py``,
    ``audit_script.py``, ``records_audit_script.py``) prints, run with ``args`` in a fresh Python, or under
    ``tfgpu.launch`` on ``launch_workers`` workers (``launch_args`` its flags; one line each); asserts the exit code
    is ``expect``."""
    import json
    import subprocess
    import sys

    from tests.conftest import REPO

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), script)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": REPO}
    command = [sys.executable, path, *args]
    if launch_workers:
        command = [sys.executable, "-m", "tfgpu.launch", f"--num_workers={launch_workers}", *launch_args, "--",
                   "python", path, *args]
    proc = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == expect, (proc.stdout + proc.stderr)[-4000:]
    return [json.loads(line.split(f"{marker} ", 1)[1]) for line in proc.stdout.splitlines() if f"{marker} " in line]
