"""tfgpu.training.replica_local through tfgpu.fit: BatchNormalization's moving statistics, which Keras 3 keeps per
replica, are the one device's (given the same weights) after a 2-replica MirroredStrategy run (both replicas' copies bit-identical), and
``steps_per_loop`` does not change them (an average of moving averages is taken once per call). Logical devices must
be set before TensorFlow starts: the runs happen in tests/logical_cpus.py's subprocess (three logical CPUs), which
prints the results as JSON."""

import numpy as np
import pytest

from tests import logical_cpus

SCRIPT = r'''
import json, sys
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 3)
import keras
import numpy as np
import tfgpu
from tests.training.fit import helpers
from tfgpu.training import replica_local

x, y = helpers.digits(256)
x = x * 3.0 + 1.0  # statistics far from BatchNormalization's initial (0, 1)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


def make():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(16), keras.layers.BatchNormalization(momentum=0.8),
                              keras.layers.Activation("relu"), keras.layers.Dense(10, activation="softmax")])
    # Learning rate 0: the layers before BatchNormalization stay put, so the statistics depend on the data alone
    # (with training, per-replica normalization moves the two runs' weights apart, as in Keras).
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="sparse_categorical_crossentropy")
    return model


def moving(model):
    layer = model.layers[1]
    return [layer.moving_mean, layer.moving_variance]


one = make()
one.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
results = {"one": [v.numpy().tolist() for v in moving(one)]}
for steps_per_loop in (1, 5):
    with strategy.scope():
        two = make()
    tfgpu.fit(two, x, y, batch_size=32, epochs=2, shuffle=False, verbose=0, steps_per_loop=steps_per_loop,
              model_dir=f"{sys.argv[1]}/{steps_per_loop}")
    results[f"replicas_{steps_per_loop}"] = [[r.numpy().tolist() for r in strategy.experimental_local_results(v.value)]
                                             for v in moving(two)]

three = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1", "/cpu:2"],  # its own reduction: no collective group
                                       cross_device_ops=tf.distribute.ReductionToOneDevice())
with three.scope():
    equal = keras.Variable(np.random.RandomState(0).uniform(-3, 3, 1000).astype("float32"), trainable=False)
before = equal.numpy().tobytes()
average = tf.function(lambda: replica_local.average_over_replicas(three, [equal]))
for _ in range(20):
    average()
results["equal_copies_unchanged"] = all(r.numpy().tobytes() == before
                                        for r in three.experimental_local_results(equal.value))
naive = tf.reduce_mean(tf.stack([equal.value] * 3), axis=0).numpy().tobytes()
results["naive_mean_would_change_them"] = naive != before
print("RESULTS " + json.dumps(results))
'''


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return logical_cpus.results(tmp_path_factory, __name__)


def test_copies_already_equal_stay_bit_identical(results):
    """Averaging three equal copies twenty times changes no bit (where a plain mean of three does)."""
    assert results["naive_mean_would_change_them"]
    assert results["equal_copies_unchanged"]


@pytest.mark.parametrize("steps_per_loop", [1, 5])
def test_batch_norm_statistics_are_one_model_and_the_one_devices(results, steps_per_loop):
    for name, one_device, replicas in zip(("moving_mean", "moving_variance"), results["one"],
                                          results[f"replicas_{steps_per_loop}"]):
        first, second = replicas
        assert first == second, f"{name}: the two replicas hold different copies"
        # The mean is exactly linear in the replicas' batch means; the variance misses the spread between the two
        # half-batches' means, as tf.keras' sync-on-read mean did.
        tolerance = 1e-4 if name == "moving_mean" else 0.05
        np.testing.assert_allclose(first, one_device, rtol=tolerance, atol=tolerance, err_msg=name)
