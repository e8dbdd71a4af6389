"""tfgpu.training.keras_fit: stock Keras 3 ``fit`` under Mirrored with steps_per_execution > 1 and under MWMS.

If a Keras upgrade changes the internals the patch replaces, ``test_installed_keras_is_a_verified_release``
fails; if it fixes the bugs, ``test_mirrored_steps_per_execution_4_matches_steps_per_execution_1`` fails on
its "unpatched Keras still fails" line. Either way: re-verify tfgpu.training.keras_fit before widening its guard.
"""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import REPO

# Digits (real, offline), a small CNN, SGD: deterministic given the seed, no shuffling.
COMMON = '''
import json, os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import numpy as np
import tensorflow as tf
{devices}
import keras
from sklearn.datasets import load_digits
from tfgpu.training import keras_fit

digits = load_digits()
X = (digits.images[..., None] / 16.0).astype("float32")
Y = digits.target.astype("int32")


def dataset(batch, drop_remainder=False):
    return tf.data.Dataset.from_tensor_slices((X, Y)).batch(batch, drop_remainder=drop_remainder)


def build(strategy, steps_per_execution):
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(8, 3, activation="relu"),
                                  keras.layers.Flatten(), keras.layers.Dense(10)])
        model.compile(optimizer=keras.optimizers.SGD(0.05), metrics=["accuracy"],
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      steps_per_execution=steps_per_execution)
    return model


def summary(model, history):
    return {{"history": history.history, "steps": int(model.optimizer.iterations.numpy()),
            "weights": [w.numpy().tolist() for w in model.weights]}}
'''

MIRRORED = COMMON.format(devices='''
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
''') + '''
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
out = {}
model = build(strategy, 1)
out["spe1"] = summary(model, model.fit(dataset(48), epochs=2, verbose=0, validation_data=dataset(48)))
try:
    model = build(strategy, 4)
    model.fit(dataset(48), epochs=1, verbose=0)
    out["unpatched_spe4"] = "trained"
except Exception as e:
    out["unpatched_spe4"] = f"{type(e).__name__}: {e}"
keras_fit.patch()
model = build(strategy, 4)
out["spe4"] = summary(model, model.fit(dataset(48), epochs=2, verbose=0, validation_data=dataset(48)))
out["evaluate"] = model.evaluate(dataset(48), verbose=0, return_dict=True)
print("RESULT " + json.dumps(out))
'''

# One worker of a 2-worker MWMS job (started by tfgpu.launch). argv: model_dir [crash_after_epoch [split]];
# "split" points the non-chief at a backup dir of its own (storage that is not shared).
FIT_WORKER = COMMON.format(devices="") + '''
keras_fit.patch()
strategy = keras_fit.make_strategy(collective_timeout_s=60)
model_dir = sys.argv[1]
crash_after = int(sys.argv[2]) if len(sys.argv) > 2 else -1
chief = keras_fit.is_chief(strategy)


class Crash(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if epoch == crash_after and not chief:
            print(f"crashing after epoch {epoch + 1}", flush=True)
            os._exit(3)


split = len(sys.argv) > 3 and sys.argv[3] == "split" and not chief
backup = keras_fit.ChiefBackupAndRestore(os.path.join(model_dir, "elsewhere" if split else "backup"),
                                         delete_on_success=False)
callbacks = [backup, Crash(), keras_fit.ChiefModelCheckpoint(os.path.join(model_dir, "ckpt", "model.keras")),
             keras_fit.ChiefTensorBoard(os.path.join(model_dir, "logs"))]
model = build(strategy, 4)
history = model.fit(dataset(64, drop_remainder=True), epochs=3, verbose=2 if chief else 0, callbacks=callbacks)
print("RESULT " + json.dumps({"chief": chief, "replicas": strategy.num_replicas_in_sync,
                              "restored_epoch": backup.restored_epoch, **summary(model, history)}))
'''


def _results(output):
    return [json.loads(m) for m in re.findall(r"RESULT (.*)$", output, re.M)]


def _assert_same_weights(a, b, atol):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_allclose(np.array(x), np.array(y), atol=atol, rtol=0)


def test_installed_keras_is_a_verified_release():
    from tfgpu.training import keras_fit

    keras_fit.check_keras()  # version in range, signatures, call sites and the replaced sources all verified


