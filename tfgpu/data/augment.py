"""Preprocessing ops: small pure functions from a parsed record to a model-ready image.

Models receive float32 NHWC images scaled to [-1, 1]. Random ops are stateless
and take an explicit ``seed`` (shape [2] int), so a resumed run augments
exactly like an uninterrupted one.
"""
import tensorflow as tf

from tfgpu.data import tfrecord


def to_model_range(image):
    """uint8 [0, 255] -> float32 [-1, 1]."""
    return tf.cast(image, tf.float32) / 127.5 - 1.0


def resize_to(image, size: int):
    return tf.image.resize(image, [size, size], method="bilinear", antialias=True)


def flip(image, seed):
    return tf.image.stateless_random_flip_left_right(image, seed)


def pad_crop_flip(image, seed, pad_fraction: float = 0.125):
    """CIFAR augmentation: reflect-pad by 1/8 of the size, random crop back, random flip."""
    h, w, c = tf.shape(image)[0], tf.shape(image)[1], image.shape[-1]
    pad = tf.maximum(1, tf.cast(tf.round(tf.cast(h, tf.float32) * pad_fraction), tf.int32))
    padded = tf.pad(image, [[pad, pad], [pad, pad], [0, 0]], mode="REFLECT")
    seeds = tf.random.experimental.stateless_split(seed, 2)
    cropped = tf.image.stateless_random_crop(padded, tf.stack([h, w, c]), seeds[0])
    return flip(cropped, seeds[1])


def preprocess_train(features, image_size: int, channels: int, augment: str, seed):
    """Decodes one record and applies ``augment`` (none|flip|cifar|imagenet); returns float32 [-1, 1]."""
    image = tfrecord.decode_image(features, channels)
    if image_size:
        image = tf.cast(resize_to(image, image_size), tf.uint8) if _needs_resize(image, image_size) else image
    if augment == "flip":
        image = flip(image, seed)
    elif augment in ("cifar", "imagenet"):
        image = pad_crop_flip(image, seed)
    elif augment != "none":
        raise ValueError(f"unknown augmentation {augment!r}")
    return to_model_range(image)


def preprocess_eval(features, image_size: int, channels: int):
    """Decodes one record, resizes it to ``image_size`` if needed; returns float32 [-1, 1]."""
    image = tfrecord.decode_image(features, channels)
    if image_size:
        image = tf.cast(resize_to(image, image_size), tf.uint8) if _needs_resize(image, image_size) else image
    return to_model_range(image)


def _needs_resize(image, size):
    return image.shape[0] != size or image.shape[1] != size
