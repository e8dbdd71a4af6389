"""Mixed precision and XLA: runs train, logits stay float32, the float16 loss scale adapts and never reaches 0,
the guard has no scale outside float16, XLA compiles.

Training runs in this process (``train_here``) but where XLA_FLAGS or logical CPU devices must be set before
TensorFlow starts."""
import os

import numpy as np
import pytest

from tests.conftest import read_history
from tfgpu.runtime import precision

SMALL = ["--dataset=digits", "--model=small_cnn", "--global_batch_size=32", "--eval_split=none", "--verbose=2",
         "--base_learning_rate=0.8", "--lr_schedule=constant"]


@pytest.mark.parametrize("precision", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_trains_with_float32_logits(precision, train_here, tmp_path):
    train_here(*SMALL, f"--precision={precision}", "--train_steps=40", "--steps_per_loop=10",
               f"--model_dir={tmp_path}")
    losses = [r["loss"] for r in read_history(tmp_path)]
    assert losses[-1] < 0.7 * losses[0], losses
    import keras

    model = keras.saving.load_model(tmp_path / "export" / "model.keras")
    assert model.layers[-2].compute_dtype == {"mixed_float16": "float16", "mixed_bfloat16": "bfloat16"}[precision]
    import numpy as np

    logits = model(np.zeros((2, 8, 8, 1), np.float32))
    assert str(logits.dtype) in ("float32", "<dtype: 'float32'>")


@pytest.fixture
def float16_task(tmp_path, data_cache):
    """The classification task under mixed_float16 (small_cnn, batch 16) and a function running n steps."""
    import keras
    import tensorflow as tf

    from tfgpu.training import experiment
    from tfgpu.config import Config

    config = Config(model_dir=str(tmp_path), dataset="digits", data_cache_dir=data_cache, model="small_cnn",
                    global_batch_size=16, train_steps=10, eval_split="none", tensorboard=False, verbose=0,
                    lr_schedule="constant", precision="mixed_float16", initial_loss_scale=2.0 ** 24,
                    loss_scale_growth_steps=5)
    built = experiment.setup(config)
    built.trainer.restore()
    task, strategy = built.task, built.placement.strategy
    labels = tf.constant(np.arange(16) % 10)

    @tf.function
    def run(images, n):
        skipped = tf.constant(0.0)
        for _ in tf.range(n):
            skipped += strategy.run(task.train_step, args=((images, labels),))["nonfinite_steps"]
        return skipped

    yield task, lambda images, n=1: float(run(tf.constant(images, tf.float32), tf.constant(n)))
    keras.backend.clear_session()
    keras.mixed_precision.set_global_policy("float32")


def test_float16_loss_scale_backs_off_grows_and_never_reaches_zero(float16_task):
    """A scale of 2^24 overflows float16 gradients: it halves on each skipped step, then doubles every
    --loss_scale_growth_steps finite steps. 200 poisoned steps take it down to 1, not to 0 (where Keras' own
    halving ends, after which gradients read 0/0), and change no weight; the next finite step trains."""
    task, run = float16_task
    images = np.random.default_rng(0).normal(size=(16, 8, 8, 1))
    scales, skipped = [], 0.0
    for _ in range(30):
        skipped += run(images)
        scales.append(float(precision.current_loss_scale(task.optimizer)))
    low = scales.index(min(scales))
    assert skipped >= 1 and min(scales) < 2.0 ** 24 and max(scales[low:]) > min(scales), scales
    weights = [v.numpy().copy() for v in task.model.variables]
    assert run(np.full((16, 8, 8, 1), np.nan), 200) == 200.0
    assert float(precision.current_loss_scale(task.optimizer)) == 1.0
    for var, value in zip(task.model.variables, weights):
        np.testing.assert_array_equal(var.numpy(), value, err_msg=var.path)
    assert run(images) == 0.0
    assert all(np.isfinite(v.numpy()).all() for v in task.model.variables)


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_without_float16_the_guard_has_no_scale_whatever_was_skipped(policy):
    """Outside float16 the guard neither scales the loss nor divides gradients, and its scale reads exactly 1
    after 300 skipped steps; updates equal the bare optimizer's."""
    import keras
    import tensorflow as tf

    from tfgpu.config import Config

    guarded, bare = tf.Variable([1.0, 2.0]), tf.Variable([1.0, 2.0])
    optimizer = precision.wrap_optimizer(keras.optimizers.SGD(0.1, momentum=0.9),
                                         Config(model_dir="unused", dataset="digits", precision=policy))
    reference = keras.optimizers.SGD(0.1, momentum=0.9)

    @tf.function
    def steps(n, bad):
        for _ in tf.range(n):
            loss = precision.scale_loss(optimizer, tf.where(bad, np.nan, 3.0))
            precision.apply_if_finite(optimizer, loss, [tf.fill([2], loss)], [guarded])

    steps(tf.constant(300), tf.constant(True))
    assert float(precision.current_loss_scale(optimizer)) == 1.0 and int(optimizer.iterations.numpy()) == 0
    steps(tf.constant(2), tf.constant(False))
    for _ in range(2):
        reference.apply([tf.constant([3.0, 3.0])], [bare])
    np.testing.assert_array_equal(guarded.numpy(), bare.numpy())


def test_jit_compile_takes_effect(run_train, tmp_path):
    """With --jit_compile XLA really compiles the replica step (it dumps the HLO modules it builds)."""
    dump = tmp_path / "xla"
    run_train(*SMALL, "--jit_compile", "--train_steps=2", "--steps_per_loop=2", f"--model_dir={tmp_path / 'run'}",
              env={"XLA_FLAGS": f"--xla_dump_to={dump}"})
    modules = [f for f in os.listdir(dump) if "gradients" in f and f.endswith(".txt")]
    assert modules, sorted(os.listdir(dump))[:20]


def test_jit_compile_is_turned_off_with_a_warning_on_logical_cpus(run_train, tmp_path):
    proc = run_train(*SMALL, "--jit_compile", "--cpu_logical_devices=2", "--train_steps=2", "--steps_per_loop=2",
                     f"--model_dir={tmp_path}")
    assert "--jit_compile is off for this run" in proc.output
