"""tasks/gan/model: the GAN as a keras.Model whose train_step trains both networks. ``model.fit`` and ``tfgpu.fit``
train it bit for bit alike on one device; skipped steps are counted; bad input is refused by name. With -m slow:
heavier GANs bit for bit, 2 logical CPU replicas training it to the one device's weights, and a ``tfgpu.fit`` stopped
part way and resumed ending where the uninterrupted run ends (EMA, optimizers and step counter in its checkpoint).
The flag command's GAN (``task.GanTask``, which runs the same ``step_shares``) is tested in test_task.py."""
import keras
import numpy as np
import pytest
import tensorflow as tf

import tfgpu
from tests.conftest import results_of_script
from tests.training.fit import helpers
from tfgpu.models.gan.dcgan import dcgan, wgan_gp
from tfgpu.tasks.gan.model import GAN

BUILDERS = {"dcgan": dcgan, "wgan_gp": wgan_gp}


def make_gan(builder="dcgan", sync_batch_norm=False, **options):
    """A small seeded GAN on 8x8 images (generator width 8, latent 8), compiled with its default optimizers."""
    keras.utils.set_random_seed(0)
    nets = BUILDERS[builder]((8, 8, 1), 10, latent_dim=8, conditional=options.get("conditional", False), width=8,
                             sync_batch_norm=sync_batch_norm)
    gan = GAN(nets.generator, nets.discriminator, **{"ema_decay": 0.9, "seed": 1, "num_classes": 10, **options})
    gan.compile()
    return gan


def digits(n=32):
    """sklearn's 8x8 digits as uint8 images (0..255, as tfgpu's records hold them) and their labels."""
    x, y = helpers.digits(n)
    return np.clip(np.round(x * 255), 0, 255).astype("uint8").reshape(-1, 8, 8, 1), y


def state(gan) -> list:
    """Every variable a GAN trains or carries: both networks, the EMA, both optimizers, the step counter."""
    variables = (gan.generator.weights + gan.discriminator.weights + list(gan.state.ema) + gan.g_optimizer.variables
                 + gan.d_optimizer.variables + [gan.step_counter])
    return [np.asarray(v.numpy()).copy() for v in variables]


def assert_same_state(a, b):
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b)):
        np.testing.assert_array_equal(x, y, err_msg=f"variable {i}")


CASES = {
    "dcgan": {},
    "dcgan_diffaugment_two_critic_updates": dict(n_critic=2, diffaugment="color,translation"),
    "conditional_wgan_gp": dict(builder="wgan_gp", gan_loss="wasserstein", gradient_penalty=10.0, conditional=True),
}


# The plain DCGAN by default; DiffAugment with two critic updates a step and the conditional WGAN-GP (each a heavier
# step to trace twice: 56 s and 77 s at load 5) with -m slow.
@pytest.mark.parametrize("case", ["dcgan"] + [pytest.param(case, marks=pytest.mark.slow) for case in
                                             ("dcgan_diffaugment_two_critic_updates", "conditional_wgan_gp")])
def test_model_fit_and_tfgpu_fit_train_the_gan_bit_for_bit_alike(case, tmp_path):
    x, y = digits()
    data = (x, y) if CASES[case].get("conditional") else (x,)
    keras_gan, tfgpu_gan = make_gan(**CASES[case]), make_gan(**CASES[case])
    untrained = state(keras_gan)
    expected = keras_gan.fit(*data, batch_size=16, epochs=2, shuffle=False, verbose=0)
    got = tfgpu.fit(tfgpu_gan, *data, batch_size=16, epochs=2, shuffle=False, verbose=0,
                    model_dir=str(tmp_path / "run"))
    assert got.history == expected.history
    assert_same_state(state(keras_gan), state(tfgpu_gan))
    assert int(tfgpu_gan.step_counter.numpy()) == 4  # 32 images / 16 a step x 2 epochs
    assert int(tfgpu_gan.d_optimizer.iterations.numpy()) == 4 * tfgpu_gan.n_critic
    names = {"d_loss", "g_loss", "d_real", "d_fake", "nonfinite_steps"} | (
        {"gradient_penalty"} if tfgpu_gan.gradient_penalty else set())
    assert set(got.history) == names and got.history["nonfinite_steps"] == [0.0, 0.0]
    assert all(np.isfinite(got.history[name]).all() for name in names)
    assert any(not np.array_equal(a, b) for a, b in zip(untrained, state(tfgpu_gan)))
    sampled = tfgpu_gan.generate(4).numpy()
    assert sampled.shape == (4, 8, 8, 1) and np.all(np.abs(sampled) <= 1.0)  # tanh images, from the EMA weights
    assert not np.array_equal(sampled, tfgpu_gan.generate(4, ema=False).numpy())


def test_a_skipped_update_is_counted_and_leaves_every_weight_finite():
    """A NaN image makes the critic's update of that step non-finite: it is skipped (on the logs'
    ``nonfinite_steps``, summed over the epoch) and every variable stays finite."""
    x, _ = digits()
    x = x.astype("float32") / 127.5 - 1.0
    x[0, 0, 0, 0] = np.nan
    gan = make_gan()
    history = gan.fit(x, batch_size=16, epochs=1, shuffle=False, verbose=0)
    assert history.history["nonfinite_steps"] == [1.0]
    assert all(np.isfinite(v).all() for v in state(gan))


