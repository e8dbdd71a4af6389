"""--allreduce_dtype: gradients cross the wire in bfloat16/float16 and the step guard stays exact.

tests/logical_cpus.py's subprocess (logical CPU devices must be set before TensorFlow starts) runs every case under a
MirroredStrategy of 2 replicas with SGD(learning_rate=1), so a weight after a step is minus the gradient sum the
optimizer applied.
"""
import pytest

from tests import logical_cpus

SCRIPT = r"""
import json, sys
import numpy as np
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras
from tfgpu.runtime import precision

strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
results = {}


def run(name, dtype, per_replica, steps=1, dynamic=False, clip_norm=0.0, initial_scale=1.0):
    with strategy.scope():
        w = keras.Variable(np.zeros(len(per_replica[0]), np.float32), name="w")
        inner = keras.optimizers.SGD(learning_rate=1.0)
        opt = precision.GuardedOptimizer(inner, initial_scale=initial_scale, dynamic=dynamic,
                                         allreduce_dtype=dtype)
        opt.build([w])
    grads = tf.constant(np.array(per_replica, np.float32))

    @tf.function
    def step():
        def replica():
            r = tf.distribute.get_replica_context().replica_id_in_sync_group
            finite, _ = precision.apply_if_finite(opt, tf.constant(0.0), [tf.gather(grads, r)], [w],
                                                  clip_norm=clip_norm, num_replicas=2)
            return finite
        return strategy.experimental_local_results(strategy.run(replica))[0]

    history = []
    for _ in range(steps):
        finite = bool(step().numpy())
        history.append({"finite": finite, "w": w.numpy().tolist(), "iterations": int(opt.iterations.numpy()),
                        "scale": float(opt.loss_scale.numpy())})
    results[name] = history


g = [[1 + 2 ** -9, 3.0, 1000.1, 1e-3], [1.0, -1.0, 0.3, 2e-3]]
for dtype in ("float32", "bfloat16", "float16"):
    run(f"sum_{dtype}", dtype, g)
    run(f"nan_{dtype}", dtype, [[1.0, 2.0, 3.0, 4.0], [1.0, float("nan"), 3.0, 4.0]], steps=2)
    run(f"clip_{dtype}", dtype, [[3.0, 0.0, 0.0, 0.0], [0.0, 4.0, 0.0, 0.0]], clip_norm=1.0)
run("overflow_float16", "float16", [[40000.0, 1.0], [40000.0, 1.0]], steps=4, dynamic=True, initial_scale=4.0)
run("overflow_float32", "float32", [[40000.0, 1.0], [40000.0, 1.0]], steps=1, dynamic=True, initial_scale=4.0)
wire = [tf.cast(tf.constant(r, tf.float32), tf.bfloat16) for r in g]
results["expected_bfloat16"] = (-tf.cast(wire[0] + wire[1], tf.float32)).numpy().tolist()
print("RESULTS " + json.dumps(results))
"""


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return logical_cpus.results(tmp_path_factory, __name__)


def test_bfloat16_gradients_are_summed_on_the_wire_in_bfloat16_once(results):
    exact = results["sum_float32"][0]["w"]
    assert exact == pytest.approx([-(1 + 2 ** -9 + 1.0), -2.0, -1000.4, -3e-3], rel=1e-6)
    bf16 = results["sum_bfloat16"][0]["w"]
    assert bf16 == results["expected_bfloat16"]  # each replica's gradient rounded to bfloat16, summed once
    assert bf16 != exact and bf16 == pytest.approx(exact, rel=1e-2)
    assert results["sum_float16"][0]["w"] == pytest.approx(exact, rel=1e-3)
    for dtype in ("float32", "bfloat16", "float16"):
        assert results[f"sum_{dtype}"][0]["iterations"] == 1


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_a_non_finite_gradient_on_one_replica_skips_the_step_leaving_every_variable_bit_identical(results, dtype):
    for step in results[f"nan_{dtype}"]:
        assert step == {"finite": False, "w": [0.0, 0.0, 0.0, 0.0], "iterations": 0, "scale": 1.0}


def test_a_float16_sum_that_overflows_is_skipped_everywhere_and_backs_the_scale_off(results):
    # 40000 + 40000 is finite in float32 (the local check passes) but inf in float16: every skip leaves the
    # weights and the optimizer's iterations as they were; the dynamic scale halves each time.
    skipped = results["overflow_float16"]
    assert [s["finite"] for s in skipped] == [False] * 4
    assert all(s["w"] == [0.0, 0.0] and s["iterations"] == 0 for s in skipped)
    assert [s["scale"] for s in skipped] == [2.0, 1.0, 1.0, 1.0]  # halved, down to the floor of 1
    assert results["overflow_float32"][0]["finite"] is True
    assert results["overflow_float32"][0]["w"] == [-20000.0, -0.5]  # the float32 sum, unscaled by 4


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_clipping_clips_the_summed_gradient_once(results, dtype):
    # [3, 0] + [0, 4] has norm 5: clipped to norm 1, SGD(1) moves w by -[0.6, 0.8], as with float32.
    assert results[f"clip_{dtype}"][0]["w"] == pytest.approx(results["clip_float32"][0]["w"], abs=2e-3)
    assert results["clip_float32"][0]["w"] == pytest.approx([-0.6, -0.8, 0.0, 0.0], abs=1e-6)
