"""runtime/keras_variables: a Keras metric's state made under a MirroredStrategy reads as a Python number (float and
int), as on one device; without the change the same line raises TypeError. Logical devices must be set before
TensorFlow starts, so the check runs in a process of its own (forked by tests/logical_cpus.py)."""
from tests import logical_cpus

SCRIPT = r'''
import json
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras
from tfgpu.runtime import keras_variables

strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    total = keras.metrics.Sum()
strategy.run(lambda: total.update_state(3.0))  # each replica adds 3: the sum read over replicas is 6
state = total.variables[0]
result = {"kind": type(state.value).__name__}
try:
    float(state)
    result["before"] = "converted"
except TypeError as e:
    result["before"] = "TypeError"
keras_variables.read_as_numbers()
keras_variables.read_as_numbers()  # idempotent
result.update(as_float=float(total.result()), as_int=int(state), one_device=float(keras.Variable(2.5)))
print("RESULT " + json.dumps(result))
'''


def test_a_metric_made_under_a_strategy_reads_as_a_number(tmp_path_factory):
    result = logical_cpus.results(tmp_path_factory, __name__)
    assert result["kind"] == "SyncOnReadVariable" and result["before"] == "TypeError"
    assert (result["as_float"], result["as_int"], result["one_device"]) == (6.0, 6, 2.5)