def test_patch_is_idempotent_and_reversible():
    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer

    from tfgpu.training import keras_fit

    original = TensorFlowTrainer._make_function, TensorFlowTrainer._maybe_symbolic_build
    try:
        keras_fit.patch()
        keras_fit.patch()
        assert TensorFlowTrainer._make_function is keras_fit._make_function
        assert TensorFlowTrainer._maybe_symbolic_build is keras_fit._maybe_symbolic_build
        keras_fit.check_keras()  # still judges Keras' own methods, not ours
    finally:
        keras_fit.unpatch()
    assert (TensorFlowTrainer._make_function, TensorFlowTrainer._maybe_symbolic_build) == original


def test_guard_rejects_unverified_keras(monkeypatch):
    import keras
    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer

    from tfgpu.training import keras_fit

    monkeypatch.setattr(keras, "__version__", "3.16.0")
    from tfgpu.runtime import keras_internals

    with pytest.raises(keras_internals.KerasUnsupported, match=r"Keras 3.16.0 is installed; tfgpu supports Keras "
                                                               r"3.12.4 up to \(not including\) 3.16"):
        keras_fit.patch()
    monkeypatch.undo()

    def _make_function(self, step_function):  # what a Keras release that rewrote the method looks like
        return None

    monkeypatch.setattr(TensorFlowTrainer, "_make_function", _make_function)
    with pytest.raises(keras_fit.KerasInternalsChanged, match="TensorFlowTrainer._make_function differs from the "
                                                              "verified Keras releases"):
        keras_fit.patch()
    keras_fit.check_keras(allow_unverified=True)  # the structural checks still pass
    monkeypatch.setattr(TensorFlowTrainer, "_maybe_symbolic_build", lambda self, iterator=None: None)
    with pytest.raises(keras_fit.KerasInternalsChanged, match=r"_maybe_symbolic_build\(self, iterator=None\) no "
                                                              r"longer takes \(self, iterator, data_batch\)"):
        keras_fit.check_keras(allow_unverified=True)
    monkeypatch.undo()
    monkeypatch.setitem(keras_fit.REQUIRED_CALLS, "fit", "self._run_fit_loop(")
    with pytest.raises(keras_fit.KerasInternalsChanged, match=r"TensorFlowTrainer.fit no longer calls"):
        keras_fit.check_keras()
    assert TensorFlowTrainer._make_function is not keras_fit._make_function  # the refusals patched nothing


# Slow: (28 s loaded); keras_fit under MultiWorkerMirrored stays in the default suite.
@pytest.mark.slow
def test_mirrored_steps_per_execution_4_matches_steps_per_execution_1():
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run([sys.executable, "-c", MIRRORED], cwd=REPO, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:]
    (out,) = _results(proc.stdout)
    # Unpatched Keras still fails (keras-team/keras#19246); when this line fails, Keras fixed it: drop the patch.
    assert "You must feed a value for placeholder tensor" in out["unpatched_spe4"], out["unpatched_spe4"][:500]
    spe1, spe4 = out["spe1"], out["spe4"]
    assert spe1["steps"] == spe4["steps"] == 2 * 38  # 1797 digits / 48 = 37 full batches + 1 partial, per epoch
    losses = spe4["history"]["loss"]
    assert losses[1] < losses[0] - 0.3
    for key in ("loss", "accuracy", "val_loss", "val_accuracy"):
        np.testing.assert_allclose(spe4["history"][key], spe1["history"][key], rtol=1e-5, err_msg=key)
    _assert_same_weights(spe4["weights"], spe1["weights"], atol=1e-5)  # same data, same steps: float noise only
    assert out["evaluate"]["loss"] == pytest.approx(spe4["history"]["val_loss"][-1], rel=1e-5)


def _launch(worker_dir, model_dir, *extra, scratch, timeout=240):
    env = {**os.environ, "PYTHONPATH": f"{worker_dir}{os.pathsep}{REPO}", "TF_CPP_MIN_LOG_LEVEL": "2", "TFGPU_NO_JOB_STRATEGY": "1",
           "TMPDIR": str(scratch)}
    proc = subprocess.run([sys.executable, "-m", "tfgpu.launch", "--num_workers=2", "--module=fit_worker",
                           "--stop_grace_s=5", "--worker_timeout_s=200", "--", str(model_dir), *extra],
                          cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)
    return proc.returncode, proc.stdout


@pytest.fixture
def fit_worker(tmp_path):
    (tmp_path / "fit_worker.py").write_text(FIT_WORKER)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    return tmp_path, scratch


