"""compile()'s metrics under tfgpu.fit: Keras' names, the metrics that cannot be summed refused by name, each
replica's state increments adding up to Keras' value, and History's epoch values equal to plain model.fit's on
2 replicas and (slow) 2 workers.

With SGD(0.0) the weights never move, so an epoch's metrics are those of its examples in any order: tfgpu's
shuffled epochs and Keras' unshuffled one are compared exactly."""
import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfgpu
from tests.conftest import REPO
from tfgpu.config import ConfigError
from tfgpu.data import builtin
from tfgpu.training import fit_metrics


def test_names_are_keras_names_and_accuracy_follows_the_labels():
    top2 = keras.metrics.SparseTopKCategoricalAccuracy(k=2)
    entries = fit_metrics.resolve(["accuracy", "sparse_top_k_categorical_accuracy", top2, "acc"], ["accuracy"],
                                  one_hot=False, num_outputs=10)
    assert [(name, weighted) for name, _, weighted in entries] == [
        ("accuracy", False), ("sparse_top_k_categorical_accuracy", False),
        ("sparse_top_k_categorical_accuracy_1", False), ("acc", False), ("weighted_accuracy", True)]
    assert entries[2][1] is not top2 and entries[2][1].k == 2  # a copy: the user's object keeps its state
    kinds = {(one_hot, n): type(fit_metrics.resolve(["accuracy"], [], one_hot, n)[0][1]).__name__
             for one_hot, n in ((False, 10), (True, 10), (False, 1))}
    assert kinds == {(False, 10): "SparseCategoricalAccuracy", (True, 10): "CategoricalAccuracy",
                     (False, 1): "BinaryAccuracy"}


@pytest.mark.parametrize("metric, message", [
    (keras.metrics.R2Score(), "metric 'r2_score' (R2Score)"),
    (keras.metrics.AUC(multi_label=True), "makes its state at its first batch"),
    (keras.metrics.Mean(name="loss"), "a metric named 'loss'"),
])
def test_a_metric_that_cannot_be_summed_over_replicas_is_refused_by_name(metric, message):
    with pytest.raises(ConfigError) as e:
        fit_metrics.resolve([metric], [], one_hot=True, num_outputs=3)
    assert e.value.flag == "model" and message in str(e.value)


def test_increments_of_parts_add_up_to_the_metric_of_the_whole():
    """What each replica adds, summed, gives Keras' own value over the whole batch (AUC, precision, top-k, the
    masked-out padding ignored)."""
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 4, 24)
    truth = np.eye(4, dtype="float32")[labels]
    predicted = rng.dirichlet(np.ones(4), 24).astype("float32")
    metrics = fit_metrics.CompiledMetrics(fit_metrics.resolve(
        [keras.metrics.AUC(name="auc"), keras.metrics.Precision(name="precision"), "top_k_categorical_accuracy",
         keras.metrics.Recall(name="recall")], [],
        one_hot=True, num_outputs=4))
    metrics.build(tf.distribute.get_strategy())
    mask = np.ones(24, "float32")
    mask[20:] = 0  # padding
    for part in (slice(0, 10), slice(10, 24)):
        metrics.add("eval", metrics.increments(truth[part], predicted[part], mask[part]))
    expected = {}
    for name, metric in (("auc", keras.metrics.AUC()), ("precision", keras.metrics.Precision()),
                         ("top_k_categorical_accuracy", keras.metrics.TopKCategoricalAccuracy()),
                         ("recall", keras.metrics.Recall())):
        metric.update_state(truth[:20], predicted[:20])
        expected[name] = pytest.approx(float(metric.result()), abs=1e-6)
    assert metrics.results("eval") == expected
    metrics.reset("eval")
    assert not metrics.state["eval"].numpy().any()


@pytest.fixture(scope="module")
def digits():
    x, y = builtin.load_builtin("digits")["splits"]["train"]
    return x[:96], y[:96].astype("int64")


def frozen_model(metrics, one_hot: bool, name: str):
    """A small softmax classifier compiled with SGD(0.0): its weights never move."""
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Rescaling(1 / 255), keras.layers.Flatten(),
                              keras.layers.Dense(16, activation="relu"), keras.layers.Dense(10, activation="softmax")],
                             name=name)
    loss = "categorical_crossentropy" if one_hot else "sparse_categorical_crossentropy"
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss=loss, metrics=metrics)
    return model


