"""One source example -> one TFRecord: decode, orient, convert channels, encode; and what that takes.

The rule is "what converts, trains": every record is decoded here the way the
reader will decode it, so a file that converts is a file that trains.

- JPEG and PNG bytes are kept untouched by ``--image_format=keep`` (TF decodes them
  at any channel count). BMP, GIF and WebP bytes are kept when TF can decode them
  at 3 channels and the image has colour (so the dataset is read at 3 channels);
  a grayscale BMP, or an RGBA WebP, which TF cannot decode at the dataset's channels,
  is stored as a lossless PNG of the same pixels.
- TIFF, which TF cannot decode, is decoded with Pillow (first page; 16-bit samples
  scaled to 8 bits) and stored as PNG.
- EXIF orientation is applied (as Pillow's ``ImageOps.exif_transpose`` does), because
  TF's decoders ignore it: a rotated photo is stored upright, re-encoded (JPEG at
  ``--jpeg_quality`` for a JPEG, PNG otherwise) under ``keep``.

Each such change is counted per reason in the shard's statistics and the manifest (``adjusted``).
"""
import dataclasses
import io
import re
import warnings

import numpy as np

from tfgpu.data.schema import tfrecord
from tfgpu.data.sources import source as source_lib
from tfgpu.data.sources.folders import display

ORIENTATION_TAG = 0x0112
# What was done to an image beyond storing it (keys of the manifest's "adjusted", with counts).
ADJUSTED_TIFF = "tiff_as_png"
ADJUSTED_CHANNELS = "unreadable_at_dataset_channels_as_png"
ADJUSTED_EXIF = "exif_orientation_applied"


class BadImageError(Exception):
    """A source image that cannot be read or decoded (and --skip_bad is off)."""

    def __init__(self, path: str, reason: str):
        path = display(path)
        super().__init__(path, reason)
        self.path, self.reason = path, reason

    def __str__(self):
        return f"{self.path}: {self.reason}; fix or remove it, or pass --skip_bad to skip such files"


@dataclasses.dataclass(frozen=True)
class Encoding:
    """How each example becomes a record (sent to worker processes)."""
    image_format: str
    jpeg_quality: int
    resize: tuple  # () | ("short", n) | ("exact", width, height)
    channels: int  # force this many channels (raw images must agree); 0 = each image's own (1 or 3)
    skip_bad: bool


