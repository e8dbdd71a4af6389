"""The log line of a BatchNormalization that normalizes fewer than 16 examples a replica: on a 2-replica
MirroredStrategy over two logical CPUs (in the subprocess of tests/logical_cpus.py: logical devices are set before
TensorFlow starts), once,
naming the layers, the replica's batch and ``synchronized=True``; never on one replica or at 16 a replica."""

import numpy as np
import pytest

from tests import logical_cpus
from tfgpu.training.fit import batch_norm


SCRIPT = r'''
import json, logging, sys
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras
import numpy as np
import tfgpu

lines = []
class Keep(logging.Handler):
    def emit(self, record):
        lines.append(record.getMessage())
logging.getLogger("tfgpu").addHandler(Keep())
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
x = np.random.default_rng(0).normal(size=(64, 8)).astype("float32")
y = (x[:, 0] > 0).astype("int64")


def model():
    with strategy.scope():
        frozen = keras.layers.BatchNormalization(name="frozen_bn")
        frozen.trainable = False
        m = keras.Sequential([keras.Input((8,)), keras.layers.BatchNormalization(name="bn_a"), keras.layers.Dense(8),
                              keras.layers.BatchNormalization(name="bn_b"), frozen,
                              keras.layers.BatchNormalization(name="bn_sync", synchronized=True),
                              keras.layers.Dense(2)])
        m.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return m


def said(run):
    before = len(lines)
    run()
    return [line for line in lines[before:] if "BatchNormalization" in line]


first = model()
results = {
    "arrays_16": said(lambda: tfgpu.fit(first, x, y, batch_size=16, verbose=0, model_dir=sys.argv[1] + "/a")),
    "again": said(lambda: tfgpu.fit(first, x, y, batch_size=16, verbose=0, model_dir=sys.argv[1] + "/b")),
    "arrays_32": said(lambda: tfgpu.fit(model(), x, y, batch_size=32, verbose=0, model_dir=sys.argv[1] + "/c")),
    "dataset_12": said(lambda: tfgpu.fit(model(), tf.data.Dataset.from_tensor_slices((x, y)).batch(12), verbose=0,
                                         model_dir=sys.argv[1] + "/d")),
}
print("RESULTS " + json.dumps(results))
'''


@pytest.fixture(scope="module")
def said(tmp_path_factory):
    return logical_cpus.results(tmp_path_factory, __name__)


def test_eight_examples_a_replica_are_said_once_with_the_layers_and_synchronized(said):
    assert len(said["arrays_16"]) == 1
    line = said["arrays_16"][0]
    assert "each replica's 8 examples (global batch 16 over 2 replicas)" in line
    assert "2 layers (bn_a, bn_b)" in line and "synchronized=True" in line
    assert "frozen_bn" not in line and "bn_sync" not in line
    assert said["again"] == []


def test_sixteen_a_replica_is_not_said(said):
    assert said["arrays_32"] == []


def test_a_datasets_batch_is_read_from_its_pipeline(said):
    assert len(said["dataset_12"]) == 1 and "each replica's 6 examples (global batch 12 over 2" in said["dataset_12"][0]


class _Placement:
    def __init__(self, replicas):
        self.num_replicas = replicas


def test_one_replica_says_nothing_and_unknown_batches_are_not_guessed(caplog):
    import keras
    import tensorflow as tf

    from tfgpu.training.fit import inputs

    model = keras.Sequential([keras.Input((4,)), keras.layers.BatchNormalization(), keras.layers.Dense(2)])
    arrays = inputs.make(tf.zeros([40, 4]).numpy(), tf.zeros([40]).numpy(), batch_size=8)
    with caplog.at_level("WARNING", logger="tfgpu"):
        batch_norm.note_small_batches(model, _Placement(1), arrays)
    assert not [r for r in caplog.records if "BatchNormalization" in r.getMessage()]
    pipeline = tf.data.Dataset.from_tensor_slices(tf.zeros([40, 4]))
    assert batch_norm.global_batch(inputs.make(pipeline.batch(10).map(lambda v: (v, v[:, 0])))) == 10
    assert batch_norm.global_batch(inputs.make(pipeline.batch(10, drop_remainder=True).map(lambda v: (v, v)))) == 10
    unknown = tf.data.Dataset.from_generator(  # batches the script made itself: no batch op to read
        lambda: ((np.zeros([n, 4], "float32"), np.zeros([n], "float32")) for n in (3, 5)),
        output_signature=(tf.TensorSpec([None, 4]), tf.TensorSpec([None])))
    assert batch_norm.global_batch(inputs.make(unknown)) is None
