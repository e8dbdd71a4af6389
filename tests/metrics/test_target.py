"""--target=METRIC:VALUE: parsing and the comparison rule (pure), and runs that stop at the first evaluation that
reaches it, after a checkpoint, or run their whole schedule when none does."""
import os
import re
import subprocess
import sys
import time

import pytest
from hypothesis import given, settings, strategies as st

from tests.conftest import REPO, read_history, read_metrics
from tfgpu.config import ConfigError
from tfgpu.metrics import metric_specs, results, target
from tfgpu.metrics.metric_specs import Declarations, MetricSpec
from tfgpu.runtime import run_dir

TINY = ["--dataset=digits", "--model=small_cnn", "--global_batch_size=64", "--steps_per_loop=2",
        "--checkpoint_every_steps=0", "--tensorboard=false", "--verbose=2"]

CLASSIFIER = Declarations((MetricSpec("loss", lower_is_better=True), MetricSpec("accuracy", lower_is_better=False),
                           MetricSpec("val_loss", kind="eval", lower_is_better=True),
                           MetricSpec("val_accuracy", kind="eval", lower_is_better=False),
                           MetricSpec("val_examples", kind="eval", counts_examples=True))
                          + metric_specs.LOOP_METRICS)


# -- the rule ------------------------------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(st.from_regex(r"[a-z][a-z0-9_]{0,15}", fullmatch=True), st.floats(allow_nan=False, allow_infinity=False))
def test_a_target_parses_back_from_its_own_text(metric, value):
    parsed = target.parse(f"{metric}:{value!r}")
    assert parsed == (metric, value)
    resolved = target.Target(metric, value, False)
    assert target.parse(str(resolved)) == (metric, pytest.approx(value, rel=1e-5))


@pytest.mark.parametrize("text", ["val_accuracy", "val_accuracy:", ":0.9", "val_accuracy:high", "fid:nan",
                                  "fid:inf", ""])
def test_a_malformed_target_is_one_error_naming_the_flag(text):
    with pytest.raises(ConfigError, match=r"^--target: expected METRIC:VALUE"):
        target.parse(text)


def test_direction_comes_from_the_declaration_then_the_name():
    declared = Declarations((MetricSpec("val_error", kind="eval", lower_is_better=True),
                             MetricSpec("score_loss", kind="eval", lower_is_better=False),
                             MetricSpec("fid", kind="eval"), MetricSpec("kid", kind="eval"),
                             MetricSpec("val_iou", kind="eval")))
    assert [target.resolve(f"{n}:1", declared).op for n in ("val_error", "score_loss", "fid", "kid", "val_iou")] \
        == ["<=", ">=", "<=", "<=", ">="]
    lower, higher = target.resolve("val_loss:0.5", CLASSIFIER), target.resolve("val_accuracy:0.9", CLASSIFIER)
    assert lower.reached(0.5) and lower.reached(0.1) and not lower.reached(0.51)
    assert higher.reached(0.9) and higher.reached(1.0) and not higher.reached(0.89)
    assert not higher.reached(float("nan")) and not higher.reached(None) and not lower.reached(float("inf"))
    assert higher.better(0.8, None) == 0.8 and higher.better(0.7, 0.8) == 0.8 and lower.better(0.7, 0.8) == 0.7


def test_the_metric_is_an_eval_metric_with_or_without_its_prefix():
    assert target.resolve("accuracy:0.97", CLASSIFIER) == target.Target("val_accuracy", 0.97, False)
    assert str(target.resolve("loss:0.2", CLASSIFIER)) == "val_loss:0.2"
    for name in ("top1", "val_examples", "eval_time_s", "examples_per_sec"):
        with pytest.raises(ConfigError, match=rf"^--target: '{name}' is not an eval metric of this task; it "
                                              r"evaluates val_loss, val_accuracy$"):
            target.resolve(f"{name}:1", CLASSIFIER)


def test_the_registered_tasks_declare_their_targets():
    from tfgpu.tasks.registry import get_task

    gan = metric_specs.of_task(get_task("gan"))
    assert target.eval_metrics(gan) == ["fid", "kid"]  # not the sample grid
    assert target.resolve("fid:20", gan).describe() == "fid <= 20"
    classification = metric_specs.of_task(get_task("classification"))
    assert target.resolve("val_top5_accuracy:0.99", classification).describe() == "val_top5_accuracy >= 0.99"


