"""The GAN task: NaN guard, loss scales, evaluation (FID/KID, samples), mirrored vs one device, exact resume,
sampling, and the quickstart (slow)."""
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.conftest import REPO, checkpoint_weights, read_history, read_metrics
from tfgpu import config_sources
from tfgpu.runtime import precision
from tfgpu.config import ConfigError
from tfgpu.data import catalog
from tfgpu.data.input import pipeline
from tfgpu.runtime.distribute import Placement
from tfgpu.tasks.gan import model as gan_model
from tfgpu.tasks.registry import input_config
from tfgpu.tasks.gan.task import GanTask
from tfgpu.training.loop import step_counter

SMALL = ["--task=gan", "--dataset=digits", "--global_batch_size=16", "--latent_dim=16", "--eval_split=none",
         "--verbose=2", "--steps_per_loop=2"]


# -- in-process: one device, the task driven directly ------------------------------------
@pytest.fixture
def make_task(tmp_path, data_cache):
    tasks = []

    def make(**overrides):
        values = dict(task="gan", model="dcgan", dataset="digits", model_dir=str(tmp_path / "run"),
                      data_cache_dir=data_cache, global_batch_size=8, latent_dim=8, seed=3)
        values.update(overrides)
        config = config_sources.build(**values).check_values()
        info = catalog.prepare(config)
        strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
        placement = Placement(strategy, "one_device", 1, 1, 0, True, ("/cpu:0",), False)
        keras.backend.clear_session(free_memory=False)
        keras.utils.set_random_seed(config.seed)
        precision.set_policy(config.precision)
        task = GanTask(config, info, placement, 10, step_counter(strategy))
        with strategy.scope():
            task.build()
        step = tf.function(lambda batch: strategy.run(task.train_step, args=(batch,)))
        tasks.append(task)
        return task, step

    yield make
    keras.mixed_precision.set_global_policy("float32")


def _batch(n=8, seed=0):
    rng = np.random.default_rng(seed)
    return (tf.constant(rng.uniform(-1, 1, (n, 8, 8, 1)), tf.float32), tf.constant(rng.integers(0, 10, n)))


def _step_batches(task, seed=0):
    """What the trainer hands one train step: a real batch per critic update."""
    batches = tuple(_batch(seed=seed * 100 + k) for k in range(task.options.n_critic))
    return batches if len(batches) > 1 else batches[0]


def _values(variables):
    return [v.numpy().copy() for v in variables]


def _changed(before, variables):
    return any(not np.array_equal(b, v.numpy()) for b, v in zip(before, variables))


@pytest.mark.parametrize("precision_name", ["float32", "mixed_float16"])
def test_nan_guard_skips_a_poisoned_step_and_counts_it(make_task, precision_name):
    task, step = make_task(precision=precision_name)
    images, labels = _batch()
    d_before, g_before = _values(task.discriminator.weights), _values(task.generator.trainable_weights)
    d_scale = float(precision.current_loss_scale(task.d_optimizer))
    poisoned = step((tf.tensor_scatter_nd_update(images, [[0, 0, 0, 0]], [np.nan]), labels))
    assert float(poisoned["nonfinite_steps"]) == 1.0
    # The discriminator update (NaN real image) was skipped; its weights are untouched and still finite.
    trainable_d = [w for w in task.discriminator.weights if w.trainable]
    assert not _changed([b for b, w in zip(d_before, task.discriminator.weights) if w.trainable], trainable_d)
    # Float16 backs its scale off; without float16 the guard has no scale, which stays exactly 1.
    assert float(precision.current_loss_scale(task.d_optimizer)) == (d_scale / 2 if precision_name ==
                                                                      "mixed_float16" else 1.0)
    assert _changed(g_before, task.generator.trainable_weights)  # the generator step itself was fine
    clean = step((images, labels))
    assert float(clean["nonfinite_steps"]) == 0.0 and np.isfinite(float(clean["d_loss"]))
    assert _changed([b for b, w in zip(d_before, task.discriminator.weights) if w.trainable], trainable_d)
    assert all(np.isfinite(w.numpy()).all() for w in task.discriminator.weights + task.generator.weights)
    assert int(task.global_step.numpy()) == 0  # the train loop advances the run's one step counter, not the step


