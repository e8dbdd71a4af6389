"""training/fit_runtime: which runs leave collectives behind that the next tfgpu.fit must start afresh from."""
import pytest

from tfgpu.config import ConfigError
from tfgpu.training import fit_runtime


@pytest.fixture(autouse=True)
def _fresh_state(monkeypatch):
    monkeypatch.setitem(fit_runtime._LAST_RUN, "collectives", False)


def test_a_run_on_several_replicas_is_noted_and_one_on_one_replica_clears_it():
    with fit_runtime.collectives_noted() as note:
        note(2)
    assert fit_runtime._LAST_RUN["collectives"]
    with fit_runtime.collectives_noted() as note:
        note(1)
    assert not fit_runtime._LAST_RUN["collectives"]


def test_a_refusal_before_training_is_not_a_run_but_a_failure_while_training_is():
    with pytest.raises(ConfigError), fit_runtime.collectives_noted():
        raise ConfigError("batch_size", "refused")
    assert not fit_runtime._LAST_RUN["collectives"]
    with pytest.raises(KeyboardInterrupt), fit_runtime.collectives_noted():
        raise KeyboardInterrupt
    assert fit_runtime._LAST_RUN["collectives"]
