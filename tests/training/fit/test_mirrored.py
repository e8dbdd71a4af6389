"""Cases of the Why list on a 2-replica MirroredStrategy over two logical CPUs: a subclassed train_step with its own
trackers, a random map drawn each epoch, stop_training in a batch hook, class_weight. The model made under
``strategy.scope()`` trains with ``tfgpu.fit`` on both replicas; the same model made with no strategy trains with
``model.fit`` on one device; histories and weights agree within 1e-4 (global batches split evenly, so the replicas'
averaged gradients are the one device's). Logical devices must be set before TensorFlow starts: the runs happen in
one subprocess, which prints its results as JSON."""

import numpy as np
import pytest

from tests.conftest import results_of_script

SCRIPT = r'''
import json, sys
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras
import numpy as np
import tfgpu
from tests.training.fit import helpers
from tests.training.fit.test_epochs import StopAfter
from tests.training.fit.test_inputs import binary_model
from tests.training.fit.test_steps import own_loss_model

model_dir = sys.argv[1]
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
x, y = helpers.digits(320)
xb, target = helpers.tabular(256, 30)
yb = (target > np.quantile(target, 0.75)).astype("float32")


def noisy_data(record):
    record["calls"] = calls = tf.Variable(0, dtype=tf.int64)

    def noisy(image, label):
        calls.assign_add(1)
        return image + tf.random.uniform(tf.shape(image), 0.0, 0.2), label

    return (tf.data.Dataset.from_tensor_slices((x, y)).map(noisy).batch(32),), dict(epochs=2, verbose=0)


def stopped(record):
    record["stop"] = StopAfter(10)
    return (x, y), dict(batch_size=16, epochs=2, shuffle=False, verbose=0, callbacks=[record["stop"]])


CASES = {
    "own_train_step": (own_loss_model, lambda r: ((x, y), dict(batch_size=32, epochs=2, shuffle=False, verbose=0,
                                                                validation_split=0.25))),
    "random_map": (helpers.classifier, noisy_data),
    "stop_training": (helpers.classifier, stopped),
    "class_weight": (binary_model, lambda r: ((xb, yb), dict(batch_size=32, epochs=2, shuffle=False, verbose=0,
                                                             class_weight={0: 1.0, 1: 3.0}))),
}


def mirrored(make):
    def made():
        with strategy.scope():
            return make()
    return made


results = {}
for name, (make, args) in CASES.items():
    one = helpers.keras_run(make, args)
    two = helpers.tfgpu_run(mirrored(make), args, f"{model_dir}/{name}")
    extra = {k: int(v.numpy()) for k, v in two.record.items() if isinstance(v, tf.Variable)}
    extra.update({k + "_one": int(v.numpy()) for k, v in one.record.items() if isinstance(v, tf.Variable)})
    results[name] = dict(
        replicas=two.model.distribute_strategy.num_replicas_in_sync,
        one=one.history.history, two=two.history.history, epochs=[one.history.epoch, two.history.epoch],
        iterations=[one.iterations, two.iterations],
        weights=float(max(np.abs(a - b).max() for a, b in zip(one.model.get_weights(), two.model.get_weights()))),
        **extra)
print("RESULTS " + json.dumps(results))
'''


@pytest.fixture(scope="module")
def mirrored_results(tmp_path_factory):
    return results_of_script(tmp_path_factory.mktemp("mirrored"), SCRIPT, "cases.py", timeout=600)


def assert_agree(result, tol=1e-4):
    assert result["replicas"] == 2
    assert result["two"].keys() == result["one"].keys()
    for key, values in result["one"].items():
        np.testing.assert_allclose(result["two"][key], values, rtol=tol, atol=tol, err_msg=key)
    assert result["epochs"][0] == result["epochs"][1]
    assert result["iterations"][0] == result["iterations"][1]
    assert result["weights"] < tol


@pytest.mark.slow  # the default set stays near a minute on 2 cores
class TestOnTwoReplicas:
    def test_a_subclassed_train_step_with_its_own_trackers(self, mirrored_results):
        result = mirrored_results["own_train_step"]
        assert_agree(result)
        assert set(result["two"]) == {"loss", "penalty", "acc", "val_loss", "val_penalty", "val_acc"}

    def test_a_random_map_is_drawn_again_each_epoch(self, mirrored_results):
        result = mirrored_results["random_map"]
        assert result["calls"] == result["calls_one"] == 2 * 320
        assert_agree(result)

    def test_stop_training_in_a_batch_hook(self, mirrored_results):
        result = mirrored_results["stop_training"]
        assert result["iterations"] == [11, 11] and result["epochs"] == [[0], [0]]
        assert_agree(result)

    def test_class_weight(self, mirrored_results):
        assert_agree(mirrored_results["class_weight"])