def test_a_checkpoint_holding_the_gan_s_own_step_copy_still_restores(make_task, tmp_path):
    """Checkpoints written while the GAN kept its own step counter (``gan_state/step``, equal to the run's) restore
    into today's task, which follows the run's one counter: weights, EMA and step come back; the copy is unread."""
    from tfgpu.training import checkpoint

    old, _ = make_task()
    rng = np.random.default_rng(1)
    for weight in old.generator.weights + old.state.ema:
        weight.assign(rng.normal(size=weight.shape).astype(weight.numpy().dtype))
    old.global_step.assign(6)
    legacy = tf.Module()  # GanState as those checkpoints hold it: its EMA and FID, and the step copy
    legacy.step, legacy.fid_initial, legacy.ema = tf.Variable(6, dtype=tf.int64), old.state.fid_initial, old.state.ema
    items = {**old.checkpoint_items(), "gan_state": legacy}
    path = tf.train.Checkpoint(step=old.global_step, **items).save(str(tmp_path / "old" / "ckpt"))
    assert "gan_state/step/.ATTRIBUTES/VARIABLE_VALUE" in dict(tf.train.list_variables(path))
    new, _ = make_task()
    checkpoint.restore(tf.train.Checkpoint(step=new.global_step, **new.checkpoint_items()), path, "checkpoint")
    assert int(new.global_step.numpy()) == 6
    for ours, theirs in zip(new.generator.weights + new.state.ema, old.generator.weights + old.state.ema):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


# bfloat16 (38 s loaded) with -m slow; float32 proves the same bit-identity by default.
@pytest.mark.parametrize("precision_name", ["float32", pytest.param("mixed_bfloat16", marks=pytest.mark.slow)])
def test_skipped_updates_leave_their_network_optimizer_and_ema_bit_identical(make_task, monkeypatch,
                                                                              precision_name):
    """However many updates were skipped before: a skipped generator update leaves the generator's trainable
    weights, its optimizer and the EMA bit-identical (its BatchNorm statistics move only in the critic's finite
    updates, which draw fakes in training mode); a skipped critic update leaves the discriminator (weights and
    statistics) and its optimizer bit-identical. The first finite step trains both networks again."""
    poison = tf.Variable(1.0)
    original = gan_model.generator_loss
    monkeypatch.setattr(gan_model, "generator_loss", lambda kind, logits: original(kind, logits) * poison)
    task, step = make_task(precision=precision_name, ema_decay=0.99)
    step(_batch(seed=0))  # trained once: the EMA and the optimizers' slots are no longer at their start
    g_vars = task.generator.trainable_weights + task.g_optimizer.variables + list(task.state.ema)
    d_vars = task.discriminator.weights + task.d_optimizer.variables
    g_before = _values(g_vars)
    poison.assign(np.nan)
    for i in range(1, 41):
        assert float(step(_batch(seed=i))["nonfinite_steps"]) == 1.0
    assert not _changed(g_before, g_vars)
    d_before = _values(d_vars)
    images, labels = _batch(seed=99)
    nan_images = tf.tensor_scatter_nd_update(images, [[0, 0, 0, 0]], [np.nan])
    for _ in range(40):
        assert float(step((nan_images, labels))["nonfinite_steps"]) == 1.0
    assert not _changed(d_before, d_vars) and not _changed(g_before, g_vars)
    assert all(np.isfinite(v).all() for v in _values(g_vars + d_vars))
    poison.assign(1.0)
    assert float(step(_batch(seed=100))["nonfinite_steps"]) == 0.0
    assert _changed(g_before, task.generator.trainable_weights) and _changed(d_before, d_vars)


