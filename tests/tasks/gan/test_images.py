"""Sample grids: layout, value mapping and atomic PNG writes."""
import os

import numpy as np
import pytest
from PIL import Image

from tfgpu.tasks.gan import images


def test_float_images_map_to_uint8_and_clip():
    x = np.array([-1.0, 0.0, 1.0, 2.0, -3.0], np.float32).reshape(1, 1, 5, 1)
    np.testing.assert_array_equal(images.to_uint8(x).ravel(), [0, 128, 255, 255, 0])


def test_grid_layout_places_each_image_in_its_cell():
    batch = np.stack([np.full((4, 4, 3), i * 20, np.uint8) for i in range(6)])
    grid = images.make_grid(batch, nrow=3, padding=1, min_cell=4)
    assert grid.shape == (2 * 4 + 3, 3 * 4 + 4, 3)
    for i in range(6):
        r, c = divmod(i, 3)
        y, x = 1 + r * 5, 1 + c * 5
        assert (grid[y:y + 4, x:x + 4] == i * 20).all()


def test_small_images_are_enlarged_by_nearest_neighbour():
    batch = np.zeros((4, 8, 8, 1), np.uint8)
    batch[0, 0, 0, 0] = 255
    grid = images.make_grid(batch, nrow=2, padding=0, min_cell=32)
    assert grid.shape == (64, 64, 1)
    assert (grid[:4, :4] == 255).all() and grid[4:, 4:].max() == 0 or grid[4, 4, 0] == 0


def test_save_grid_writes_a_png_atomically(tmp_path):
    rng = np.random.default_rng(0)
    batch = rng.uniform(-1, 1, (10, 8, 8, 1)).astype(np.float32)
    path = tmp_path / "step_5.png"
    grid = images.save_grid(batch, str(path))
    with Image.open(path) as picture:
        assert picture.format == "PNG" and picture.size == (grid.shape[1], grid.shape[0])
        np.testing.assert_array_equal(np.asarray(picture), grid[..., 0])
    assert [p.name for p in tmp_path.iterdir()] == ["step_5.png"]  # no temporary file left behind
    rgb = images.save_grid(rng.integers(0, 255, (3, 16, 16, 3), dtype=np.uint8), str(tmp_path / "rgb.png"))
    with Image.open(tmp_path / "rgb.png") as picture:
        assert picture.mode == "RGB" and picture.size == (rgb.shape[1], rgb.shape[0])


def test_bad_shapes_are_rejected():
    with pytest.raises(ValueError, match="NHWC"):
        images.make_grid(np.zeros((8, 8)))
    with pytest.raises(ValueError, match="no images"):
        images.make_grid(np.zeros((0, 8, 8, 1)))
    assert not os.path.exists("never.png")
