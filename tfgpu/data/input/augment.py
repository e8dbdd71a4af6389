"""Preprocessing ops: small pure functions from a parsed record to a model-ready image.

Models receive float32 NHWC images scaled linearly from uint8 [0, 255] to
``input_range`` (--input_range; default [-1, 1], and always [-1, 1] for GANs).
Every augmentation works on pixels before that scaling (uint8, or float32 in
[0, 255]), and none fills with a constant (CIFAR's padding reflects the
image), so an augmented image holds the same pixels in any range. Random ops
are stateless and take an explicit ``seed`` (shape [2] int), so a resumed run
augments exactly like an uninterrupted one.

The augmentations, by --augment name, are ``AUGMENTATIONS``: ``none``, ``flip``, ``cifar`` (pad-crop-flip) and
``imagenet``. ``imagenet``: training takes an Inception-style random-resized crop (decoding only
the crop window of JPEG records, ``tf.image.decode_and_crop_jpeg``) and a flip;
evaluation resizes the shorter side to size/0.875 and takes the center crop.
"""
import dataclasses
from typing import Callable

import tensorflow as tf

from tfgpu.config import ConfigError
from tfgpu.data.schema import tfrecord


DEFAULT_RANGE = (-1.0, 1.0)


def to_model_range(image, input_range=DEFAULT_RANGE):
    """Pixels in [0, 255] (uint8 or float) -> float32 in ``input_range`` (MIN, MAX): 0 -> MIN, 255 -> MAX exactly.

    The default keeps the arithmetic of every earlier tfgpu run (``x / 127.5 - 1``), so their checkpoints see
    bit-identical inputs; other ranges interpolate in the form that is exact at both ends."""
    image = tf.cast(image, tf.float32)
    low, high = (float(v) for v in input_range)
    if (low, high) == DEFAULT_RANGE:
        return image / 127.5 - 1.0
    t = image / 255.0
    return low * (1.0 - t) + high * t


def resize_to(image, size: int):
    return tf.image.resize(image, [size, size], method="bilinear", antialias=True)


def flip(image, seed):
    return tf.image.stateless_random_flip_left_right(image, seed)


def pad_crop_flip(image, seed, pad_fraction: float = 0.125):
    """CIFAR augmentation: reflect-pad by 1/8 of the size, random crop back, random flip.

    Reflection, not a constant fill: the border repeats the image's own pixels, so no value stands for "black"
    or "grey" and the result is the same picture whatever --input_range it is scaled to afterwards."""
    h, w, c = tf.shape(image)[0], tf.shape(image)[1], image.shape[-1]
    pad = tf.maximum(1, tf.cast(tf.round(tf.cast(h, tf.float32) * pad_fraction), tf.int32))
    padded = tf.pad(image, [[pad, pad], [pad, pad], [0, 0]], mode="REFLECT")
    seeds = tf.random.experimental.stateless_split(seed, 2)
    cropped = tf.image.stateless_random_crop(padded, tf.stack([h, w, c]), seeds[0])
    return flip(cropped, seeds[1])


IMAGENET_CROP_FRACTION = 0.875
AREA_RANGE = (0.08, 1.0)
ASPECT_RATIO_RANGE = (3 / 4, 4 / 3)


def _is_jpeg(features):
    """True for JPEG bytes (whatever the record's format field says), never for raw pixels."""
    encoded = features[tfrecord.ENCODED]
    return tf.logical_and(tf.not_equal(features[tfrecord.FORMAT], "raw"), tf.io.is_jpeg(encoded))


def crop_window(image_shape, seed, area_range=AREA_RANGE, aspect_ratio_range=ASPECT_RATIO_RANGE):
    """A random [y, x, height, width] window covering ``area_range`` of the image (whole image as fallback)."""
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        tf.cast(image_shape, tf.int32), bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]), seed=seed,
        min_object_covered=0.1, aspect_ratio_range=aspect_ratio_range, area_range=area_range, max_attempts=10,
        use_image_if_no_bounding_boxes=True)
    return tf.stack([begin[0], begin[1], size[0], size[1]])


def decode_random_crop(features, channels: int, seed, fused: bool = True):
    """(crop, full image [height, width]) for a random-resized-crop window of the record's image; JPEG records
    decode only the window (``fused``)."""
    encoded = features[tfrecord.ENCODED]

    def jpeg():
        shape = tf.image.extract_jpeg_shape(encoded)
        window = crop_window(shape, seed)
        return tf.image.decode_and_crop_jpeg(encoded, window, channels=channels), shape[:2]

    def other():
        image = tfrecord.decode_image(features, channels)
        shape = tf.shape(image)
        window = crop_window(shape, seed)
        return tf.slice(image, [window[0], window[1], 0], [window[2], window[3], -1]), shape[:2]

    image, full = tf.cond(_is_jpeg(features), jpeg, other) if fused else other()
    return tf.ensure_shape(image, [None, None, channels]), full