@pytest.mark.slow  # three GAN fits: 101 s at load 5
def test_a_stopped_tfgpu_fit_resumes_to_the_uninterrupted_gan(tmp_path):
    """Stopped by SIGTERM after step 2 of 4 and run again on the same model_dir, the GAN ends bit for bit where the
    uninterrupted run ends: its checkpoint carries the EMA, both optimizers and the step counter."""
    x, _ = digits()
    options = dict(n_critic=2, diffaugment="translation,cutout")
    whole = make_gan(**options)
    tfgpu.fit(whole, x, batch_size=16, epochs=2, verbose=0, model_dir=str(tmp_path / "whole"), seed=5)
    with pytest.raises(tfgpu.Preempted):
        tfgpu.fit(make_gan(**options), x, batch_size=16, epochs=2, verbose=0, model_dir=str(tmp_path / "split"),
                  seed=5, steps_per_loop=1, callbacks=[helpers.sigterm_at("0:1")])
    resumed = make_gan(**options)
    tfgpu.fit(resumed, x, batch_size=16, epochs=2, verbose=0, model_dir=str(tmp_path / "split"), seed=5)
    assert int(resumed.step_counter.numpy()) == 4
    assert_same_state(state(whole), state(resumed))


@pytest.mark.slow  # the converter, then two GAN fits: a conditional GAN on tfgpu's records
def test_a_conditional_gan_trains_on_tfgpus_records_as_on_the_images_rescaled(tmp_path):
    """``tfgpu.data.load``'s batches (uint8 images, labels, as converted) train a conditional GAN under ``tfgpu.fit``
    as ``model.fit`` trains it on the same batches rescaled to [-1, 1] by the script, every variable within float32
    rounding: the GAN rescales uint8 images itself."""
    from tfgpu.data.conversion import convert

    directory = str(tmp_path / "digits")
    convert.convert(convert.Options(source="digits", output_dir=directory, num_shards="2"))
    options = dict(conditional=True, n_critic=2)
    rescaled = tfgpu.data.load(directory, "val", batch_size=32, shuffle=False).map(
        lambda images, labels: (tf.cast(images, tf.float32) / 127.5 - 1.0, labels))
    by_keras = make_gan(**options)
    by_keras.fit(rescaled, epochs=1, steps_per_epoch=3, verbose=0)
    by_tfgpu = make_gan(**options)
    tfgpu.fit(by_tfgpu, tfgpu.data.load(directory, "val", batch_size=32, shuffle=False), epochs=1, steps_per_epoch=3,
              verbose=0, model_dir=str(tmp_path / "run"))
    assert int(by_tfgpu.step_counter.numpy()) == 3
    worst = max(float(np.max(np.abs(a.astype("float64") - b)) / (np.max(np.abs(a)) + 1e-30)) if a.size else 0.0
                for a, b in zip(state(by_keras), state(by_tfgpu)))
    assert worst <= 1e-5  # measured 8e-7 (the rescale runs in the Dataset's map for one, in the step for the other); unscaled images: O(1)


def test_bad_input_is_refused_by_name():
    with pytest.raises(ValueError, match="gan_loss 'wgan'"):
        make_gan(gan_loss="wgan")
    with pytest.raises(ValueError, match="num_classes"):
        make_gan(conditional=True, num_classes=1)
    with pytest.raises(ValueError, match="n_critic"):
        make_gan(n_critic=0)
    with pytest.raises(ValueError, match="no optimizer=.*g_optimizer="):
        make_gan().compile(optimizer="adam")
    with pytest.raises(ValueError, match="LossScaleOptimizer"):
        make_gan().compile(g_optimizer=keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam()))
    x, _ = digits(16)
    with pytest.raises(ValueError, match=r"conditional GAN trains on \(images, labels\)"):
        make_gan(conditional=True).fit(x, batch_size=16, verbose=0)


MIRRORED = r'''
import json, sys
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import numpy as np
import tfgpu
from tests.tasks.gan.test_model import digits, make_gan, state

options = dict(sync_batch_norm=True, n_critic=2, diffaugment="color,translation,cutout")
x, _ = digits()
one = make_gan(**options)
one.fit(x, batch_size=16, epochs=2, shuffle=False, verbose=0)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    two = make_gan(**options)
history = tfgpu.fit(two, x, batch_size=16, epochs=2, shuffle=False, verbose=0, model_dir=sys.argv[1])
one_state, two_state = state(one), state(two)
print("RESULTS " + json.dumps(dict(
    replicas=two.distribute_strategy.num_replicas_in_sync, steps=int(two.step_counter.numpy()),
    history=history.history, one=one.history.history,
    differences=[float(np.max(np.abs(a.astype("float64") - b))) if a.size else 0.0
                 for a, b in zip(one_state, two_state)],
    scales=[float(np.max(np.abs(a))) if a.size else 0.0 for a in one_state])))
'''


@pytest.mark.slow  # two GAN fits and a fresh TensorFlow in a subprocess
def test_two_replicas_train_the_gan_to_the_one_device_weights(tmp_path):
    """DCGAN with synchronized BatchNorm, 2 critic updates a step and DiffAugment: each replica's rows of the global
    batch's latents and augmentations, so ``tfgpu.fit`` on 2 logical CPU replicas trains every variable (weights,
    EMA, Adam moments, BN statistics) to ``model.fit``'s on one device up to float32 summation order."""
    result = results_of_script(tmp_path, MIRRORED, "mirrored_gan.py", timeout=600)
    assert result["replicas"] == 2 and result["steps"] == 4
    for key, values in result["one"].items():
        np.testing.assert_allclose(result["history"][key], values, rtol=1e-4, atol=1e-5, err_msg=key)
    for i, (difference, scale) in enumerate(zip(result["differences"], result["scales"])):
        assert difference <= 1e-4 * scale + 1e-5, (i, difference, scale)
