"""Sample grids: a batch of images to one PNG that a person can look at."""
import io
import math

import numpy as np
from PIL import Image

from tfgpu.runtime.fileio import atomic_write_bytes


def to_uint8(images) -> np.ndarray:
    """NHWC images in [-1, 1] (float) or uint8 -> uint8 NHWC; values outside [-1, 1] are clipped."""
    images = np.asarray(images)
    if images.ndim != 4:
        raise ValueError(f"expected NHWC images, got shape {images.shape}")
    if images.dtype == np.uint8:
        return images
    return np.round((np.clip(images.astype(np.float32), -1.0, 1.0) + 1.0) * 127.5).astype(np.uint8)


def make_grid(images, nrow: int = 0, padding: int = 2, min_cell: int = 32) -> np.ndarray:
    """Tiles images into one HxWxC uint8 array, ``nrow`` images per row (0 = square-ish), each enlarged by an
    integer factor (nearest neighbour) to at least ``min_cell`` pixels so small images stay visible."""
    images = to_uint8(images)
    n, h, w, c = images.shape
    if n == 0:
        raise ValueError("no images to tile")
    scale = max(1, math.ceil(min_cell / max(h, w)))
    if scale > 1:
        images = images.repeat(scale, axis=1).repeat(scale, axis=2)
        h, w = h * scale, w * scale
    per_row = nrow or math.ceil(math.sqrt(n))
    rows = math.ceil(n / per_row)
    grid = np.zeros((rows * h + (rows + 1) * padding, per_row * w + (per_row + 1) * padding, c), np.uint8)
    for i in range(n):
        r, col = divmod(i, per_row)
        y, x = padding + r * (h + padding), padding + col * (w + padding)
        grid[y:y + h, x:x + w] = images[i]
    return grid


def save_grid(images, path: str, nrow: int = 0, min_cell: int = 32) -> np.ndarray:
    """Writes ``images`` as one PNG grid to ``path`` (atomically) and returns the grid array."""
    grid = make_grid(images, nrow, min_cell=min_cell)
    picture = Image.fromarray(grid[..., 0] if grid.shape[-1] == 1 else grid)
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG")
    atomic_write_bytes(path, buffer.getvalue())
    return grid
