"""One image -> one record: every kept format decodes with the reader at the dataset's channels; TIFF; EXIF."""
import io

import numpy as np
import pytest
import tensorflow as tf

from tfgpu.data.conversion import encode
from tfgpu.data.schema import tfrecord

ENC_KEEP = encode.Encoding("keep", 95, (), 0, False)


def pil_bytes(array, fmt, **kwargs):
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format=fmt, **kwargs)
    return buf.getvalue()


def pil_pixels(data, mode):
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(im.convert(mode))


def read(record, channels):
    return tfrecord.decode_image(tfrecord.parse_example(record), channels).numpy()


_rng = np.random.default_rng(0)
GRAY = _rng.integers(0, 256, (4, 6), dtype=np.uint8)
RGB = _rng.integers(0, 256, (4, 6, 3), dtype=np.uint8)
RGBA = np.concatenate([RGB, _rng.integers(1, 256, (4, 6, 1), dtype=np.uint8)], axis=-1)
FORMATS = [("PNG", {}), ("JPEG", {"quality": 100}), ("BMP", {}), ("GIF", {}), ("WEBP", {"lossless": True}),
           ("TIFF", {})]


@pytest.mark.parametrize("fmt, kwargs", FORMATS, ids=[f for f, _ in FORMATS])
@pytest.mark.parametrize("array", [GRAY, RGB, RGBA], ids=["gray", "rgb", "rgba"])
def test_what_converts_trains_for_every_format_kept(fmt, kwargs, array):
    """A kept record decodes with the reader's decoder at each channel count its dataset can have: 1 and 3 for a
    grayscale image (its dataset may be all grayscale), 3 for a colour one; lossless formats keep their pixels."""
    if fmt in ("JPEG", "GIF") and array.shape[-1] == 4 or fmt == "GIF" and array.ndim == 3:
        pytest.skip("Pillow does not write it (JPEG RGBA), or quantizes it (GIF colour)")
    data = pil_bytes(array, fmt, **kwargs)
    record, shape, adjusted = encode.example_to_record("x", 0, data, ENC_KEEP)
    visible = shape[-1]
    for channels in ((1, 3) if visible == 1 else (3,)):
        image = read(record, channels)
        assert image.shape == (4, 6, channels)
        if fmt not in ("JPEG",):
            np.testing.assert_array_equal(image, pil_pixels(data, "L" if channels == 1 else "RGB").reshape(
                image.shape))
    fmt_stored = tfrecord.parse_example(record)[tfrecord.FORMAT].numpy().decode()
    if fmt == "TIFF":
        assert adjusted == encode.ADJUSTED_TIFF and fmt_stored == "png"
    elif fmt in ("PNG", "JPEG"):
        assert adjusted is None and fmt_stored == fmt.lower()


def test_grayscale_bmp_and_rgba_webp_are_stored_as_png_others_keep_their_bytes():
    cases = {"gray bmp": (GRAY, "BMP", {}), "rgba webp": (RGBA, "WEBP", {"lossless": True}),
             "rgb bmp": (RGB, "BMP", {}), "rgba bmp": (RGBA, "BMP", {}),
             "gray webp": (GRAY, "WEBP", {"lossless": True})}
    stored = {}
    for name, (array, fmt, kwargs) in cases.items():
        data = pil_bytes(array, fmt, **kwargs)
        record, _, adjusted = encode.example_to_record("x", 0, data, ENC_KEEP)
        kept = tfrecord.parse_example(record)[tfrecord.ENCODED].numpy() == data
        stored[name] = (kept, adjusted)
    assert stored == {"gray bmp": (False, encode.ADJUSTED_CHANNELS), "rgba webp": (False, encode.ADJUSTED_CHANNELS),
                      "rgb bmp": (True, None), "rgba bmp": (True, None), "gray webp": (True, None)}


def test_sixteen_bit_tiff_is_scaled_to_eight_bits():
    from PIL import Image

    deep = (_rng.integers(0, 65536, (4, 6))).astype(np.uint16)
    buf = io.BytesIO()
    Image.fromarray(deep).save(buf, format="TIFF")
    record, shape, _ = encode.example_to_record("x", 0, buf.getvalue(), ENC_KEEP)
    assert shape == (4, 6, 1)
    np.testing.assert_array_equal(read(record, 1)[..., 0], (deep >> 8).astype(np.uint8))


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_turns_the_image_as_pillow_exif_transpose_does(orientation):
    from PIL import Image, ImageOps

    exif = Image.Exif()
    exif[encode.ORIENTATION_TAG] = orientation
    data = pil_bytes(RGB, "PNG", exif=exif.tobytes())
    with Image.open(io.BytesIO(data)) as im:
        expected = np.asarray(ImageOps.exif_transpose(im).convert("RGB"))
    record, shape, adjusted = encode.example_to_record("x", 0, data, ENC_KEEP)
    np.testing.assert_array_equal(read(record, 3), expected)
    assert shape == expected.shape
    assert adjusted == (None if orientation == 1 else encode.ADJUSTED_EXIF)


def test_a_rotated_jpeg_is_stored_upright_as_jpeg_and_in_every_format():
    from PIL import Image

    exif = Image.Exif()
    exif[encode.ORIENTATION_TAG] = 6  # stored landscape (4x8), shown portrait (8x4)
    data = pil_bytes(_rng.integers(0, 256, (4, 8, 3), dtype=np.uint8), "JPEG", exif=exif.tobytes())
    record, shape, adjusted = encode.example_to_record("x", 0, data, ENC_KEEP)
    features = tfrecord.parse_example(record)
    assert shape == (8, 4, 3) and adjusted == encode.ADJUSTED_EXIF
    assert features[tfrecord.FORMAT].numpy() == b"jpeg" and tf.io.is_jpeg(features[tfrecord.ENCODED])
    for fmt in ("png", "raw", "jpeg"):
        enc = encode.Encoding(fmt, 95, (), 3 if fmt == "raw" else 0, False)
        assert encode.example_to_record("x", 0, data, enc)[1:] == ((8, 4, 3), encode.ADJUSTED_EXIF)


def test_bytes_that_are_no_image_name_the_file():
    with pytest.raises(encode.BadImageError, match=r"^/data/cat/x.tif: cannot decode"):
        encode.example_to_record("x", 0, b"II*\0 not really a tiff", ENC_KEEP, "/data/cat/x.tif")
