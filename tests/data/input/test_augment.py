"""Preprocessing: ImageNet's fused random-resized crop for JPEG records and center-crop evaluation, seeded and
exact; the pixel range images reach the model in (--input_range)."""
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from tfgpu.data.input import augment
from tfgpu.data.schema import tfrecord


def record(image, image_format="jpeg", quality=95):
    """A parsed record (the feature dict the pipeline hands to augment) holding ``image``."""
    encoded = tfrecord.encode_image(image, image_format, quality)
    serialized = tfrecord.make_example(encoded, image_format, 3, *image.shape)
    return tfrecord.parse_example(tf.constant(serialized))


@pytest.fixture(scope="module")
def photo():
    """A smooth 90x140 RGB image (JPEG-friendly, so crops are easy to compare)."""
    y, x = np.mgrid[0:90, 0:140].astype(np.float32)
    image = np.stack([x / 140 * 255, y / 90 * 255, (x + y) / 230 * 255], axis=-1)
    return image.astype(np.uint8)


def test_random_resized_crop_is_seeded_and_model_ready(photo):
    features = record(photo)
    seed = tf.constant([7, 11], tf.int64)
    a = augment.preprocess_train(features, 32, 3, "imagenet", seed).numpy()
    b = augment.preprocess_train(features, 32, 3, "imagenet", seed).numpy()
    c = augment.preprocess_train(features, 32, 3, "imagenet", tf.constant([7, 12], tf.int64)).numpy()
    assert a.shape == (32, 32, 3) and a.dtype == np.float32
    assert -1.0 <= a.min() and a.max() <= 1.0
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_crop_windows_follow_the_inception_ranges(photo):
    shape = tf.constant(photo.shape)
    areas, ratios = [], []
    for i in range(200):
        y, x, h, w = augment.crop_window(shape, tf.constant([i, 1], tf.int64)).numpy()
        assert 0 <= y and y + h <= 90 and 0 <= x and x + w <= 140
        areas.append(h * w / (90 * 140))
        ratios.append(w / h)
    areas, ratios = np.array(areas), np.array(ratios)
    cropped = areas < 0.999  # the rest fell back to the whole image
    assert cropped.mean() > 0.8
    assert areas[cropped].min() >= 0.08 - 0.02 and areas[cropped].max() <= 1.0
    assert ratios[cropped].min() >= 3 / 4 - 0.05 and ratios[cropped].max() <= 4 / 3 + 0.05
    assert np.median(areas[cropped]) < 0.7  # crops really vary, not near-full images


def test_fused_jpeg_crop_matches_decoding_the_whole_image(photo):
    features = record(photo)
    for i in range(10):
        seed = tf.constant([i, 3], tf.int64)
        fused = augment.decode_random_crop(features, 3, seed, fused=True)[0].numpy()
        full = augment.decode_random_crop(features, 3, seed, fused=False)[0].numpy()
        assert fused.shape == full.shape
        assert np.abs(fused.astype(int) - full.astype(int)).max() <= 2, i


@pytest.mark.parametrize("image_format", ["png", "raw"])
def test_non_jpeg_records_take_the_decode_then_crop_path(photo, image_format):
    features = record(photo, image_format)
    seed = tf.constant([5, 5], tf.int64)
    window = augment.crop_window(tf.constant(photo.shape), seed).numpy()
    crop = augment.decode_random_crop(features, 3, seed)[0].numpy()
    y, x, h, w = window
    np.testing.assert_array_equal(crop, photo[y:y + h, x:x + w])


def test_raw_pixels_that_look_like_a_jpeg_header_are_not_decoded_as_jpeg():
    image = np.zeros((6, 6, 3), np.uint8)
    image[0, 0] = [0xFF, 0xD8, 0xFF]
    crop = augment.decode_random_crop(record(image, "raw"), 3, tf.constant([1, 2], tf.int64))[0].numpy()
    assert crop.ndim == 3 and crop.shape[-1] == 3


