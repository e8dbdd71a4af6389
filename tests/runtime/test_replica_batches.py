"""runtime/replica_batches: after tfgpu.fit on two replicas (two logical CPUs; two workers in the slow test), the
script's own ``model.predict``/``model.evaluate`` of fewer examples than replicas give one device's answer, and no
layer is handed an empty batch. The model's first layer refuses an empty batch, as oneDNN's Conv2D mishandles one on
some CPUs (docs/multi-node.md, "Faults"): without the guard the same calls fail. Logical devices must be set before
TensorFlow starts, so the runs happen in subprocesses (on two logical CPUs, tests/logical_cpus.py's)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests import logical_cpus
from tests.conftest import REPO

EXAMPLES = 9
COMMON = r'''
import json, sys
import numpy as np
import tensorflow as tf
import keras


class NoEmptyBatch(keras.layers.Layer):
    """Fails on an empty batch, as oneDNN's Conv2D (and the next layer) does on some CPUs."""
    def call(self, x):
        with tf.control_dependencies([tf.debugging.assert_positive(tf.shape(x)[0], message="an empty batch")]):
            return tf.identity(x)


def conv_model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8, 8, 3)), NoEmptyBatch(),
                              keras.layers.Conv2D(4, 3, strides=2, padding="same", activation="relu"),
                              keras.layers.Flatten(), keras.layers.Dense(3)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


x = np.random.default_rng(0).normal(size=(%d, 8, 8, 3)).astype("float32")
y = np.arange(len(x)) %% 3


def after_fit(model):
    """What a script asks its model after fit: a batch of 1 and batches that leave a replica empty."""
    out = {}
    for name, call in [("predict_1", lambda: model.predict(x[:1], verbose=0).tolist()),
                       ("predict_5_by_4", lambda: model.predict(x[:5], batch_size=4, verbose=0).tolist()),
                       ("evaluate_1", lambda: model.evaluate(x[:1], y[:1], verbose=0, return_dict=True)),
                       ("evaluate_5_by_3", lambda: model.evaluate(x[:5], y[:5], batch_size=3, verbose=0,
                                                                  return_dict=True))]:
        try:
            out[name] = call()
        except tf.errors.InvalidArgumentError as e:
            out[name] = "failed: " + ("an empty batch" if "an empty batch" in str(e) else str(e)[:300])
    return out
''' % EXAMPLES

SCRIPT = COMMON.replace("import tensorflow as tf\n", '''import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
''', 1) + r'''
import tfgpu
from tfgpu.runtime import replica_batches
from tfgpu.training import keras_adapter

strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    model = conv_model()
history = tfgpu.fit(model, x[:8], y[:8], batch_size=4, epochs=2, verbose=0, validation_data=(x[:5], y[:5]),
                    validation_batch_size=4, model_dir=sys.argv[1])  # the validation's last batch: 1 example
result = {"guarded": after_fit(model), "history": history.history,
          "weights": [w.tolist() for w in model.get_weights()]}
replica_batches.unpatch()
keras_adapter.unpatch()
with strategy.scope():
    plain = conv_model()
result["unguarded"] = after_fit(plain)
print("RESULT " + json.dumps(result))
'''

WORKERS = "import tfgpu\n" + COMMON + r'''
model = conv_model()
history = tfgpu.fit(model, x[:8], y[:8], batch_size=4, epochs=2, verbose=0, validation_data=(x[:5], y[:5]),
                    validation_batch_size=4, model_dir=sys.argv[1])
result = {"guarded": after_fit(model), "history": history.history, "weights": [w.tolist() for w in model.get_weights()]}
print("RESULT " + json.dumps(result), flush=True)
'''


def _env():
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("TF_CONFIG", None)
    return env


def _results(output):
    return [json.loads(line.split("RESULT ", 1)[1]) for line in output.splitlines() if "RESULT {" in line]


def one_device(weights):
    """The one-device answers of the model with ``weights``, from the same script's definitions."""
    scope = {}
    exec(compile(COMMON, "common", "exec"), scope)
    model = scope["conv_model"]()
    model.set_weights([np.asarray(w, "float32") for w in weights])
    return scope["after_fit"](model)


def assert_one_device(got, expected):
    for name, value in expected.items():
        assert not isinstance(got[name], str), f"{name}: {got[name]}"
        if isinstance(value, dict):
            assert got[name].keys() == value.keys()
            for key in value:
                np.testing.assert_allclose(got[name][key], value[key], rtol=1e-6, atol=1e-6, err_msg=name)
        else:
            np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


def test_predict_and_evaluate_of_fewer_examples_than_replicas_give_one_devices_answer(tmp_path_factory):
    result = logical_cpus.results(tmp_path_factory, __name__)
    assert len(result["history"]["val_loss"]) == 2  # tfgpu.fit's validation took a last batch of 1 on 2 replicas
    assert_one_device(result["guarded"], one_device(result["weights"]))
    assert result["unguarded"]["predict_1"].startswith("failed")  # what the guard prevents
    assert result["unguarded"]["evaluate_5_by_3"].startswith("failed")


@pytest.mark.slow  # two workers start, each a TensorFlow runtime: ~1 min on 2 loaded cores
def test_two_workers_predict_and_evaluate_a_batch_of_one_as_one_device(tmp_path):
    script = tmp_path / "workers.py"
    script.write_text(WORKERS)
    command = [sys.executable, "-m", "tfgpu.launch", "--num_workers=2", "--", sys.executable, str(script),
               str(tmp_path / "run")]
    proc = subprocess.run(command, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=600,
                          start_new_session=True)
    results = _results(proc.stdout + proc.stderr)
    assert proc.returncode == 0 and len(results) == 2, \
        f"exit {proc.returncode}:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    expected = one_device(results[0]["weights"])
    for result in results:
        assert_one_device(result["guarded"], expected)