def random_resized_crop_flip(features, image_size: int, channels: int, seed, fused: bool = True):
    """ImageNet training augmentation: a random-resized crop, resized to ``image_size`` (0: to the image's own
    size), and a random flip; float32 [0, 255]."""
    seeds = tf.random.experimental.stateless_split(tf.cast(seed, tf.int64), 2)
    image, full = decode_random_crop(features, channels, seeds[0], fused)
    size = [image_size, image_size] if image_size else full
    image = tf.image.resize(image, size, method="bilinear")
    return flip(image, seeds[1])


def center_crop(features, image_size: int, channels: int, crop_fraction: float = IMAGENET_CROP_FRACTION):
    """ImageNet evaluation: resize the shorter side to ``image_size / crop_fraction``, take the center square."""
    image = tfrecord.decode_image(features, channels)
    shape = tf.cast(tf.shape(image)[:2], tf.float32)
    target = tf.round(image_size / crop_fraction)
    scale = target / tf.reduce_min(shape)
    resized_shape = tf.maximum(tf.cast(tf.round(shape * scale), tf.int32), image_size)
    image = tf.image.resize(image, resized_shape, method="bilinear", antialias=True)
    top = (resized_shape[0] - image_size) // 2
    left = (resized_shape[1] - image_size) // 2
    return tf.slice(image, [top, left, 0], [image_size, image_size, -1])


def decoded(features, image_size: int, channels: int):
    """The record's image, resized to ``image_size`` when it has another size (0: as stored); uint8."""
    image = tfrecord.decode_image(features, channels)
    if image_size and _needs_resize(image, image_size):
        image = tf.cast(resize_to(image, image_size), tf.uint8)
    return image


def _imagenet_eval(features, image_size: int, channels: int):
    return center_crop(features, image_size, channels) if image_size else decoded(features, image_size, channels)


@dataclasses.dataclass(frozen=True)
class Augmentation:
    """What --augment=NAME does to one record, before the scaling to --input_range: ``train(features, image_size,
    channels, seed)`` and ``evaluate(features, image_size, channels)``, each giving pixels in [0, 255].
    ``on_decoded(image, seed)``, when set, is the random part alone: ``train`` is ``on_decoded`` of the record's
    ``decoded`` image, so a pipeline holding decoded images in memory (``data.input.memory``) applies it to them
    and feeds exactly what the records would give; None when training needs the record itself (``imagenet``
    decodes only its crop window)."""
    train: Callable
    evaluate: Callable = decoded
    on_decoded: Callable | None = None


def unchanged(image, seed):
    """--augment=none's random part: none."""
    return image


def _after_decoding(on_decoded: Callable) -> Augmentation:
    """An augmentation that starts from the record's ``decoded`` image."""
    return Augmentation(lambda features, size, channels, seed: on_decoded(decoded(features, size, channels), seed),
                        on_decoded=on_decoded)


# --augment: the training augmentation by name (Config's augment choices list the same names; a new one is an entry
# here and its name there, tied by tests/data/input/test_augment.py).
AUGMENTATIONS = {
    "none": _after_decoding(unchanged),
    "flip": _after_decoding(flip),
    "cifar": _after_decoding(pad_crop_flip),
    "imagenet": Augmentation(random_resized_crop_flip, _imagenet_eval),
}


def augmentation(name: str) -> Augmentation:
    """The ``AUGMENTATIONS`` entry ``name``; ConfigError(augment) for an unknown one."""
    if name not in AUGMENTATIONS:
        raise ConfigError("augment", f"unknown augmentation {name!r}; known: {', '.join(AUGMENTATIONS)}")
    return AUGMENTATIONS[name]


def preprocess_train(features, image_size: int, channels: int, augment: str, seed, input_range=DEFAULT_RANGE):
    """Decodes one record and applies the augmentation ``augment`` names; returns float32 in ``input_range``."""
    return to_model_range(augmentation(augment).train(features, image_size, channels, seed), input_range)


def preprocess_eval(features, image_size: int, channels: int, augment: str = "none", input_range=DEFAULT_RANGE):
    """Decodes one record as ``augment``'s evaluation does (resized to ``image_size`` if needed; ``imagenet``:
    resize and center crop, the evaluation that matches its training crops); returns float32 in ``input_range``."""
    return to_model_range(augmentation(augment).evaluate(features, image_size, channels), input_range)


def _needs_resize(image, size):
    return image.shape[0] != size or image.shape[1] != size
