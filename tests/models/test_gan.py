"""GAN model zoo: every registered GAN at several resolutions and channel counts, conditional or not,
under each dtype policy; spectral normalization; DiffAugment."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from tfgpu.tasks.gan import diffaugment
from tfgpu.models import get_spec, list_models
from tfgpu.models.gan import GanModels, stage_sizes
from tfgpu.models.gan.layers import SNConv2D, SNDense

GANS = ("dcgan", "sngan", "wgan_gp")


def _build(name, shape, conditional, policy="float32", latent_dim=16, width=16):
    keras.mixed_precision.set_global_policy(policy)
    return get_spec(name).builder(shape, 10, latent_dim=latent_dim, conditional=conditional, width=width)


def _inputs(batch, latent_dim, conditional):
    z = tf.random.stateless_normal((batch, latent_dim), [1, 2])
    y = tf.constant(np.arange(batch) % 10, tf.int32)
    return ([z, y] if conditional else z), y


def test_registry_lists_the_gan_family():
    assert set(GANS) <= set(list_models(family="gan"))
    assert not set(GANS) & set(list_models(family="classifier"))
    assert all(get_spec(n).family == "gan" for n in GANS)


def _shape_cases():
    """Every family at every shape; by default each shape once unconditional and once conditional (over the
    families in turn), the other combinations with -m slow (each builds two networks, ~5 s on 2 loaded cores)."""
    shapes = [(8, 8, 1), (28, 28, 1), (32, 32, 3), (64, 64, 3)]
    for i, shape in enumerate(shapes):
        for j, name in enumerate(GANS):
            for conditional in (False, True):
                default = j == (i + conditional) % len(GANS)
                yield pytest.param(name, shape, conditional, marks=() if default else pytest.mark.slow)


@pytest.mark.parametrize("name,shape,conditional", list(_shape_cases()))
def test_generator_and_discriminator_shapes_and_ranges(name, shape, conditional):
    models = _build(name, shape, conditional)
    assert isinstance(models, GanModels)
    z, y = _inputs(3, 16, conditional)
    images = models.generator(z, training=False)
    assert images.shape == (3, *shape) and images.dtype == tf.float32
    assert float(tf.reduce_max(tf.abs(images))) <= 1.0
    logits = models.discriminator([images, y] if conditional else images, training=False)
    assert logits.shape == (3, 1) and logits.dtype == tf.float32


@pytest.mark.parametrize("name", GANS)
@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_outputs_stay_float32_under_mixed_policies_and_gradients_flow(name, policy):
    models = _build(name, (16, 16, 3), True, policy)
    z, y = _inputs(4, 16, True)
    with tf.GradientTape() as tape:
        images = models.generator(z, training=True)
        logits = models.discriminator([images, y], training=True)
        loss = tf.reduce_mean(logits)
    assert images.dtype == tf.float32 and logits.dtype == tf.float32
    grads = tape.gradient(loss, models.generator.trainable_variables + models.discriminator.trainable_variables)
    assert all(g is not None and bool(tf.reduce_all(tf.math.is_finite(tf.cast(g, tf.float32)))) for g in grads)
    compute = {"mixed_float16": "float16", "mixed_bfloat16": "bfloat16"}[policy]
    assert any(layer.compute_dtype == compute for layer in models.discriminator.layers)


def test_128px_builds_with_the_expected_plan():
    assert stage_sizes((128, 128, 3)) == [4, 8, 16, 32, 64, 128]
    assert stage_sizes((28, 28, 1)) == [7, 14, 28]
    models = _build("dcgan", (128, 128, 3), False, width=8)
    assert models.generator.output_shape == (None, 128, 128, 3)


def test_unsupported_image_sizes_are_clear_errors():
    with pytest.raises(ValueError, match="square"):
        stage_sizes((32, 16, 3))
    with pytest.raises(ValueError, match="--image_size"):
        stage_sizes((7, 7, 1))


def test_wgan_critic_has_no_batch_norm_and_sngan_discriminator_is_spectral():
    wgan = _build("wgan_gp", (32, 32, 3), False)
    assert not any(isinstance(l, keras.layers.BatchNormalization) for l in wgan.discriminator.layers)
    sngan = _build("sngan", (32, 32, 3), False)
    kinds = {type(l) for l in sngan.discriminator.layers}
    assert SNConv2D in kinds and SNDense in kinds and keras.layers.BatchNormalization not in kinds


def test_spectral_norm_divides_by_the_largest_singular_value():
    layer = SNDense(6, power_iterations=1)
    x = tf.random.stateless_normal((2, 5), [0, 1])
    layer(x)
    for _ in range(30):  # each training call runs one more power iteration
        layer(x, training=True)
    w = layer.kernel.numpy()
    sigma = np.linalg.svd(w, compute_uv=False)[0]
    normalized = layer.normalized_kernel(training=False).numpy()
    np.testing.assert_allclose(normalized, w / sigma, rtol=1e-4)
    assert np.linalg.svd(normalized, compute_uv=False)[0] == pytest.approx(1.0, rel=1e-4)


def test_spectral_norm_updates_u_only_in_training_and_differentiates_through_sigma():
    layer = SNConv2D(4, 3)
    x = tf.random.stateless_normal((2, 6, 6, 3), [0, 2])
    layer(x)
    u0 = layer.u.numpy().copy()
    layer(x, training=False)
    np.testing.assert_array_equal(layer.u.numpy(), u0)
    with tf.GradientTape() as tape:
        y = tf.reduce_sum(layer(x, training=True))
    assert not np.array_equal(layer.u.numpy(), u0)
    grad = tape.gradient(y, layer.kernel)
    # Scaling W does not change W/sigma(W): the gradient is orthogonal to W.
    assert abs(float(tf.reduce_sum(grad * layer.kernel))) < 1e-3 * float(tf.norm(grad)) * float(tf.norm(layer.kernel))


def test_spectral_layers_serialize():
    models = _build("sngan", (16, 16, 1), True)
    clone = keras.Model.from_config(models.discriminator.get_config())
    assert [type(l) for l in clone.layers] == [type(l) for l in models.discriminator.layers]


# -- DiffAugment -------------------------------------------------------------------
def test_diffaugment_is_seeded_differentiable_and_preserves_shape():
    x = tf.random.stateless_uniform((4, 16, 16, 3), [3, 4], minval=-1, maxval=1)
    policy = "color,translation,cutout"
    a = diffaugment.diff_augment(x, policy, tf.constant([1, 2]))
    b = diffaugment.diff_augment(x, policy, tf.constant([1, 2]))
    c = diffaugment.diff_augment(x, policy, tf.constant([1, 3]))
    assert a.shape == x.shape
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert not np.allclose(a.numpy(), c.numpy())
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = tf.reduce_sum(diffaugment.diff_augment(x, policy, tf.constant([1, 2])) ** 2)
    grad = tape.gradient(y, x)
    assert grad is not None and float(tf.reduce_sum(tf.abs(grad))) > 0
    assert diffaugment.diff_augment(x, "", tf.constant([1, 2])) is x


def test_diffaugment_translation_shifts_pixels_and_cutout_zeroes_a_square():
    x = tf.reshape(tf.range(1, 65, dtype=tf.float32), (1, 8, 8, 1))
    shifted = diffaugment.translation(x, tf.constant([5, 6], tf.int64), 1, 0).numpy()[0, ..., 0]
    values = shifted[shifted != 0]
    assert set(values) <= set(range(1, 65)) and len(values) >= 36  # a shift of at most 1 pixel each way
    cut = diffaugment.cutout(tf.ones((16, 8, 8, 1)), tf.constant([7, 8], tf.int64), 16, 0).numpy()
    zeros = (cut == 0).sum(axis=(1, 2, 3))
    assert zeros.max() == 16 and zeros.min() >= 4  # a 4x4 square, partly outside the image at most


def test_diffaugment_slice_of_a_global_batch_equals_the_whole_batch():
    """A replica augmenting rows 4..8 of a global batch gets exactly those rows of the one-device result."""
    x = tf.random.stateless_uniform((8, 8, 8, 3), [9, 9], minval=-1, maxval=1)
    seed = tf.constant([4, 2])
    whole = diffaugment.diff_augment(x, "color,translation,cutout", seed)
    part = diffaugment.diff_augment(x[4:], "color,translation,cutout", seed, offset=4, total=8)
    np.testing.assert_allclose(part.numpy(), whole.numpy()[4:], rtol=1e-6)


def test_diffaugment_unknown_op_is_named():
    with pytest.raises(ValueError, match="'flip'"):
        diffaugment.parse_policy("color,flip")