CASES = {
    "sparse": (lambda: ["accuracy", "sparse_top_k_categorical_accuracy",
                        keras.metrics.SparseTopKCategoricalAccuracy(k=2, name="top2")], False),
    "one_hot": (lambda: [keras.metrics.AUC(name="auc"), keras.metrics.Precision(thresholds=0.2, name="precision"),
                         keras.metrics.Recall(thresholds=0.2, name="recall"),
                         "top_k_categorical_accuracy", "categorical_accuracy"], True),
}


@pytest.mark.parametrize("case", ["one_hot", pytest.param("sparse", marks=pytest.mark.slow)])
def test_history_equals_plain_keras_on_two_replicas(case, digits, tmp_path, monkeypatch):
    """Every epoch's metrics and val_ metrics equal plain model.fit's on one device, trained on 2 replicas."""
    from tfgpu.training import experiment

    monkeypatch.setattr(experiment, "_write_report", lambda model_dir: None)
    metrics, one_hot = CASES[case]
    x, y = digits
    labels = np.eye(10, dtype="float32")[y] if one_hot else y
    plain = frozen_model(metrics(), one_hot, "plain").fit(x, labels, batch_size=16, epochs=2, validation_split=1 / 3,
                                                          shuffle=False, verbose=0)
    history = tfgpu.fit(frozen_model(metrics(), one_hot, "mine"), x, labels, batch_size=16, epochs=2,
                        validation_split=1 / 3, verbose=0, steps_per_loop=2, tensorboard=False,
                        model_dir=str(tmp_path / "run"), cpu_logical_devices=2, distribution_strategy="mirrored")
    assert history.history.keys() == plain.history.keys()
    for key, values in plain.history.items():
        assert history.history[key] == pytest.approx(values, abs=1e-5), key


TWO_WORKERS = """
import json, sys
import keras, numpy as np
import tfgpu
from tfgpu.data import builtin

x, y = builtin.load_builtin("digits")["splits"]["train"]
x, y = x[:96], y[:96].astype("int64")
keras.utils.set_random_seed(1)
model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Rescaling(1 / 255), keras.layers.Flatten(),
                          keras.layers.Dense(16, activation="relu"), keras.layers.Dense(10, activation="softmax")])
model.compile(optimizer=keras.optimizers.SGD(0.0), loss="categorical_crossentropy",
              metrics=[keras.metrics.AUC(), keras.metrics.Precision(thresholds=0.2), "top_k_categorical_accuracy"])
labels = np.eye(10, dtype="float32")[y]
if sys.argv[1] == "keras":
    history = model.fit(x, labels, batch_size=16, epochs=2, validation_split=1 / 3, shuffle=False, verbose=0)
else:
    history = tfgpu.fit(model, x, labels, batch_size=16, epochs=2, validation_split=1 / 3, verbose=0,
                        steps_per_loop=2, tensorboard=False, model_dir=sys.argv[2])
print("HISTORY " + json.dumps(history.history), flush=True)
"""


@pytest.mark.slow
def test_history_equals_plain_keras_on_two_workers(tmp_path):
    """Through python -m tfgpu.launch --num_workers=2: both workers' History equal plain model.fit's (every worker's
    examples counted, not one's)."""
    script = tmp_path / "script.py"
    script.write_text(TWO_WORKERS)
    env = dict(os.environ, PYTHONPATH=REPO)

    def histories(*command):
        proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return [json.loads(line.split("HISTORY ", 1)[1]) for line in proc.stdout.splitlines() if "HISTORY " in line]

    [plain] = histories(sys.executable, str(script), "keras")
    workers = histories(sys.executable, "-m", "tfgpu.launch", "--num_workers=2", "--", "python", str(script), "tfgpu",
                        str(tmp_path / "run"))
    assert len(workers) == 2
    for history in workers:
        assert history.keys() == plain.keys()
        for key, values in plain.items():
            assert history[key] == pytest.approx(values, abs=1e-5), key