def sniff(encoded: bytes) -> str:
    """The image format of ``encoded`` from its magic bytes."""
    if encoded[:3] == b"\xff\xd8\xff":
        return "jpeg"
    if encoded[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    if encoded[:4] == b"GIF8":
        return "gif"
    if encoded[:2] == b"BM":
        return "bmp"
    if encoded[:4] == b"RIFF" and encoded[8:12] == b"WEBP":
        return "webp"
    if encoded[:4] in (b"II*\0", b"MM\0*"):
        return "tiff"
    return "unknown"


def visible_channels(c: int) -> int:
    """Channels the reader gets from an image stored with ``c``: alpha is dropped (2 -> 1, 4 -> 3)."""
    return {2: 1, 4: 3}.get(c, c)


# EXIF orientation -> the array operation that makes the image upright (Pillow's exif_transpose, on HWC arrays).
_ORIENT = {
    2: lambda a: a[:, ::-1],
    3: lambda a: a[::-1, ::-1],
    4: lambda a: a[::-1],
    5: lambda a: a.transpose(1, 0, 2),
    6: lambda a: np.rot90(a, -1),
    7: lambda a: a[::-1, ::-1].transpose(1, 0, 2),
    8: lambda a: np.rot90(a, 1),
}
_EXIF_MARKERS = {"jpeg": b"Exif\0\0", "png": b"eXIf", "webp": b"EXIF"}


def exif_orientation(encoded: bytes, fmt: str) -> int:
    """The EXIF orientation (1..8) of encoded image bytes; 1 when there is none or it cannot be read."""
    marker = _EXIF_MARKERS.get(fmt)
    if fmt != "tiff" and (marker is None or marker not in encoded[:1 << 20]):
        return 1  # no EXIF block: skip opening the file with Pillow
    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Pillow warns of odd EXIF blocks; the orientation is all we need
            with Image.open(io.BytesIO(encoded)) as im:
                value = int(im.getexif().get(ORIENTATION_TAG, 1))
    except Exception:  # a malformed EXIF block is not a bad image: TF decodes the pixels regardless
        return 1
    return value if value in _ORIENT else 1


def orient(image: np.ndarray, orientation: int) -> np.ndarray:
    """``image`` (HWC) turned upright for EXIF ``orientation``."""
    op = _ORIENT.get(orientation)
    return np.ascontiguousarray(op(image)) if op else image


def _decode_tiff(encoded: bytes) -> np.ndarray:
    from PIL import Image

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a damaged file raises below; Pillow's warnings would only repeat it
        with Image.open(io.BytesIO(encoded)) as im:
            im.seek(0)
            if im.mode.startswith("I;16"):
                return (np.asarray(im).astype(np.uint32) >> 8).astype(np.uint8)[..., None]
            if im.mode in ("I", "F"):
                raise ValueError(f"32-bit {'float' if im.mode == 'F' else 'integer'} samples; save it with 8 bits")
            gray = im.mode in ("1", "L", "LA", "La")
            array = np.asarray(im.convert("L" if gray else "RGB"))
    return array[..., None] if array.ndim == 2 else array


def _op_error_text(e) -> str:
    """TensorFlow's error text without the op/function decorations."""
    text = getattr(e, "message", None) or str(e) or type(e).__name__
    text = re.sub(r"\{\{[^}]*\}\}\s*", "", text.strip().splitlines()[0])
    return re.sub(r"\s*\[Op:\w+\]", "", text).strip()


def decode(encoded: bytes, origin: str) -> tuple:
    """Encoded bytes -> (uint8 HWC array as the reader's decoder gives it, format); TIFF through Pillow.

    Raises BadImageError naming ``origin``."""
    import tensorflow as tf

    fmt = sniff(encoded)
    try:
        image = _decode_tiff(encoded) if fmt == "tiff" else \
            tf.io.decode_image(encoded, expand_animations=False).numpy()
    except Exception as e:  # TF's OpError, or anything Pillow raises for a TIFF (its errors have no common base)
        text = _op_error_text(e) if isinstance(e, tf.errors.OpError) else \
            (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise BadImageError(origin, f"cannot decode ({text})") from None
    if image.size == 0:
        raise BadImageError(origin, "empty image")
    return image, fmt


def _reader_decodes_at_3(encoded: bytes) -> bool:
    import tensorflow as tf

    try:
        tf.io.decode_image(encoded, channels=3, expand_animations=False)
    except (tf.errors.OpError, ValueError):
        return False
    return True


def _resize(image: np.ndarray, resize: tuple) -> np.ndarray:
    import tensorflow as tf

    h, w = image.shape[:2]
    if resize[0] == "short":
        scale = resize[1] / min(h, w)
        size = [max(1, round(h * scale)), max(1, round(w * scale))]
    else:
        size = [resize[2], resize[1]]
    if size == [h, w]:
        return image
    out = tf.image.resize(image, size, method="bilinear", antialias=True)
    return np.clip(np.round(out.numpy()), 0, 255).astype(np.uint8)


def example_to_record(name: str, label: int, data, enc: Encoding, origin: str = ""):
    """One source example -> (serialized tf.train.Example, stored (h, w, channels), an ADJUSTED_* key or None).

    Raises BadImageError naming ``origin`` (the source path) when it cannot be read or decoded."""
    origin = origin or name
    if isinstance(data, source_lib.Unreadable):
        raise BadImageError(origin, data.reason)
    encoded, reason = None, None
    if isinstance(data, (bytes, np.bytes_)):
        encoded = bytes(data)
        image, fmt = decode(encoded, origin)
        orientation = exif_orientation(encoded, fmt)
        if orientation != 1:
            image, reason = orient(image, orientation), ADJUSTED_EXIF
        if enc.image_format == "keep" and reason is None and not enc.resize:
            if fmt == "tiff":
                reason = ADJUSTED_TIFF
            elif fmt not in ("jpeg", "png") and (visible_channels(image.shape[-1]) != 3
                                                 or not _reader_decodes_at_3(encoded)):
                reason = ADJUSTED_CHANNELS
            else:
                h, w, c = image.shape
                return (tfrecord.make_example(encoded, fmt, label, h, w, c, name), (h, w, visible_channels(c)),
                        None)
        if image.shape[-1] in (2, 4):
            image = image[..., :-1]  # decoded files: drop alpha, as the reader does
    else:
        image = np.asarray(data)
        if image.ndim == 2:
            image = image[..., None]
    if enc.resize:
        image = _resize(image, enc.resize)
    if enc.channels and image.shape[-1] != enc.channels:
        if image.shape[-1] == 1:
            image = np.repeat(image, enc.channels, axis=-1)
        else:
            raise BadImageError(origin, f"has {image.shape[-1]} channels, the dataset {enc.channels}")
    out_format = enc.image_format
    if out_format == "keep":  # a JPEG turned or resized stays JPEG (at --jpeg_quality); anything else is PNG
        turned_or_resized = reason == ADJUSTED_EXIF or bool(enc.resize)
        out_format = "jpeg" if turned_or_resized and encoded is not None and fmt == "jpeg" else "png"
    if out_format == "jpeg" and image.shape[-1] not in (1, 3):
        raise BadImageError(origin, f"JPEG cannot store {image.shape[-1]} channels; use --image_format=png or raw")
    stored = tfrecord.encode_image(np.ascontiguousarray(image), out_format, enc.jpeg_quality)
    h, w, c = image.shape
    # Under keep, every reason is a change from the source bytes; otherwise only the turn is worth saying.
    note = reason if enc.image_format == "keep" or reason == ADJUSTED_EXIF else None
    return tfrecord.make_example(stored, out_format, label, h, w, c, name), (h, w, c), note


class Stats:
    """Per-shard counts and image shape statistics (merged across shards for the manifest)."""

    def __init__(self):
        self.num_examples = 0
        self.class_counts = {}
        self.h = [None, None, 0]  # min, max, sum
        self.w = [None, None, 0]
        self.channels = {}
        self.skipped = []
        self.adjusted = {}

    def add(self, label, shape, adjusted=None):
        self.num_examples += 1
        self.class_counts[str(label)] = self.class_counts.get(str(label), 0) + 1
        for acc, v in ((self.h, shape[0]), (self.w, shape[1])):
            acc[0] = v if acc[0] is None else min(acc[0], v)
            acc[1] = v if acc[1] is None else max(acc[1], v)
            acc[2] += int(v)
        self.channels[str(shape[2])] = self.channels.get(str(shape[2]), 0) + 1
        if adjusted:
            self.adjusted[adjusted] = self.adjusted.get(adjusted, 0) + 1

    def to_json(self):
        return {"num_examples": self.num_examples, "class_counts": self.class_counts, "height": self.h,
                "width": self.w, "channels": self.channels, "skipped": self.skipped, "adjusted": self.adjusted}