def test_both_loss_scales_back_off_on_overflow_and_grow_again(make_task):
    """Float16 gradients overflow at a loss scale of 2^20: both optimizers skip and halve until they fit,
    then double after --loss_scale_growth_steps finite steps."""
    task, step = make_task(precision="mixed_float16", initial_loss_scale=2.0 ** 20, loss_scale_growth_steps=2)
    scales = {"g": [], "d": []}
    skipped = 0
    for i in range(10):
        skipped += float(step(_batch(seed=i))["nonfinite_steps"])
        scales["g"].append(float(precision.current_loss_scale(task.g_optimizer)))
        scales["d"].append(float(precision.current_loss_scale(task.d_optimizer)))
    assert skipped >= 1
    for name, values in scales.items():
        assert min(values) < 2.0 ** 20, (name, values)
        assert any(b > a for a, b in zip(values, values[1:])), (name, values)  # grew back at least once
    assert set(task.loss_scales()) == {"loss_scale_g", "loss_scale_d"}


@pytest.mark.parametrize("model,options", [
    pytest.param("wgan_gp", dict(gan_loss="wasserstein", gradient_penalty=10.0, n_critic=2, conditional=True),
                 marks=pytest.mark.slow),  # 17 s loaded; the gradient penalty's own tests stay in the default suite
    ("sngan", dict(gan_loss="hinge", r1_gamma=1.0, diffaugment="color,translation,cutout")),
])
def test_penalties_conditioning_and_diffaugment_train_finitely(make_task, model, options):
    task, step = make_task(model=model, **options)
    assert task.model_facts() == {"generator_output": "tanh"}  # the family's generator: images bounded to [-1, 1]
    out = [step(_step_batches(task, seed=i)) for i in range(3)]
    assert set(out[-1]) == set(task.train_metric_names)
    for metrics in out:
        assert all(np.isfinite(float(v)) for v in metrics.values())
        assert float(metrics["nonfinite_steps"]) == 0
    penalty = "gradient_penalty" if "gradient_penalty" in options else "r1_penalty"
    assert float(out[0][penalty]) > 0


# Slow: (26 s loaded); n_critic's batches per step stay covered by the pipeline's batches_per_step tests and the
# GAN guard tests.
@pytest.mark.slow
def test_each_critic_update_learns_from_its_own_real_batch(make_task):
    """With --n_critic=2 the second critic update sees the second real batch: feeding (A, B) and (A, A) from the
    same start ends with different critics, and the run reads two batches of the train split per step."""
    critics = []
    for second in (1, 0):
        task, step = make_task(model="wgan_gp", gan_loss="wasserstein", gradient_penalty=10.0, n_critic=2)
        assert input_config(task.config).batches_per_step == 2
        assert pipeline.steps_per_epoch(input_config(task.config), task.info) == task.info.num_train_examples / (2 * 8)
        step((_batch(seed=0), _batch(seed=second)))
        critics.append(_values(task.discriminator.trainable_weights))
    assert any(not np.allclose(a, b) for a, b in zip(*critics))


def test_latents_differ_between_replicas_but_follow_the_global_batch(make_task):
    task, _ = make_task()
    seed = tf.constant([1, 2], tf.int64)
    whole, _ = task.model.latents(seed, 0, 8, 8)
    first, _ = task.model.latents(seed, 0, 4, 8)
    second, _ = task.model.latents(seed, 4, 4, 8)
    np.testing.assert_array_equal(np.concatenate([first, second]), whole.numpy())
    assert not np.allclose(first.numpy(), second.numpy())


# Slow (22 s): FID/KID and the extractors are tested in-process in tests/tasks/gan/test_fid.py; the one-class and
# float32-extractor checks of GanTask's evaluation stay in the default suite.


