"""training/loop_log.py: one loop's record (skip counts summed, the rest averaged, the task's state, the rate),
and the run's results made from the last loop and the median rate of the loops after the first."""
import types

import pytest

from tfgpu.training.loop_log import LoopLog


class _Sink:
    def __init__(self):
        self.written = []

    def write(self, kind, step, values):
        self.written.append((kind, step, dict(values)))

    def update(self, step, record):
        self.written.append(("progress", step, dict(record)))


def _log():
    task = types.SimpleNamespace(learning_rates=lambda: {"learning_rate": 0.1}, loss_scales=lambda: {})
    history, summaries = _Sink(), _Sink()
    return LoopLog(history, summaries, task, 32, ("nonfinite_steps",)), history, summaries


def test_a_loop_record_sums_skips_averages_the_rest_and_goes_to_every_sink():
    log, history, summaries = _log()
    progress = _Sink()
    step_metrics = log.write(10, 4, {"loss": 2.0, "nonfinite_steps": 1.0}, 2.0, progress, first=True)
    assert step_metrics == {"loss": 0.5, "nonfinite_steps": 1}
    record = {"loss": 0.5, "nonfinite_steps": 1, "learning_rate": 0.1, "examples_per_sec": 64.0,
              "step_time_ms": 500.0}
    assert history.written == [("train", 10, record)] and summaries.written == [("train", 10, record)]
    assert progress.written == [("progress", 10, record)]
    assert log.examples_per_sec() == 64.0  # the first loop's, when it is the only one


def test_the_result_takes_the_last_loop_and_the_median_rate_after_the_first():
    log, _, _ = _log()
    assert log.result(0, {"val_loss": 1.0}).examples_per_sec == 0.0  # no loop ran
    for step, elapsed in ((4, 100.0), (8, 1.0), (12, 2.0), (16, 4.0)):
        log.write(step, 4, {"loss": 4.0, "nonfinite_steps": 0.0}, elapsed, _Sink(), first=step == 4)
    result = log.result(16, {"val_loss": 1.0}, skipped_records=None)
    assert result.examples_per_sec == pytest.approx(64.0)  # 128, 64, 32: the first (compiling) loop not counted
    assert result.step == 16 and result.values == {"train_loss": 1.0, "train_nonfinite_steps": 0,
                                                   "learning_rate": 0.1, "val_loss": 1.0}
