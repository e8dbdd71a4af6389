"""training/fit/placement: fit trains where the model was made; a model made outside the job's strategy (before
``import tfgpu`` made it) is refused in one line saying to move the import up."""
import keras
import pytest

from tfgpu.config import ConfigError
from tfgpu.runtime import job_strategy
from tfgpu.training.fit import placement


def test_a_model_made_without_a_strategy_trains_on_one_device():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    where = placement.of_model(model)
    assert (where.kind, where.num_replicas, where.num_workers, where.is_chief) == ("one_device", 1, 1, True)
    assert placement.single(where) and list(placement.replica_ids(where)) == [0]


def test_a_model_made_before_the_job_strategy_is_refused(monkeypatch):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)], name="early")
    monkeypatch.setitem(job_strategy._JOB, "strategy", object())
    with pytest.raises(ConfigError) as error:
        placement.of_model(model)
    assert error.value.flag == "model" and "early was made before `import tfgpu`" in str(error.value)
    assert "put `import tfgpu` first in the script" in str(error.value)