def test_conditional_gradient_penalty_interpolates_within_one_class(make_task, monkeypatch):
    """Conditional WGAN-GP: the penalty scores each interpolate with its real image's label, so the fake it
    mixes in is generated with that label too (the reference code's recipe), not with a random one."""
    task, _ = make_task(model="wgan_gp", gan_loss="wasserstein", gradient_penalty=10.0, conditional=True)
    generated, penalized = [], []
    generate, gradient_norms = task.model.generate_with, task.model.input_gradient_norms

    def spy_generate(generator, z, labels, training):
        images = generate(generator, z, labels, training)
        generated.append((labels.numpy(), images.numpy()))
        return images

    def spy_norms(images, labels):
        penalized.append((images.numpy(), labels.numpy()))
        return gradient_norms(images, labels)

    monkeypatch.setattr(task.model, "generate_with", spy_generate)
    monkeypatch.setattr(task.model, "input_gradient_norms", spy_norms)
    real, labels = _batch()
    task.placement.strategy.run(task.model._discriminator_step,
                                args=(real, labels, tf.constant([1, 2], tf.int64), (0, 8, 8)))
    (fake_labels, fake), = generated
    mixed, mixed_labels = penalized[0]
    np.testing.assert_array_equal(mixed_labels, labels.numpy())
    np.testing.assert_array_equal(fake_labels, labels.numpy())
    # Every interpolate lies on the segment from its real image to the fake generated with the same label.
    real, fake, mixed = (x.reshape(len(x), -1) for x in (real.numpy(), fake, mixed))
    mix = np.sum((mixed - fake) * (real - fake), axis=1) / np.sum((real - fake) ** 2, axis=1)
    assert np.all((mix >= 0) & (mix <= 1))
    np.testing.assert_allclose(mix[:, None] * real + (1 - mix[:, None]) * fake, mixed, atol=1e-5)


def test_float16_gradient_penalty_loses_no_step_at_the_initial_loss_scale(make_task):
    """Under mixed_float16 the penalty's gradient of a gradient overflowed float16 at the initial scale 2^15:
    the first critic update was skipped and the scale halved. It is computed in float32 now."""
    task, step = make_task(precision="mixed_float16", gradient_penalty=10.0)
    assert task.config.initial_loss_scale == 2.0 ** 15
    assert float(step(_batch())["nonfinite_steps"]) == 0
    assert float(precision.current_loss_scale(task.d_optimizer)) == 2.0 ** 15


def test_bad_gan_options_name_their_flag(make_task, tmp_path):
    with pytest.raises(ConfigError, match="--model"):
        make_task(model="small_cnn")
    with pytest.raises(ConfigError, match="--inception_weights"):
        make_task(inception_weights=str(tmp_path / "missing.h5"))
    (tmp_path / "text.h5").write_text("not weights")
    with pytest.raises(ConfigError, match="--inception_weights.*not an HDF5"):  # at start, not at the first FID
        make_task(inception_weights=str(tmp_path / "text.h5"))
    with pytest.raises(ConfigError, match="--fid_feature_model_dir"):
        make_task(fid_feature_model_dir=str(tmp_path / "no-run"))
    with pytest.raises(ConfigError, match="--diffaugment"):
        make_task(diffaugment="color,rotate")
    with pytest.raises(ConfigError, match="--image_size"):
        make_task(image_size=7)


SIGMOID_GENERATOR = """
import keras
from keras import layers


def generator(image_shape, num_classes, latent_dim=128, **kwargs):
    latent = keras.Input((latent_dim,))
    pixels = layers.Dense(image_shape[0] * image_shape[1] * image_shape[2], activation="sigmoid", name="pixels")(latent)
    return keras.Model(latent, layers.Reshape(image_shape)(pixels))
"""


