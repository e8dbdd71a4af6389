"""Fixtures for the model zoo tests."""
import keras
import pytest


@pytest.fixture(autouse=True)
def float32_policy_after_test():
    """Tests set mixed policies globally; put float32 back and drop built graphs afterwards. Without a forced
    garbage collection: Python's own collects the cycles, and a forced one took 0.5 s per test here."""
    yield
    keras.mixed_precision.set_global_policy("float32")
    keras.backend.clear_session(free_memory=False)
