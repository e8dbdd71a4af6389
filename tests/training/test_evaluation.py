"""training/evaluation.py in-process: an evaluation is recorded once when asked and not otherwise, and a run
without an eval split evaluates nothing."""
import types

import keras

from tests.conftest import read_history
from tfgpu.config import Config
from tfgpu.training import evaluation, experiment


def test_whether_a_run_evaluates_follows_its_eval_split_or_its_task():
    split = types.SimpleNamespace(eval_split="test")
    none = types.SimpleNamespace(eval_split="")
    assert evaluation.evaluates(split, types.SimpleNamespace(evaluates_without_eval_split=False))
    assert not evaluation.evaluates(none, types.SimpleNamespace(evaluates_without_eval_split=False))
    assert evaluation.evaluates(none, types.SimpleNamespace(evaluates_without_eval_split=True))


def test_an_evaluation_is_recorded_only_when_asked(tmp_path, data_cache):
    config = Config(model_dir=str(tmp_path), dataset="digits", data_cache_dir=data_cache, model="small_cnn",
                    global_batch_size=64, train_steps=2, tensorboard=False, verbose=0)
    try:
        run = experiment.setup(config).trainer
        quiet = run.evaluation(0, record=False)
        assert 0.0 <= quiet["val_accuracy"] <= 1.0 and "eval_time_s" not in quiet
        recorded = run.evaluation(0)
        assert recorded["val_accuracy"] == quiet["val_accuracy"] and recorded["eval_time_s"] > 0
        assert [(r["step"], r["val_accuracy"]) for r in read_history(tmp_path, "eval")] == [
            (0, recorded["val_accuracy"])]
    finally:
        keras.backend.clear_session(free_memory=False)
