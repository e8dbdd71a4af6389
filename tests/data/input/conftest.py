"""Fixtures of the input pipeline tests: the built-in digits, converted once per module into its own data cache."""
import pytest

from tfgpu.config import Config
from tfgpu.data import catalog


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    """``make(**options) -> (Config, DatasetInfo)`` of --dataset=digits with those options."""
    cache = str(tmp_path_factory.mktemp("cache"))

    def make(**overrides):
        config = Config(model_dir="unused", dataset="digits", data_cache_dir=cache, **overrides)
        return config, catalog.prepare(config)

    return make
