"""Progress lines: the declared metrics, then elapsed time and the ETA to the end of the schedule; with --target the
best value of its metric so far. A resumed run's history.jsonl and TensorBoard files hold one record per step."""
import json
import os

from tfgpu.runtime import progress as progress_lib
from tfgpu.metrics import history


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


def _records(path):
    with open(path) as f:
        return [(r["kind"], r["step"]) for r in map(json.loads, f)]


def test_a_resume_cuts_the_records_an_earlier_run_wrote_past_its_checkpoint(tmp_path):
    """Steps 40 and 60 were trained and recorded, then lost (no checkpoint past 25): resuming at 25 cuts them and
    the killed run's half-written line, so the resumed run's records follow on, one per step. What happened up to
    the checkpoint stays (a process's startup record included)."""
    log = history.History(str(tmp_path), enabled=True)
    for kind, step in [("startup", 0), ("train", 20), ("eval", 20), ("train", 25), ("train", 40), ("eval", 40),
                       ("startup", 25), ("train", 60)]:
        log.write(kind, step, {"loss": 1.0})
    with open(log.path, "a") as f:
        f.write('{"kind": "train", "st')  # killed while writing
    assert log.cut_after(25) == 3
    assert _records(log.path) == [("startup", 0), ("train", 20), ("eval", 20), ("train", 25), ("startup", 25)]
    log.write("train", 45, {"loss": 0.5})
    assert _records(log.path)[-1] == ("train", 45)
    before = os.stat(log.path)
    assert log.cut_after(45) == 0
    assert os.stat(log.path).st_ino == before.st_ino  # nothing to cut: not rewritten
    assert history.History(str(tmp_path / "none"), enabled=True).cut_after(3) == 0  # no file yet
    assert history.History(str(tmp_path), enabled=False).cut_after(0) == 0  # not the chief: the chief's file
    assert len(_records(log.path)) == 6


def test_a_resume_cuts_tensorboard_scalars_past_its_checkpoint(tmp_path):
    """TensorBoard draws every event it finds: a lost run's points past the checkpoint would overlay the resumed
    run's curve. Events of steps up to it stay, as do the files' own (version) events."""
    import tensorflow as tf

    run_dir = str(tmp_path / "summaries" / "train")
    writer = tf.summary.create_file_writer(run_dir)
    with writer.as_default():
        for step in (10, 20, 30, 40):
            tf.summary.scalar("loss", 1.0 / step, step=step)
    writer.close()
    assert history.cut_summaries([run_dir, str(tmp_path / "summaries" / "validation")], 20) == 2
    (events,) = tf.io.gfile.glob(os.path.join(run_dir, "events.out.tfevents.*"))
    kept = [tf.compat.v1.Event.FromString(r.numpy()) for r in tf.data.TFRecordDataset(events)]
    assert [(e.step, e.summary.value[0].tag) for e in kept if e.HasField("summary")] == [(10, "loss"), (20, "loss")]
    assert any(e.file_version for e in kept)
    assert history.cut_summaries([run_dir], 20) == 0


def test_read_gives_every_record_that_reads_and_leaves_a_half_written_line_out(tmp_path):
    """``history.read``, what commands and tools that watch a run use: records in order, a killed run's half line
    left out, [] with no file."""
    assert history.read(str(tmp_path)) == []
    (tmp_path / "history.jsonl").write_text('{"kind": "train", "step": 1}\n{"kind": "eval", "step": 1}\n{"kind": "tr')
    assert history.read(str(tmp_path)) == [{"kind": "train", "step": 1}, {"kind": "eval", "step": 1}]


def test_read_by_kind_keeps_one_point_per_step_and_every_event_on_any_file_system():
    """The report's view: records by kind sorted by step, the last of a step written twice (an older file that
    was not cut), every event (two config changes at one resume), the unreadable lines counted; the same text
    read from ``ram://`` as from a local directory (a gs:// run reads the same way)."""
    import tensorflow as tf

    model_dir = "ram://history_by_kind"
    records = [{"kind": "train", "step": 20, "loss": 2.0}, {"kind": "eval", "step": 20}, {"kind": "train", "step": 10},
               {"kind": "train", "step": 20, "loss": 1.0}, {"kind": "config_change", "step": 20, "field": "a"},
               {"kind": "config_change", "step": 20, "field": "b"}, {"kind": "restart", "step": 10, "restart": 1}]
    with tf.io.gfile.GFile(model_dir + "/history.jsonl", "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in records) + '{"no_kind": 1}\n\n{"kind": "train", "st')
    kinds, bad = history.read_by_kind(model_dir)
    assert bad == 2
    assert kinds["train"] == [{"kind": "train", "step": 10}, {"kind": "train", "step": 20, "loss": 1.0}]
    assert [r["field"] for r in kinds["config_change"]] == ["a", "b"]
    assert len(kinds["restart"]) == 1 and len(kinds["eval"]) == 1
    assert len(history.read(model_dir)) == len(records)
    assert history.read_by_kind("ram://no_such_run") == ({}, 0)