def test_the_outcome_in_one_sentence():
    high = target.Target("val_accuracy", 0.97, False)
    reached = results.RunResult(step=450, target=results.TargetOutcome.of(
        high, {"step": 440, "seconds": 61.97, "epochs": 19.5666}))
    assert (reached.target.seconds, reached.target.epochs) == (62.0, 19.57)  # rounded as the file records them
    assert target.sentence(reached, CLASSIFIER) == \
        "target val_accuracy >= 0.97 reached at step 440 (19.57 epochs) in 62.0 s"
    missed = results.RunResult(step=675, target=results.TargetOutcome.of(target.Target("fid", 20.0, True), None))
    assert missed.target == results.TargetOutcome("fid:20", False, None, None, None)
    assert target.sentence(missed, best=23.25) == "target fid <= 20 not reached in 675 steps (best 23.25)"
    assert target.sentence(results.RunResult(step=3)) == ""


# -- runs ----------------------------------------------------------------------------------------------------------
def test_an_easy_target_stops_at_its_evaluation_after_a_checkpoint_and_a_rerun_trains_no_further(train_here,
                                                                                                  tmp_path):
    args = TINY + ["--train_steps=40", "--eval_every_steps=2", "--base_learning_rate=0.5", "--target=accuracy:0.2",
                   f"--model_dir={tmp_path}"]
    called = time.time()
    result = train_here(*args)
    took = time.time() - called
    metrics, evals = read_metrics(tmp_path), read_history(tmp_path, "eval")
    at = metrics["step_at_target"]
    assert metrics["target_reached"] is True and metrics["target"] == "val_accuracy:0.2" and at < 40
    # The first evaluation that reached it, and nothing after it: no training, no evaluation, no other checkpoint.
    assert [e["step"] for e in evals] == list(range(2, at + 1, 2))
    assert all(e["val_accuracy"] < 0.2 for e in evals[:-1]) and evals[-1]["val_accuracy"] >= 0.2
    assert read_history(tmp_path)[-1]["step"] == metrics["step"] == at
    assert sorted(os.listdir(run_dir.checkpoints(tmp_path))) == [run_dir.CHECKPOINT_STATE_FILE,
                                                                 f"{run_dir.CHECKPOINT_PREFIX}{at}.data-00000-of-00001",
                                                                 f"{run_dir.CHECKPOINT_PREFIX}{at}.index"]
    assert metrics["epochs_at_target"] == round(at * 64 / 1438, 2)
    assert 0 < metrics["time_to_target_s"] <= took  # from the call of main here: a process's start on its own
    assert f"target val_accuracy >= 0.2 reached at step {at} ({metrics['epochs_at_target']:g} epochs) in " \
           in result.output
    assert "best_val_accuracy=" in result.output and " eta=" in result.output
    assert f"Target val_accuracy >= 0.2 reached at step {at}" in (tmp_path / "report.md").read_text()
    # The time before the first loop counts in the time to target: history.jsonl says where it went.
    [startup] = read_history(tmp_path, "startup")
    phases = {k: v for k, v in startup.items() if k.endswith("_s") and k != "total_s"}
    assert list(phases) == ["imports_s", "tensorflow_import_s", "flags_s", "strategy_s", "dataset_s", "build_s",
                            "restore_s", "first_loop_s"] and startup["step"] == 0
    assert abs(sum(phases.values()) - startup["total_s"]) < 0.01 and startup["total_s"] <= metrics["time_to_target_s"]
    assert "startup: " in result.output and " to the end of the first loop (imports " in result.output
    # So does the wait after it: the trainer's teardown, the export, metrics.json and the report.
    [shutdown] = read_history(tmp_path, "shutdown")
    assert [k for k in shutdown if k.endswith("_s")] == ["trainer_teardown_s", "export_s", "metrics_and_report_s",
                                                         "total_s"] and shutdown["step"] == at
    assert "shutdown: " in result.output and " to the outputs written (trainer teardown " in result.output

    again = train_here(*args)
    assert f"target val_accuracy >= 0.2 already reached at step {at}" in again.output
    assert read_history(tmp_path)[-1]["step"] == at and len(read_history(tmp_path, "eval")) == len(evals)
    resumed = read_metrics(tmp_path)
    assert resumed["step"] == at and resumed["target_reached"] is True
    assert resumed["time_to_target_s"] == metrics["time_to_target_s"]  # the run that reached it