def test_a_users_generator_ending_in_sigmoid_stops_the_build_naming_the_flag(make_task, tmp_path):
    """A [0, 1] generator against [-1, 1] real images: before the check its samples could never match the data."""
    file = tmp_path / "sigmoid_generator.py"
    file.write_text(SIGMOID_GENERATOR)
    with pytest.raises(ConfigError) as error:
        make_task(generator=f"{file}:generator")
    assert str(error.value) == (f"--generator: {file}:generator's generator ends in sigmoid (layer 'pixels'), which "
                                "gives images in [0, 1]; the GAN's real images are in [-1, 1]: end the generator in "
                                "tanh")


# -- subprocess runs through python -m tfgpu.train ----------------------------------------------
def _weights(model_dir):
    weights = checkpoint_weights(model_dir)
    assert any("generator" in k for k in weights) and any("discriminator" in k for k in weights), sorted(weights)
    return weights


def _one_device_and_mirrored(run_train, tmp_path, args):
    common = SMALL + args + ["--deterministic", "--cpu_logical_devices=2"]
    run_train(*common, "--distribution_strategy=one_device", f"--model_dir={tmp_path / 'one'}")
    mirrored = run_train(*common, "--distribution_strategy=mirrored", f"--model_dir={tmp_path / 'two'}")
    assert "strategy=mirrored replicas=2" in mirrored.output
    one, two = read_history(tmp_path / "one"), read_history(tmp_path / "two")
    assert [r["step"] for r in one] == [r["step"] for r in two] == [2, 4]
    w1, w2 = _weights(tmp_path / "one"), _weights(tmp_path / "two")
    assert w1.keys() == w2.keys()
    return one, two, {k: v for k, v in w1.items() if v.dtype.kind == "f"}, w2


# Per-tensor tolerance on |mirrored - one device| / |one device| (Frobenius norms) for the hinge-loss SNGAN.
# While every logit sits inside the hinge's margin (all 12 updates of this run) the critic's loss gradient is
# exactly -1/B per real and +1/B per fake logit, so parameters that move every logit alike (the bias of a channel
# in LeakyReLU's linear part) have a gradient of exactly zero in exact arithmetic. Float32 computes rounding
# noise instead (multiples of 2^-29, different in each summation order) and Adam divides it by sqrt(v) + 1e-7:
# at the first update a 5.6e-9 gradient moved its bias by 3.5e-7 on one run and 0 on the other. Those updates
# feed back: by step 4 a discriminator Adam moment differs by 5% in one element, 0.8% in norm (weights 0.17%).
# Measured in one process on 2 logical CPUs: in float64 the two runs agree to 5e-12 after 4 steps (same data,
# latents, augmentations and all-reduce); in float32 with gradient components below 1e-6 x their tensor's
# largest zeroed on both runs they agree to 2e-6; DCGAN's non-saturating loss has no exact zeros and agrees to
# 1.3e-6 as it is. Injected faults move some tensor by 0.38 (replicas read the batches one slice late; the
# losses by 1e-3), 1.3 (every replica draws the first replica's latent rows) and 3.0 (gradients all-reduced
# twice too large; the losses by 2x). 0.05 is 6x the clean 0.008 and 7x below the nearest fault.
HINGE_STATE_RTOL = 0.05


@pytest.mark.slow
@pytest.mark.parametrize("model,state_rtol", [(["--model=sngan", "--gan_loss=hinge"], HINGE_STATE_RTOL),
                                              (["--model=dcgan"], None)])
