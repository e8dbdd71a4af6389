"""DiffAugment (Zhao et al. 2020): differentiable augmentations applied to every image the discriminator sees.

Policies are comma separated from ``color`` (brightness, saturation, contrast),
``translation`` (shift by up to 1/8 of the size, zero fill) and ``cutout`` (a
zeroed square of half the size). Images are NHWC in [-1, 1]. All randomness is
stateless from an explicit ``seed`` (shape [2] int), drawn for ``total``
examples of which this batch takes rows ``offset ... offset + batch``: a replica
holding a slice of a global batch augments its examples exactly as one device
holding the whole batch would.
"""
import tensorflow as tf

POLICIES = ("color", "translation", "cutout")


def parse_policy(policy: str) -> tuple:
    """'color,translation' -> ('color', 'translation'); raises ValueError naming an unknown op."""
    ops = tuple(p.strip() for p in policy.split(",") if p.strip())
    for op in ops:
        if op not in POLICIES:
            raise ValueError(f"unknown DiffAugment op {op!r}; choose from {', '.join(POLICIES)}")
    return ops


def _uniform(seed, total, offset, batch, shape=(), minval=0.0, maxval=1.0, dtype=tf.float32):
    values = tf.random.stateless_uniform([total, *shape], seed, minval=minval, maxval=maxval, dtype=dtype)
    return values[offset:offset + batch]


def brightness(x, seed, total, offset):
    shift = _uniform(seed, total, offset, tf.shape(x)[0], minval=-0.5, maxval=0.5)
    return x + tf.reshape(tf.cast(shift, x.dtype), [-1, 1, 1, 1])


def saturation(x, seed, total, offset):
    factor = _uniform(seed, total, offset, tf.shape(x)[0], minval=0.0, maxval=2.0)
    mean = tf.reduce_mean(x, axis=3, keepdims=True)
    return (x - mean) * tf.reshape(tf.cast(factor, x.dtype), [-1, 1, 1, 1]) + mean


def contrast(x, seed, total, offset):
    factor = _uniform(seed, total, offset, tf.shape(x)[0], minval=0.5, maxval=1.5)
    mean = tf.reduce_mean(x, axis=[1, 2, 3], keepdims=True)
    return (x - mean) * tf.reshape(tf.cast(factor, x.dtype), [-1, 1, 1, 1]) + mean


def translation(x, seed, total, offset, ratio=0.125):
    """Shifts each image by up to ``ratio`` of its size in each direction, filling with zeros."""
    h, w = x.shape[1], x.shape[2]
    shift_h, shift_w = max(1, int(h * ratio + 0.5)), max(1, int(w * ratio + 0.5))
    seeds = tf.random.experimental.stateless_split(seed, 2)
    batch = tf.shape(x)[0]
    dy = _uniform(seeds[0], total, offset, batch, minval=-shift_h, maxval=shift_h + 1, dtype=tf.int32)
    dx = _uniform(seeds[1], total, offset, batch, minval=-shift_w, maxval=shift_w + 1, dtype=tf.int32)
    padded = tf.pad(x, [[0, 0], [shift_h, shift_h], [shift_w, shift_w], [0, 0]])
    rows = tf.range(h)[None, :] - dy[:, None] + shift_h  # output row i reads padded row i - dy + pad
    cols = tf.range(w)[None, :] - dx[:, None] + shift_w
    x = tf.gather(padded, rows, axis=1, batch_dims=1)
    return tf.gather(x, cols, axis=2, batch_dims=1)


def cutout(x, seed, total, offset, ratio=0.5):
    """Zeroes one square of ``ratio`` times the size per image (it may hang over the border)."""
    h, w = x.shape[1], x.shape[2]
    size_h, size_w = int(h * ratio + 0.5), int(w * ratio + 0.5)
    seeds = tf.random.experimental.stateless_split(seed, 2)
    batch = tf.shape(x)[0]
    cy = _uniform(seeds[0], total, offset, batch, minval=0, maxval=h + (1 - size_h % 2), dtype=tf.int32)
    cx = _uniform(seeds[1], total, offset, batch, minval=0, maxval=w + (1 - size_w % 2), dtype=tf.int32)
    rows = tf.range(h)[None, :] - (cy[:, None] - size_h // 2)
    cols = tf.range(w)[None, :] - (cx[:, None] - size_w // 2)
    inside_rows = (rows >= 0) & (rows < size_h)
    inside_cols = (cols >= 0) & (cols < size_w)
    keep = tf.logical_not(inside_rows[:, :, None] & inside_cols[:, None, :])
    return x * tf.cast(keep, x.dtype)[..., None]


def diff_augment(images, policy, seed, offset=0, total=None):
    """Applies the ops of ``policy`` (a string or tuple) in the paper's order; gradients flow to ``images``."""
    ops = parse_policy(policy) if isinstance(policy, str) else tuple(policy)
    if not ops:
        return images
    total = images.shape[0] if total is None else total
    if total is None:
        raise ValueError("diff_augment needs a static batch size or an explicit total")
    seeds = tf.random.experimental.stateless_split(tf.cast(seed, tf.int64), 5)
    x = images
    if "color" in ops:
        x = contrast(saturation(brightness(x, seeds[0], total, offset), seeds[1], total, offset), seeds[2],
                     total, offset)
    if "translation" in ops:
        x = translation(x, seeds[3], total, offset)
    if "cutout" in ops:
        x = cutout(x, seeds[4], total, offset)
    return x
