"""Progress lines: the declared metrics, then elapsed time and the ETA to the end of the schedule; with --target the
best value of its metric so far."""
from tfgpu.runtime import progress as progress_lib
from tfgpu.training import history


def test_progress_lines_show_elapsed_time_an_eta_and_the_best_target_value(capsys, monkeypatch):
    clock = iter([100.0, 110.0, 130.0, 150.0])  # start; then one update each
    monkeypatch.setattr(progress_lib.time, "monotonic", lambda: next(clock))
    progress = history.Progress(2, 100, 0, True, ["loss"], best_name="val_accuracy")
    progress.update(10, {"loss": 1.5, "examples_per_sec": 3.0})  # 10 steps in 10 s: 90 left
    progress.set_best(0.91234)
    progress.update(20, {"loss": 1.25})  # 10 steps in 20 s since the first line (which included tracing)
    progress.update(100, {"loss": 1.0})
    assert capsys.readouterr().out.splitlines() == [
        "step 10/100 loss=1.5 elapsed=10s eta=1m30s",
        "step 20/100 loss=1.25 best_val_accuracy=0.9123 elapsed=30s eta=2m40s",
        "step 100/100 loss=1 best_val_accuracy=0.9123 elapsed=50s eta=0s"]


def test_a_worker_that_is_not_the_chief_prints_nothing(capsys):
    history.Progress(2, 10, 0, False, ["loss"]).update(5, {"loss": 1.0})
    assert capsys.readouterr().out == ""


def test_startup_phases_add_up_to_the_time_before_the_first_loop(monkeypatch):
    clock = iter([10.5, 12.0, 12.0, 15.25])
    monkeypatch.setattr(history.time, "time", lambda: next(clock))
    startup = history.PhaseTimer(started_at=10.0)
    for phase in ("imports", "strategy", "imports", "first_loop"):  # a phase marked twice adds up
        startup.mark(phase)
    assert startup.record() == {"imports_s": 0.5, "strategy_s": 1.5, "first_loop_s": 3.25, "total_s": 5.25}
    assert startup.describe() == ("startup: 5.2 s to the end of the first loop (imports 0.5, strategy 1.5, "
                                  "first loop 3.2)")


def test_the_shutdown_is_timed_from_the_last_record_with_the_same_clock(tmp_path, monkeypatch):
    log = history.History(str(tmp_path), enabled=True)
    assert log.last_time is None
    clock = iter([100.0, 100.0, 130.5, 132.0])
    monkeypatch.setattr(history.time, "time", lambda: next(clock))
    log.write("eval", 225, {"val_accuracy": 0.97})  # the record's time, then last_time
    shutdown = history.PhaseTimer(log.last_time, "shutdown", "the outputs written")
    shutdown.mark("trainer_teardown")
    shutdown.mark("export")
    assert shutdown.record() == {"trainer_teardown_s": 30.5, "export_s": 1.5, "total_s": 32.0}
    assert shutdown.describe() == "shutdown: 32.0 s to the outputs written (trainer teardown 30.5, export 1.5)"
