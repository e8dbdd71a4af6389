"""Fixtures for the model zoo tests."""
import keras
import pytest


@pytest.fixture(autouse=True)
def float32_policy_after_test():
    """Tests set mixed policies globally; put float32 back and drop built graphs afterwards."""
    yield
    keras.mixed_precision.set_global_policy("float32")
    keras.backend.clear_session()