def test_mirrored_float32_matches_one_device_exactly_up_to_summation_order(run_train, tmp_path, model, state_rtol):
    """SNGAN (spectral-norm state on each replica; the generator's BN synchronized) or DCGAN (BN in both
    networks, synchronized), DiffAugment and 2 critic steps per generator step, each on its own real batch, on 2
    logical CPU replicas: per-replica real rows, latents and augmentations are rows of the global batch's, so
    the losses and every variable (weights, Adam moments, EMA, BN statistics, power-iteration vectors) match one
    device to float32 summation order: elementwise for DCGAN; for the hinge loss, whose exactly-zero gradients
    Adam turns into updates of their rounding noise, per tensor in norm (HINGE_STATE_RTOL says why and how far
    a wrong batch slice, latent or all-reduce lands)."""
    one, two, w1, w2 = _one_device_and_mirrored(run_train, tmp_path, model + [
        "--diffaugment=color,translation,cutout", "--n_critic=2", "--train_steps=4", "--sync_batch_norm"])
    for key in ("d_loss", "g_loss", "d_real", "d_fake"):
        np.testing.assert_allclose([r[key] for r in two], [r[key] for r in one], rtol=1e-4, atol=1e-5, err_msg=key)
    assert any("sn_u" in k or "ema" in k for k in w1)
    all_one = checkpoint_weights(tmp_path / "one")
    for name in w2:
        if name not in w1:  # integer state: the step counters and optimizer iterations
            assert np.array_equal(w2[name], all_one[name]), name
        elif state_rtol is None:
            np.testing.assert_allclose(w2[name], w1[name], rtol=1e-4, atol=1e-5, err_msg=name)
        else:
            difference, size = np.linalg.norm(w2[name] - w1[name]), np.linalg.norm(w1[name])
            assert difference <= state_rtol * size + 1e-6, (name, difference / max(size, 1e-30))


# Slow (32 s): float16 GAN steps run in-process by default (loss scales, guard, penalty); mirrored GANs in
# float32 are compared with one device in the slow suite too.
@pytest.mark.slow
def test_mirrored_mixed_float16_matches_one_device(run_train, tmp_path):
    """DCGAN with mixed_float16 and synchronized BN on 2 logical CPU replicas vs one device.

    Tolerance: float16 activations summed in another order differ by ~1e-3 relative, so losses agree to
    1e-2 and the loss scales exactly. Adam normalizes each gradient component, so for components whose
    gradient is near zero that noise can flip the update's sign: a weight may then differ by at most
    2 x steps x lr (1.6e-3 here), and only a few do: at least 98% of all weight components together agree
    to 1e-4 + 1e-3 relative. How many components sit near a zero gradient, and so how many flip, depends
    on the CPU's float16 kernels: every tensor had 99.2% or more on an AVX-512 host, one CI host had 98.8%
    in a single tensor, so a per-tensor share is no fair test for tensors of a few hundred components."""
    one, two, w1, w2 = _one_device_and_mirrored(run_train, tmp_path, [
        "--model=dcgan", "--train_steps=4", "--precision=mixed_float16", "--sync_batch_norm"])
    for key in ("d_loss", "g_loss"):
        np.testing.assert_allclose([r[key] for r in two], [r[key] for r in one], atol=1e-2, err_msg=key)
    for key in ("loss_scale_g", "loss_scale_d"):
        assert [r[key] for r in two] == [r[key] for r in one]
    close = []
    for name in w1:
        if "inner_optimizer" in name:  # Adam moments carry the raw float16 gradient noise
            continue
        np.testing.assert_allclose(w2[name], w1[name], atol=2 * 4 * 2e-4, err_msg=name)
        close.append((np.abs(w2[name] - w1[name]) <= 1e-4 + 1e-3 * np.abs(w1[name])).ravel())
    assert np.concatenate(close).mean() >= 0.98, np.concatenate(close).mean()


