"""training/fit/state: a fit run's checkpoint restores the model, its optimizer and the position; one trained on
other data, or of another model, is refused in one line naming the argument."""
import keras
import numpy as np
import pytest

from tfgpu.config import ConfigError
from tfgpu.training.fit import placement, state


def _model(units=4):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(units), keras.layers.Dense(2)])
    model.compile(optimizer="adam", loss="mse")
    model.optimizer.build(model.trainable_variables)
    return model


def test_a_checkpoint_restores_the_model_optimizer_and_position(tmp_path):
    model = _model()
    where = placement.of_model(model)
    position = state.Position(epoch=2, step=5, seed=11, kind="arrays", examples=100, batch_size=8)
    saving = state.RunState(model, where, str(tmp_path), position, every_s=0)
    model.optimizer.iterations.assign(7)
    saving.steps.assign(21)
    saving.save()
    assert saving.every_s >= state.MIN_INTERVAL_S  # the next timed save waits for 50 times this one's duration
    fresh = _model()
    again = state.Position(kind="arrays", examples=100, batch_size=8)
    restored = state.RunState(fresh, where, str(tmp_path), again, every_s=0).restore()
    assert (restored.epoch, restored.step, restored.seed) == (2, 5, 11)
    assert int(fresh.optimizer.iterations.numpy()) == 7
    for a, b in zip(model.get_weights(), fresh.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_other_data_or_another_model_is_refused(tmp_path):
    model = _model()
    where = placement.of_model(model)
    state.RunState(model, where, str(tmp_path), state.Position(kind="arrays", examples=100, batch_size=8), 0).save()
    for argument, position in (("x", state.Position(kind="arrays", examples=99, batch_size=8)),
                               ("batch_size", state.Position(kind="arrays", examples=100, batch_size=16)),
                               ("x", state.Position(kind="dataset", examples=-1, batch_size=0))):
        with pytest.raises(ConfigError) as error:
            state.RunState(_model(), where, str(tmp_path), position, 0).restore()
        assert error.value.flag == argument and "give the same, or another model_dir" in str(error.value)
    with pytest.raises(ConfigError, match="does not fit the model built here"):
        state.RunState(_model(units=5), where, str(tmp_path),
                       state.Position(kind="arrays", examples=100, batch_size=8), 0).restore()
