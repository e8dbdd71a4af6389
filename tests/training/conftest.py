"""Fixtures shared by tests/training."""
import logging

import keras
import pytest


@pytest.fixture
def fit_in_tmp_path(monkeypatch, tmp_path):
    """tfgpu.fit runs in tmp_path without report.md (its plots take seconds); tfgpu's logger and Keras' dtype policy
    put back after."""
    from tfgpu.training import experiment

    monkeypatch.setattr(experiment, "_write_report", lambda model_dir: None)
    monkeypatch.chdir(tmp_path)
    logger = logging.getLogger("tfgpu")
    saved = logger.handlers[:], logger.level, logger.propagate
    yield
    logger.handlers[:], logger.level, logger.propagate = saved
    keras.mixed_precision.set_global_policy("float32")