def test_multi_worker_fit_trains_workers_agree_and_only_the_chief_writes(fit_worker):
    worker_dir, scratch = fit_worker
    model_dir = worker_dir / "run"
    code, output = _launch(worker_dir, model_dir, scratch=scratch)
    assert code == 0, output[-4000:]
    results = sorted(_results(output), key=lambda r: not r["chief"])
    assert [r["chief"] for r in results] == [True, False] and results[0]["replicas"] == 2
    chief, other = results
    assert chief["steps"] == other["steps"] == 3 * 28  # 1797 // 64 global batches per epoch
    assert chief["history"] == other["history"]  # logs are all-reduced: the same numbers on both workers
    assert chief["history"]["loss"][-1] < chief["history"]["loss"][0] - 0.5
    _assert_same_weights(chief["weights"], other["weights"], atol=0)  # replicas stay in sync
    assert os.listdir(model_dir / "ckpt") == ["model.keras"]
    assert sorted(f for f in os.listdir(model_dir / "backup") if f.endswith(".index")) == ["ckpt-2.index",
                                                                                          "ckpt-3.index"]
    events = [f for _, _, files in os.walk(model_dir / "logs") for f in files]
    assert len(events) == 1 and ".tfevents." in events[0]  # only the chief's
    assert os.listdir(scratch) == []  # the non-chief deleted its temporary checkpoint/backup/summary dirs
    assert len(re.findall(r"^\[worker 0\] Epoch \d/3", output, re.M)) == 3
    assert not re.search(r"^\[worker 1\] Epoch", output, re.M)  # verbose=0 off the chief


@pytest.mark.slow
def test_multi_worker_fit_resumes_from_the_backup_after_a_worker_dies(fit_worker):
    worker_dir, scratch = fit_worker
    code, output = _launch(worker_dir, worker_dir / "straight", scratch=scratch)
    assert code == 0, output[-4000:]
    straight = _results(output)[0]

    model_dir = worker_dir / "crashed"
    code, output = _launch(worker_dir, model_dir, "1", scratch=scratch)  # worker 1 dies after epoch 2
    assert code == 3 and "error: worker 1 failed with exit code 3" in output, output[-4000:]
    code, output = _launch(worker_dir, model_dir, "-1", "split", scratch=scratch)  # backups not shared: refused
    assert code == 1 and "workers found different backups" in output, output[-4000:]
    code, output = _launch(worker_dir, model_dir, scratch=scratch)
    assert code == 0, output[-4000:]
    resumed = _results(output)
    assert [r["restored_epoch"] for r in resumed] == [1, 1]
    assert all(len(r["history"]["loss"]) == 1 for r in resumed)  # only epoch 3 ran again
    for r in resumed:
        assert r["steps"] == straight["steps"]
        _assert_same_weights(r["weights"], straight["weights"], atol=1e-6)


def test_backup_and_restore_resumes_an_interrupted_fit_in_process(tmp_path):
    import keras
    import tensorflow as tf

    from tfgpu.training import keras_fit

    x = np.random.default_rng(0).normal(size=(256, 4)).astype("float32")
    y = x @ np.array([1.0, -2.0, 0.5, 3.0], dtype="float32")

    def build():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
        return model

    def data():
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(32)

    class Interrupt(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 1:
                raise KeyboardInterrupt("preempted")

    straight = build()
    straight.fit(data(), epochs=4, verbose=0)

    backup_dir = tmp_path / "backup"
    with pytest.raises(KeyboardInterrupt):
        build().fit(data(), epochs=4, verbose=0, callbacks=[keras_fit.ChiefBackupAndRestore(backup_dir), Interrupt()])
    assert tf.train.latest_checkpoint(str(backup_dir)).endswith("ckpt-2")
    restore = keras_fit.ChiefBackupAndRestore(backup_dir)
    resumed = build()
    history = resumed.fit(data(), epochs=4, verbose=0, callbacks=[restore])
    assert restore.restored_epoch == 1 and len(history.history["loss"]) == 2  # epochs 3 and 4 only
    assert int(resumed.optimizer.iterations.numpy()) == int(straight.optimizer.iterations.numpy()) == 32
    _assert_same_weights([w.numpy() for w in resumed.weights], [w.numpy() for w in straight.weights], atol=1e-6)
    assert not backup_dir.exists()  # deleted after a normal end