def test_a_target_reached_at_the_last_step_keeps_its_record_when_the_run_is_run_again(train_here, tmp_path):
    """Rerunning a finished --target run neither rewrites its time, step and epochs at the target (before: the
    rerun's own start-up became time_to_target_s) nor records its final evaluation a second time."""
    import json

    args = TINY + ["--train_steps=2", "--target=accuracy:0", f"--model_dir={tmp_path}"]
    train_here(*args)
    first = read_metrics(tmp_path)
    assert first["target_reached"] is True and first["step_at_target"] == first["step"] == 2
    # As if the first run's start-up had been a minute slower: a rerun must keep whatever that run measured.
    first["time_to_target_s"] = round(first["time_to_target_s"] + 60, 1)
    (tmp_path / "metrics.json").write_text(json.dumps(first))
    again = train_here(*args)
    resumed = read_metrics(tmp_path)
    assert results.read(str(tmp_path)).target == results.parse(first).target
    assert resumed["val_accuracy"] == first["val_accuracy"]  # the checkpoint evaluated again, not recorded again
    assert [e["step"] for e in read_history(tmp_path, "eval")] == [2]
    assert "target val_accuracy >= 0 already reached at step 2" in again.output
    assert f"reached at step 2 ({first['epochs_at_target']:g} epochs) in {first['time_to_target_s']:.1f} s" \
        in again.output


def test_a_damaged_metrics_json_at_a_rerun_is_one_warning_and_the_checkpoint_decides(train_here, tmp_path):
    """A metrics.json cut short (a disk filled mid-copy, a hand edit) is not read as a record of the target: the
    rerun says so in one line naming the file, evaluates the checkpoint, and writes a whole file again."""
    args = TINY + ["--train_steps=2", "--target=accuracy:0", f"--model_dir={tmp_path}"]
    train_here(*args)
    (tmp_path / "metrics.json").write_text('{"step": 2, "target_rea')
    again = train_here(*args)
    warned = [line for line in again.output.splitlines() if "decided by evaluating the checkpoint" in line]
    assert len(warned) == 1 and str(tmp_path / "metrics.json") in warned[0], again.output[-3000:]
    assert read_metrics(tmp_path)["target_reached"] is True


# Slow: (20 s loaded); a reached target, its checkpoint and resume stay in the default suite.
@pytest.mark.slow
def test_an_unreachable_target_runs_the_schedule_evaluating_once_per_epoch(train_here, tmp_path):
    """Batch 512 on 1,438 digits: 2.81 steps per epoch, so evaluations at steps 3 and 6 and at the end, 8."""
    result = train_here(*TINY, "--global_batch_size=512", "--train_steps=8", "--target=val_accuracy:1.01",
                        f"--model_dir={tmp_path}")
    metrics = read_metrics(tmp_path)
    assert [e["step"] for e in read_history(tmp_path, "eval")] == [3, 6, 8]
    assert metrics["step"] == 8 and metrics["target_reached"] is False and metrics["step_at_target"] is None
    assert metrics["time_to_target_s"] is None and metrics["epochs_at_target"] is None
    assert "target val_accuracy >= 1.01 not reached in 8 steps (best " in result.output


@pytest.mark.parametrize("flag, message", [
    ("--target=val_accuracy", "--target: expected METRIC:VALUE with a number"),
    ("--target=top1:0.9", "--target: 'top1' is not an eval metric of this task; it evaluates val_loss, "
                          "val_accuracy, val_top5_accuracy"),
    ("--target=accuracy:0.9 --eval_split=none", "--target: needs evaluations, and this run has no eval split"),
])
def test_a_bad_target_is_one_line_before_training(train_here, tmp_path, flag, message):
    result = train_here(*TINY, "--train_steps=4", *flag.split(), f"--model_dir={tmp_path}", check=False)
    errors = [line for line in result.output.splitlines() if "error" in line.lower()]
    assert result.returncode == 1 and len(errors) == 1 and errors[0].startswith(f"error: {message}"), result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "history.jsonl").exists() and not (tmp_path / run_dir.CHECKPOINTS_DIR).exists()


# Slow (about 15 s: a process of its own, for the logical devices).
@pytest.mark.slow
def test_two_replicas_stop_at_the_first_evaluation_that_reaches_a_lower_is_better_target(run_train, tmp_path):
    """Under mirrored on 2 logical CPUs the evaluation is summed over replicas before the comparison."""
    run_train(*TINY, "--cpu_logical_devices=2", "--distribution_strategy=mirrored", "--train_steps=20",
              "--eval_every_steps=4", "--target=val_loss:100", f"--model_dir={tmp_path}")
    metrics = read_metrics(tmp_path)
    assert metrics["num_replicas"] == 2 and metrics["target_reached"] is True
    assert metrics["step_at_target"] == metrics["step"] == 4
    assert [e["step"] for e in read_history(tmp_path, "eval")] == [4]