# Slow (56 s): the trainer's resume is task-agnostic and stays in the default suite (test_trainer); the GAN's
# checkpointed state (EMA, step) is restored by the same Checkpointer.
@pytest.mark.slow
def test_resume_equals_uninterrupted_and_sample_renders_the_checkpoint(run_train, data_cache, tmp_path):
    common = SMALL + ["--model=sngan", "--gan_loss=hinge", "--diffaugment=translation,cutout", "--deterministic",
                      "--n_critic=2"]
    run_train(*common, "--train_steps=6", f"--model_dir={tmp_path / 'straight'}")
    run_train(*common, "--train_steps=2", f"--model_dir={tmp_path / 'split'}")
    second = run_train(*common, "--train_steps=6", f"--model_dir={tmp_path / 'split'}")
    assert "resuming at step 2" in second.output
    straight, split = _weights(tmp_path / "straight"), _weights(tmp_path / "split")
    assert straight.keys() == split.keys()
    for name in straight:
        np.testing.assert_array_equal(split[name], straight[name], err_msg=name)
    assert read_metrics(tmp_path / "split")["step"] == 6
    out = tmp_path / "grid.png"
    env = {**os.environ, "TFGPU_DATA_CACHE": data_cache, "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run([sys.executable, "-m", "tfgpu.sample", f"--model_dir={tmp_path / 'split'}", "--num=16",
                           f"--out={out}"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "from step 6 (EMA generator)" in proc.stdout
    from PIL import Image

    with Image.open(out) as picture:
        assert picture.size == (4 * 32 + 5 * 2,) * 2  # 4x4 grid of 8x8 digits enlarged to 32 px
    bad = subprocess.run([sys.executable, "-m", "tfgpu.sample", f"--model_dir={tmp_path / 'nothing'}"], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "--model_dir" in bad.stderr


@pytest.mark.slow
def test_quickstart_gan_fid_falls_five_fold(run_train, tmp_path):
    """The acceptance run: configs/quickstart_gan.flags on 2 CPU cores."""
    model_dir = tmp_path / "quickstart"
    run_train("--flagfile=configs/quickstart_gan.flags", f"--model_dir={model_dir}", timeout=900)
    metrics = read_metrics(model_dir)
    assert {"step", "fid", "fid_initial", "kid", "feature_extractor"} <= metrics.keys()
    assert metrics["fid"] * 5 <= metrics["fid_initial"], metrics
    assert os.listdir(model_dir / "samples")
    evals = read_history(model_dir, "eval")
    assert [e["step"] for e in evals] == [1000, 2000, 3000]


@pytest.mark.slow
def test_workers_wait_for_a_chief_evaluation_longer_than_the_collective_timeout(tmp_path, data_cache):
    """Two MultiWorkerMirrored workers, --collective_timeout_s=3: the chief's first FID evaluation (it trains
    the feature classifier first) takes longer than that, and the other worker waits for it in a collective
    without a timeout instead of timing out in the next training collective (exit 129, a requeue loop)."""
    from tests.test_multi_worker import _finish, _start_workers

    model_dir = tmp_path / "run"
    args = [a for a in SMALL if a != "--eval_split=none"] + [
        "--model=dcgan", "--train_steps=4", "--eval_every_steps=2", "--fid_num_samples=1438",
        "--collective_timeout_s=3", f"--model_dir={model_dir}"]
    procs = _start_workers(args, data_cache)
    outputs = _finish(procs, timeout=300)
    for proc, output in zip(procs, outputs):
        assert proc.returncode == 0, output[-3000:]
        assert "final: step=4" in output, output[-3000:]
    evals = read_history(model_dir, "eval")
    assert [e["step"] for e in evals] == [2, 4] and evals[0]["eval_time_s"] > 3
    assert read_metrics(model_dir)["num_workers"] == 2


def test_feature_model_flags_on_a_remote_file_system_pass_the_start_checks(make_task):
    """--fid_feature_model_dir on ram:// (any TensorFlow file system) is checked there, not on local disk (the
    check said 'does not exist' for a classifier that was there)."""
    from tfgpu.tasks.gan.fid import classifier_model_path

    remote = "ram://gan-start-check/classifier"
    tf.io.gfile.makedirs(remote + "/export")
    with tf.io.gfile.GFile(classifier_model_path(remote), "wb") as f:
        f.write(b"stand-in: only its presence is checked at start")
    try:
        task, _ = make_task(fid_feature_model_dir=remote)
        assert task.options.fid_feature_model_dir == remote
    finally:
        tf.io.gfile.rmtree("ram://gan-start-check")