def test_center_crop_eval(photo):
    # A 32x32 image at size 28 is already 28 / 0.875 = 32 on its shorter side: the crop is its center, exactly.
    square = photo[:32, :32]
    out = augment.preprocess_eval(record(square, "png"), 28, 3, augment="imagenet").numpy()
    np.testing.assert_allclose(out, square[2:30, 2:30].astype(np.float32) / 127.5 - 1.0, atol=1e-5)
    # A wide image: shorter side to 32, then the middle 28x28 (the left and right bands are cut off).
    wide = np.zeros((40, 120, 3), np.uint8)
    wide[:, 40:80] = 200
    out = augment.preprocess_eval(record(wide, "png"), 28, 3, augment="imagenet").numpy()
    assert out.shape == (28, 28, 3)
    np.testing.assert_allclose(out, 200 / 127.5 - 1.0, atol=1e-3)
    # Without augment="imagenet", evaluation keeps its old behaviour (plain resize).
    plain = augment.preprocess_eval(record(wide, "png"), 28, 3).numpy()
    assert plain.shape == (28, 28, 3) and plain.min() < -0.9


def test_imagenet_training_in_a_tf_data_pipeline_of_mixed_sizes():
    rng = np.random.default_rng(0)
    records = [tfrecord.make_example(tfrecord.encode_image(rng.integers(0, 256, (h, w, 3), dtype=np.uint8),
                                                           fmt), fmt, 1, h, w, 3)
               for (h, w), fmt in zip([(50, 70), (64, 48), (33, 90), (80, 80)], ["jpeg", "png", "jpeg", "raw"])]

    def parse(index, serialized):
        features = tfrecord.parse_example(serialized)
        image = augment.preprocess_train(features, 24, 3, "imagenet", tf.stack([tf.constant(9, tf.int64), index]))
        return tf.ensure_shape(image, [24, 24, 3])

    ds = tf.data.Dataset.zip(tf.data.Dataset.counter(), tf.data.Dataset.from_tensor_slices(records)).map(parse)
    batch = next(iter(ds.batch(4))).numpy()
    assert batch.shape == (4, 24, 24, 3) and np.isfinite(batch).all()


def test_cifar_and_flip_paths_are_unchanged():
    image = np.arange(8 * 8 * 3, dtype=np.uint8).reshape(8, 8, 3)
    seed = tf.constant([1, 2], tf.int64)
    out = augment.preprocess_train(record(image, "png"), 8, 3, "cifar", seed).numpy()
    assert out.shape == (8, 8, 3)
    flipped = augment.preprocess_train(record(image, "png"), 8, 3, "flip", seed).numpy()
    expected = image.astype(np.float32) / 127.5 - 1.0
    assert np.array_equal(flipped, expected) or np.array_equal(flipped, expected[:, ::-1])


def test_imagenet_crop_at_the_native_size_when_no_image_size_is_given(photo):
    for image_format in ("jpeg", "png"):
        out = augment.preprocess_train(record(photo, image_format), 0, 3, "imagenet", tf.constant([4, 4], tf.int64))
        assert out.shape == photo.shape


PIXELS = np.arange(256, dtype=np.uint8)


def test_default_range_is_bit_identical_to_earlier_runs():
    """Checkpoints trained before --input_range see exactly the inputs they were trained on."""
    before = np.arange(256, dtype=np.float32) / np.float32(127.5) - np.float32(1.0)
    for args in ((), ((-1.0, 1.0),), ([-1, 1],)):
        after = augment.to_model_range(tf.constant(PIXELS), *args).numpy()
        assert after.dtype == np.float32
        np.testing.assert_array_equal(after.view(np.uint32), before.view(np.uint32))


