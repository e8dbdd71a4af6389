"""tfgpu.data.builtin: scikit-learn's digits as uint8 images, split once into train/val, stratified by class."""
import numpy as np
import pytest

from tfgpu.data import builtin


def test_digits_are_full_range_uint8_and_split_80_20_within_every_class():
    data = builtin.load_builtin("digits")
    (x_train, y_train), (x_val, y_val) = data["splits"]["train"], data["splits"]["val"]
    assert x_train.dtype == np.uint8 and x_train.shape[1:] == (8, 8, 1) and x_train.max() == 255
    assert (len(y_train), len(y_val)) == (1438, 359) and data["classes"] == [str(i) for i in range(10)]
    for c in range(10):
        share = np.sum(y_val == c) / (np.sum(y_val == c) + np.sum(y_train == c))
        assert abs(share - 0.2) < 0.02
    again = builtin.load_builtin("digits")["splits"]["val"][1]
    np.testing.assert_array_equal(again, y_val)  # the same split every time


def test_an_unknown_builtin_names_the_known_ones():
    with pytest.raises(ValueError, match="built-in datasets: digits"):
        builtin.load_builtin("mnist")