# Slow (about 30 s: two worker processes).
@pytest.mark.slow
def test_two_workers_stop_at_the_same_step(tmp_path, data_cache):
    """Under multi_worker_mirrored every worker evaluates and the decision is all-reduced: both end at the
    first evaluation, exit 0, and the chief records it."""
    env = {**os.environ, "TFGPU_DATA_CACHE": data_cache, "TF_CPP_MIN_LOG_LEVEL": "2"}
    launch = subprocess.run([sys.executable, "-m", "tfgpu.launch", "--num_workers=2", "--", *TINY, "--train_steps=20",
                             "--eval_every_steps=4", "--target=val_loss:100", f"--model_dir={tmp_path}"], cwd=REPO,
                            env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    assert launch.returncode == 0, launch.stdout[-3000:]
    finals = re.findall(r"^\[worker (\d)\] final: step=(\d+) .*target_reached=(\w+)", launch.stdout, re.M)
    assert sorted(finals) == [("0", "4", "True"), ("1", "4", "True")], launch.stdout[-3000:]
    metrics = read_metrics(tmp_path)
    assert (metrics["num_workers"], metrics["step_at_target"], metrics["target_reached"]) == (2, 4, True)


# -- the tracker (in-process, one worker) --------------------------------------------------------------------------
class _History:
    def __init__(self, eval_steps=()):
        self.eval_steps = set(eval_steps)

    def steps(self, kind):
        assert kind == "eval"
        return self.eval_steps


class _Startup:
    def __init__(self):
        self.marks = []

    def mark(self, phase):
        self.marks.append(phase)


def _tracker(tmp_path, text="val_accuracy:0.9", history=None):
    goal = target.resolve(text, CLASSIFIER) if text else None
    return target.Tracker(goal, time.time() - 5.0, True, str(tmp_path), history or _History(), lambda flag: flag,
                          lambda step: step / 10)


def test_the_tracker_keeps_the_best_value_and_the_first_evaluation_that_reaches_the_target(tmp_path):
    tracker = _tracker(tmp_path)
    assert not tracker.reaches(10, {"val_accuracy": 0.5}) and tracker.best == 0.5 and tracker.hit is None
    assert not tracker.reaches(20, {"val_accuracy": 0.4}) and tracker.best == 0.5
    assert tracker.reaches(30, {"val_accuracy": 0.95})
    assert tracker.hit["step"] == 30 and tracker.hit["epochs"] == 3.0 and tracker.hit["seconds"] >= 5.0
    assert not tracker.reaches(40, {"val_accuracy": 0.99}) and tracker.hit["step"] == 30  # the first one counts
    outcome = tracker.outcome()
    assert (outcome.target, outcome.reached, outcome.step, outcome.epochs) == ("val_accuracy:0.9", True, 30, 3.0)
    untimed = _tracker(tmp_path)
    assert untimed.reaches(30, {"val_accuracy": 0.95}, timed=False) and untimed.hit["seconds"] is None
    assert _tracker(tmp_path, text="").outcome() is None


def test_a_resumed_run_evaluates_an_owed_step_once_recorded_and_a_recorded_one_again_unrecorded(tmp_path):
    calls = []

    def evaluate(step, record):
        calls.append((step, record))
        return {"val_accuracy": 0.5}

    startup = _Startup()
    assert not _tracker(tmp_path).resume(10, evaluate, at_evaluation=False, startup=startup) and calls == []
    assert not _tracker(tmp_path).resume(10, evaluate, at_evaluation=True, startup=startup)
    assert calls == [(10, True)] and startup.marks == ["owed_evaluation"]
    calls.clear()
    recorded = _tracker(tmp_path, history=_History({10}))
    assert not recorded.resume(10, evaluate, at_evaluation=True) and calls == [(10, False)] and recorded.best == 0.5
    calls.clear()
    no_target = _tracker(tmp_path, text="", history=_History({10}))
    assert not no_target.resume(10, evaluate, at_evaluation=True) and calls == []


def test_a_target_metrics_json_records_as_reached_keeps_its_record_and_trains_no_further(tmp_path):
    results.write(str(tmp_path), results.RunResult(
        step=30, target=results.TargetOutcome("val_accuracy:0.9", True, 12.5, 30, 3.0)))
    tracker = _tracker(tmp_path)
    assert tracker.resume(30, lambda step, record: {"val_accuracy": 0.93}, at_evaluation=False)
    assert tracker.hit == {"step": 30, "seconds": 12.5, "epochs": 3.0} and tracker.best == 0.93
    assert tracker.resumed_eval == {"val_accuracy": 0.93}
    assert not _tracker(tmp_path).resume(20, lambda step, record: {}, at_evaluation=False)  # reached at another step