@settings(max_examples=40, deadline=None)
@given(st.floats(-1e4, 1e4, width=32), st.floats(-1e4, 1e4, width=32))
def test_any_range_maps_pixel_0_to_min_and_255_to_max_in_order(a, b):
    """Every range --input_range accepts (a subnormal sliver such as 0,3e-40 is refused by name: float32 flushes
    it to 0, found by this property)."""
    from tfgpu.config import Config, ConfigError

    low, high = min(a, b), max(a, b)
    try:
        Config(model_dir="unused", dataset="digits", input_range=(low, high)).check_values()
    except ConfigError as e:
        assert e.flag == "input_range"
        return
    scaled = augment.to_model_range(tf.constant(PIXELS), (low, high)).numpy()
    assert scaled[0] == np.float32(low) and scaled[-1] == np.float32(high)
    assert (np.diff(scaled) >= 0).all()


@pytest.mark.parametrize("input_range", [(0.0, 1.0), (-1.0, 1.0), (0.0, 255.0)])
def test_cifar_padding_repeats_the_image_not_a_fill_value(input_range):
    """Reflect padding: a white image stays white in every range (a constant fill would add a black border in
    [0, 1] or a grey one in [-1, 1])."""
    white = record(np.full((8, 8, 3), 255, np.uint8), "png")
    for i in range(8):
        out = augment.preprocess_train(white, 8, 3, "cifar", tf.constant([i, 5], tf.int64), input_range).numpy()
        assert (out == np.float32(input_range[1])).all(), i


@pytest.mark.parametrize("augmentation", sorted(augment.AUGMENTATIONS))
def test_an_augmented_image_is_the_same_picture_in_any_range(photo, augmentation):
    features, seed = record(photo, "png"), tf.constant([3, 9], tf.int64)
    default = augment.preprocess_train(features, 32, 3, augmentation, seed).numpy()
    unit = augment.preprocess_train(features, 32, 3, augmentation, seed, (0.0, 1.0)).numpy()
    eval_unit = augment.preprocess_eval(features, 32, 3, augmentation, (0.0, 1.0)).numpy()
    eval_default = augment.preprocess_eval(features, 32, 3, augmentation).numpy()
    assert 0 <= unit.min() and unit.max() <= 1 and 0 <= eval_unit.min() and eval_unit.max() <= 1
    np.testing.assert_allclose(unit, (default + 1) / 2, atol=1e-6)
    np.testing.assert_allclose(eval_unit, (eval_default + 1) / 2, atol=1e-6)


def test_every_augmentation_the_flag_offers_is_registered_and_its_help_names_each():
    import dataclasses

    from tfgpu.config import Config

    (field,) = [f for f in dataclasses.fields(Config) if f.name == "augment"]
    assert set(field.metadata["choices"]) == set(augment.AUGMENTATIONS)
    assert all(name in field.metadata["help"] for name in augment.AUGMENTATIONS), field.metadata["help"]


@pytest.mark.parametrize("augmentation", sorted(augment.AUGMENTATIONS))
def test_every_registered_augmentation_keeps_the_pictures_size_and_follows_its_seed(photo, augmentation):
    """Train and eval give an image of --image_size; the same seed gives the same pixels (exact resume)."""
    features, seed = record(photo, "png"), tf.constant([5, 1], tf.int64)
    first = augment.preprocess_train(features, 24, 3, augmentation, seed).numpy()
    np.testing.assert_array_equal(first, augment.preprocess_train(features, 24, 3, augmentation, seed).numpy())
    assert first.shape == augment.preprocess_eval(features, 24, 3, augmentation).numpy().shape == (24, 24, 3)


def test_an_unknown_augmentation_names_the_flag():
    from tfgpu.config import ConfigError

    known = ", ".join(augment.AUGMENTATIONS)
    with pytest.raises(ConfigError, match=f"^--augment: unknown augmentation 'mixup'; known: {known}$"):
        augment.preprocess_train(record(np.zeros((8, 8, 3), np.uint8), "png"), 8, 3, "mixup", tf.constant([1, 2]))
