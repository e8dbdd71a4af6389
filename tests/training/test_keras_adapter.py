"""tfgpu.training.keras_adapter: the script's own ``model.evaluate``/``predict`` under tfgpu's job strategy
(MultiWorkerMirrored, Mirrored with steps_per_execution > 1), and ``model.fit`` sent to ``tfgpu.fit`` in one line
where stock Keras 3 cannot train.

If a Keras upgrade changes the internals the patch replaces, ``test_installed_keras_is_a_verified_release``
fails; if it fixes the bugs, ``test_under_mirrored_fit_is_keras_own_or_refused_and_evaluate_runs_several_steps_a_call``
fails on its "unpatched Keras still fails" line. Either way: re-verify tfgpu.training.keras_adapter before widening
its guard.
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
from tfgpu.training import keras_adapter

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
out["keras_spe1"] = summary(model, model.fit(dataset(48), epochs=1, verbose=0))
out["keras_evaluate"] = model.evaluate(dataset(48), verbose=0, return_dict=True)
try:
    build(strategy, 4).fit(dataset(48), epochs=1, verbose=0)
    out["unpatched_spe4"] = "trained"
except Exception as e:
    out["unpatched_spe4"] = f"{type(e).__name__}: {e}"
keras_adapter.patch()
model = build(strategy, 1)
out["spe1"] = summary(model, model.fit(dataset(48), epochs=1, verbose=0))
model = build(strategy, 4)
try:
    model.fit(dataset(48), epochs=1, verbose=0)
    out["refused"] = "trained"
except keras_adapter.FitNeedsTfgpu as e:
    out["refused"] = str(e)
    out["refused_exit"] = e.code
out["refused_steps"] = int(model.optimizer.iterations.numpy())
model.set_weights([np.asarray(w) for w in out["spe1"]["weights"]])
out["evaluate"] = model.evaluate(dataset(48), verbose=0, return_dict=True)
out["predict_rows"] = int(model.predict(dataset(48), verbose=0).shape[0])
print("RESULT " + json.dumps(out))
'''

# One worker of a 2-worker MWMS job (started by tfgpu.launch; ``import tfgpu`` makes the job's strategy and patches
# Keras): the script's own evaluate and predict, then a model.fit, left uncaught as a user's script leaves it.
FIT_WORKER = "import tfgpu\n" + COMMON.format(devices="") + '''
from tfgpu.runtime import job_strategy

strategy = job_strategy.strategy()
model = build(strategy, 4)
logits = model.predict(dataset(64), verbose=0)
evaluated = model.evaluate(dataset(64), verbose=0, return_dict=True)
print("RESULT " + json.dumps({"replicas": strategy.num_replicas_in_sync, "evaluate": evaluated,
                              "logits": logits.tolist()}), flush=True)
model.fit(dataset(64), epochs=1, verbose=0)
print("model.fit trained", flush=True)
'''


def _results(output):
    return [json.loads(m) for m in re.findall(r"RESULT (.*)$", output, re.M)]


def _assert_same_weights(a, b, atol):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_allclose(np.array(x), np.array(y), atol=atol, rtol=0)


def test_installed_keras_is_a_verified_release():
    from tfgpu.training import keras_adapter

    keras_adapter.check_keras()  # version in range, signatures, call sites and the replaced sources all verified


def test_patch_is_idempotent_and_reversible():
    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer

    from tfgpu.training import keras_adapter

    original = TensorFlowTrainer._make_function, TensorFlowTrainer._maybe_symbolic_build
    try:
        keras_adapter.patch()
        keras_adapter.patch()
        assert TensorFlowTrainer._make_function is keras_adapter._make_function
        assert TensorFlowTrainer._maybe_symbolic_build is keras_adapter._maybe_symbolic_build
        keras_adapter.check_keras()  # still judges Keras' own methods, not ours
    finally:
        keras_adapter.unpatch()
    assert (TensorFlowTrainer._make_function, TensorFlowTrainer._maybe_symbolic_build) == original


def test_guard_rejects_unverified_keras(monkeypatch):
    import keras
    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer

    from tfgpu.training import keras_adapter

    monkeypatch.setattr(keras, "__version__", "3.16.0")
    from tfgpu.runtime import keras_internals

    with pytest.raises(keras_internals.KerasUnsupported, match=r"Keras 3.16.0 is installed; tfgpu supports Keras "
                                                               r"3.12.4 up to \(not including\) 3.16"):
        keras_adapter.patch()
    monkeypatch.undo()

    def _make_function(self, step_function):  # what a Keras release that rewrote the method looks like
        return None

    monkeypatch.setattr(TensorFlowTrainer, "_make_function", _make_function)
    with pytest.raises(keras_adapter.KerasInternalsChanged,
                       match="TensorFlowTrainer._make_function differs from the verified Keras releases"):
        keras_adapter.patch()
    keras_adapter.check_keras(allow_unverified=True)  # the structural checks still pass
    monkeypatch.setattr(TensorFlowTrainer, "_maybe_symbolic_build", lambda self, iterator=None: None)
    with pytest.raises(keras_adapter.KerasInternalsChanged,
                       match=r"_maybe_symbolic_build\(self, iterator=None\) no longer takes "
                             r"\(self, iterator, data_batch\)"):
        keras_adapter.check_keras(allow_unverified=True)
    monkeypatch.undo()
    monkeypatch.setitem(keras_adapter.REQUIRED_CALLS, "fit", "self._run_fit_loop(")
    with pytest.raises(keras_adapter.KerasInternalsChanged, match=r"TensorFlowTrainer.fit no longer calls"):
        keras_adapter.check_keras()
    assert TensorFlowTrainer._make_function is not keras_adapter._make_function  # the refusals patched nothing


# Slow (28 s loaded: a process of its own); the refusal under MultiWorkerMirrored stays in the default suite.
@pytest.mark.slow
def test_under_mirrored_fit_is_keras_own_or_refused_and_evaluate_runs_several_steps_a_call():
    """Two replicas: model.fit with steps_per_execution=1 stays Keras' own (the same weights patched or not); with 4,
    where Keras fails, it stops before its first step in one line naming tfgpu.fit; evaluate with 4 steps a call (the
    adapter's loop, ``training.loop.run_steps``) gives Keras' own evaluation of the same weights."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run([sys.executable, "-c", MIRRORED], cwd=REPO, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:]
    (out,) = _results(proc.stdout)
    # Unpatched Keras still fails (keras-team/keras#19246); when this line fails, Keras fixed it: re-verify the adapter.
    assert "You must feed a value for placeholder tensor" in out["unpatched_spe4"], out["unpatched_spe4"][:500]
    assert out["spe1"]["steps"] == out["keras_spe1"]["steps"] == 38  # 1797 digits / 48: 37 full batches + 1 partial
    assert out["spe1"]["history"] == out["keras_spe1"]["history"]
    _assert_same_weights(out["spe1"]["weights"], out["keras_spe1"]["weights"], atol=0)  # Keras' own train function
    assert out["refused"] == ("model.fit cannot train under MirroredStrategy with steps_per_execution=4 "
                              "(keras-team/keras#19246) in Keras 3; train with tfgpu.fit, same arguments: "
                              "`model.fit(` -> `tfgpu.fit(model, ` (model.evaluate/predict work as they are)")
    assert out["refused_exit"] == "tfgpu: " + out["refused"] and out["refused_steps"] == 0
    for key in ("loss", "accuracy"):
        assert out["evaluate"][key] == pytest.approx(out["keras_evaluate"][key], rel=1e-5), key
    assert out["predict_rows"] == 1797


def _launch(worker_dir, *extra, scratch, timeout=240):
    env = {**os.environ, "PYTHONPATH": f"{worker_dir}{os.pathsep}{REPO}", "TF_CPP_MIN_LOG_LEVEL": "2",
           "TMPDIR": str(scratch)}
    env.pop("TFGPU_NO_JOB_STRATEGY", None)
    proc = subprocess.run([sys.executable, "-m", "tfgpu.launch", "--num_workers=2", "--module=fit_worker",
                           "--stop_grace_s=5", "--worker_timeout_s=200", "--", *extra],
                          cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)
    return proc.returncode, proc.stdout


@pytest.fixture
def fit_worker(tmp_path):
    (tmp_path / "fit_worker.py").write_text(FIT_WORKER)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    return tmp_path, scratch


def test_multi_worker_evaluate_and_predict_work_and_model_fit_names_tfgpu_fit_in_one_line(fit_worker):
    """Two workers under ``import tfgpu``'s MultiWorkerMirroredStrategy: the script's own predict gives every
    example's logits and evaluate their mean loss and accuracy, the same on both workers; its model.fit, uncaught,
    ends each worker before a step with the one line naming tfgpu.fit, no traceback."""
    from sklearn.datasets import load_digits

    worker_dir, scratch = fit_worker
    code, output = _launch(worker_dir, scratch=scratch)
    assert code == 1 and "exit codes: worker 0=1, worker 1=1" in output, output[-4000:]
    results = [json.loads(m) for m in re.findall(r"^\[worker \d\] RESULT (.*)$", output, re.M)]
    assert len(results) == 2 and results[0] == results[1] and results[0]["replicas"] == 2, output[-4000:]
    logits = np.array(results[0]["logits"], np.float64)
    labels = load_digits().target
    assert logits.shape == (1797, 10)
    log_softmax = logits - logits.max(axis=1, keepdims=True)
    log_softmax -= np.log(np.exp(log_softmax).sum(axis=1, keepdims=True))
    evaluated = results[0]["evaluate"]
    assert evaluated["loss"] == pytest.approx(-log_softmax[np.arange(1797), labels].mean(), rel=1e-4)
    assert evaluated["accuracy"] == pytest.approx((logits.argmax(axis=1) == labels).mean(), abs=1e-6)
    line = ("tfgpu: model.fit cannot train under MultiWorkerMirroredStrategy in Keras 3; train with tfgpu.fit, same "
            "arguments: `model.fit(` -> `tfgpu.fit(model, ` (model.evaluate/predict work as they are)")
    assert len(re.findall(rf"^\[worker \d\] {re.escape(line)}$", output, re.M)) == 2, output[-4000:]
    assert "model.fit trained" not in output and "Traceback" not in output, output[-4000:]


def test_tfgpu_keras_fit_says_in_one_line_that_the_door_ended():
    """The attribute a script of the old door names, read or imported: one line naming tfgpu.fit, exit 1, no
    traceback into a module that is gone."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "TFGPU_NO_JOB_STRATEGY": "1"}
    for code in ("import tfgpu\ntfgpu.keras_fit.patch()", "from tfgpu import keras_fit"):
        proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 1 and proc.stdout == "", (code, proc.stdout, proc.stderr)
        assert proc.stderr.strip().splitlines() == [
            "tfgpu: tfgpu.keras_fit has ended: train with tfgpu.fit, same arguments (`model.fit(` -> "
            "`tfgpu.fit(model, `); after `import tfgpu` the script's own model.evaluate/predict work under the "
            "job's strategy as they are (docs/from-model-fit.md)"], (code, proc.stderr)
