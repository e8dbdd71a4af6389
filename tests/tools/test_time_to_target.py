"""tools/time_to_target.py: flag checks, the alternating order, the commands, and the ratio with its spread
(in-process); the whole race against plain Keras fit is marked slow."""
import json
import os
import subprocess
import sys

import pytest

from tfgpu.metrics import results
from tests.tools import load

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


ttt = load("time_to_target")
fit_script = load("keras_fit_to_target")


def _run(repeat, side, seconds, **extra):
    return {"repeat": repeat, "side": side, "target_reached": seconds is not None, "time_to_target_s": seconds,
            "process_wall_s": (seconds or 0) + 5, "load_before": 1.0, **extra}


def test_ratio_is_the_median_of_paired_repeats_with_its_min_and_max():
    runs = [_run(0, "tfgpu", 40.0), _run(0, "fit", 80.0), _run(1, "fit", 100.0), _run(1, "tfgpu", 60.0),
            _run(2, "tfgpu", 30.0), _run(2, "fit", 100.0)]
    summary = ttt.summarize(runs)
    assert summary["ratios"] == [0.5, 0.6, 0.3]
    assert summary["ratio_tfgpu_over_fit"] == {"median": 0.5, "min": 0.3, "max": 0.6, "n": 3}
    assert summary["time_to_target_s"]["tfgpu"] == {"median": 40.0, "min": 30.0, "max": 60.0, "n": 3}
    text = ttt.format_summary(summary, "val_accuracy:0.97")
    assert "tfgpu/fit time-to-target ratio: 0.500 (min-max 0.300-0.600 over 3 paired repeats; < 1 = tfgpu faster)" \
        in text
    assert "  fit  : 100.0 s (80.0-100.0, n=3)" in text


def test_the_wait_for_the_process_is_reported_beside_the_time_to_target():
    runs = [_run(0, "tfgpu", 40.0, process_wall_s=52.0, after_target_s=12.0),
            _run(0, "fit", 80.0, process_wall_s=84.0, after_target_s=4.0),
            _run(1, "fit", 100.0, process_wall_s=104.0, after_target_s=4.0),
            _run(1, "tfgpu", 60.0, process_wall_s=80.0, after_target_s=20.0)]
    summary = ttt.summarize(runs)
    assert summary["after_target_s"]["tfgpu"] == {"median": 16.0, "min": 12.0, "max": 20.0, "n": 2}
    assert summary["process_wall_ratio_tfgpu_over_fit"]["max"] == round(80 / 104, 3)
    text = ttt.format_summary(summary, "val_accuracy:0.97")
    assert "  tfgpu: 66.0 s (52.0-80.0); 16.0 s (12.0-20.0) after the target" in text
    assert "tfgpu/fit process wall-time ratio: 0.694 (min-max 0.619-0.769)" in text
    assert "40.0 s to target (step 225, 10.01 epochs), 12.0 s after it; process 52.0 s" in ttt.describe_run(
        {**runs[0], "step_at_target": 225, "epochs_at_target": 10.01})


def test_a_run_that_misses_the_target_is_reported_and_left_out_of_the_ratios():
    runs = [_run(0, "tfgpu", 40.0), _run(0, "fit", None, error="exit 1: boom"), _run(1, "fit", 50.0),
            _run(1, "tfgpu", 45.0)]
    summary = ttt.summarize(runs)
    assert summary["ratios"] == [0.9] and summary["missed"] == {"tfgpu": 0, "fit": 1}
    assert "1 run(s) missed it" in ttt.format_summary(summary, "val_accuracy:0.97")
    assert "target not reached (exit 1: boom)" in ttt.describe_run({**runs[1], "process_wall_s": 3.0})
    none = ttt.summarize([_run(0, "tfgpu", None), _run(0, "fit", 10.0)])
    assert none["ratio_tfgpu_over_fit"] is None
    assert "ratio: none (no repeat where both sides reached the target)" in ttt.format_summary(none, "t")


def test_sides_alternate_and_run_the_commands_a_user_would():
    assert [ttt.order(i) for i in range(3)] == [("tfgpu", "fit"), ("fit", "tfgpu"), ("tfgpu", "fit")]
    args = ttt.parser().parse_args(["--target=val_accuracy:0.97", "--tfgpu_flag=--precision=float32"])
    cmds = ttt.commands(args, "/w", 1)
    tfgpu_cmd, metrics = cmds["tfgpu"]
    assert tfgpu_cmd[1:4] == ["-m", "tfgpu.train", f"--flagfile={REPO}/configs/quickstart.flags"]
    assert tfgpu_cmd[4:] == ["--target=val_accuracy:0.97", "--model_dir=/w/tfgpu1", "--precision=float32"]
    assert metrics == "/w/tfgpu1/metrics.json"
    fit_cmd, fit_json = cmds["fit"]
    assert fit_cmd[1].endswith("tools/keras_fit_to_target.py") and "--batch_size=128" in fit_cmd
    assert "--label_smoothing=0.0" in fit_cmd  # fit as users write it, unless asked for the recipe's smoothing
    assert "--jit_compile=auto" in fit_cmd and "--dataset=digits" in fit_cmd  # the flagfile's data
    assert "--precision=float32" in fit_cmd  # whatever tfgpu's --precision=auto picks on this host
    assert fit_json == "/w/fit1.json"
    smoothed = ttt.parser().parse_args(["--target=val_accuracy:0.97", "--fit_label_smoothing=0.1"])
    assert "--label_smoothing=0.1" in ttt.commands(smoothed, "/w", 1)["fit"][0]


def test_both_sides_train_on_the_flagfiles_dataset_or_on_the_one_named():
    mnist = ttt.parser().parse_args(["--target=val_accuracy:0.97", "--flagfile=configs/mnist5k.flags",
                                     "--fit_jit_compile=true"])
    cmds = ttt.commands(mnist, "/w", 0)
    assert not any(a.startswith("--dataset") for a in cmds["tfgpu"][0])  # the flagfile says it
    assert "--dataset=mnist5k" in cmds["fit"][0] and "--jit_compile=true" in cmds["fit"][0]
    recipe = ttt.parser().parse_args(["--target=val_accuracy:0.97", "--fit_weight_decay=5e-4",
                                      "--fit_warmup_epochs=1", "--fit_precision=mixed_bfloat16"])
    fit_cmd = ttt.commands(recipe, "/w", 0)["fit"][0]
    assert "--weight_decay=0.0005" in fit_cmd and "--warmup_epochs=1.0" in fit_cmd
    assert "--precision=mixed_bfloat16" in fit_cmd
    named = ttt.parser().parse_args(["--target=val_accuracy:0.97", "--dataset=mnist5k"])
    cmds = ttt.commands(named, "/w", 0)
    assert "--dataset=mnist5k" in cmds["tfgpu"][0] and "--dataset=mnist5k" in cmds["fit"][0]


def test_the_flagfiles_dataset_is_read_as_tfgpu_train_reads_it(tmp_path):
    (tmp_path / "base.flags").write_text("# the data\n--dataset=digits\n")
    (tmp_path / "job.flags").write_text("--flagfile=base.flags\n--dataset=mnist5k\n--epochs=2\n")
    (tmp_path / "inherit.flags").write_text("--flagfile=job.flags\n--seed=3\n")
    assert ttt.flagfile_dataset(str(tmp_path / "job.flags")) == "mnist5k"  # the last one wins
    args = ttt.parser().parse_args(["--target=val_accuracy:0.97", f"--flagfile={tmp_path / 'inherit.flags'}"])
    assert "--dataset=mnist5k" in ttt.commands(args, "/w", 0)["fit"][0]  # through a nested flagfile
    (tmp_path / "broken.flags").write_text("--flagfile=missing.flags\n")
    assert ttt.main(["--target=val_accuracy:0.97", f"--flagfile={tmp_path / 'broken.flags'}"]) == 1


def test_both_sides_results_are_read_the_same_way(tmp_path):
    results.write(str(tmp_path), results.RunResult(
        values={"val_loss": 0.1}, target=results.TargetOutcome("val_accuracy:0.97", True, 57.0, 225, 10.01),
        facts=results.RunFacts(precision="mixed_bfloat16")))
    outcome = ttt.read_outcome("tfgpu", results.path(str(tmp_path)))
    assert outcome == {"target": "val_accuracy:0.97", "target_reached": True, "time_to_target_s": 57.0,
                       "epochs_at_target": 10.01, "step_at_target": 225, "precision": "mixed_bfloat16"}
    line = ttt.describe_run({**outcome, "side": "tfgpu", "repeat": 0, "process_wall_s": 60.0, "load_before": 1.0})
    assert line.startswith("repeat 0 tfgpu (mixed_bfloat16): 57.0 s to target"), line  # which precision raced


@pytest.mark.parametrize("args, flag", [
    (["--target=val_accuracy"], "--target"),
    (["--target=val_accuracy:0.97", "--repeats=0"], "--repeats"),
    (["--target=val_accuracy:0.97", "--flagfile=configs/nope.flags"], "--flagfile"),
    (["--target=val_accuracy:0.97", "--tfgpu_flag=--model_dir=/x"], "--tfgpu_flag"),
    (["--target=val_accuracy:0.97", "--tfgpu_flag=--dataset=mnist5k"], "--tfgpu_flag"),
    (["--target=val_accuracy:0.97", "--dataset=cifar10"], "--dataset"),
    (["--target=val_accuracy:0.97", "--flagfile=configs/cifar10_resnet56.flags"], "--flagfile"),
    (["--target=val_accuracy:0.97", "--fit_learning_rate=0"], "--fit_learning_rate"),
    (["--target=val_accuracy:0.97", "--fit_label_smoothing=1"], "--fit_label_smoothing"),
    (["--target=val_accuracy:0.97", "--fit_weight_decay=-1e-4"], "--fit_weight_decay"),
    (["--target=val_accuracy:0.97", "--fit_warmup_epochs=30"], "--fit_warmup_epochs"),
    (["--target=val_accuracy:0.97", "--output_json=/nonexistent/dir/t.json"], "--output_json"),
])
def test_bad_flags_are_one_line_before_any_run(args, flag, capsys):
    assert ttt.main(args) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {flag}"), err


def test_the_fit_script_reads_the_target_as_tfgpu_does():
    assert fit_script.parse_target("val_accuracy:0.97") == ("val_accuracy", 0.97, False)
    assert fit_script.parse_target("accuracy:0.9") == ("val_accuracy", 0.9, False)
    assert fit_script.parse_target("val_loss:0.2") == ("val_loss", 0.2, True)
    with pytest.raises(ValueError, match="--target"):
        fit_script.parse_target("val_accuracy")


def test_the_fit_scripts_weight_decay_is_l2_on_the_kernels_it_is_given():
    import keras
    import numpy as np

    kernel = keras.Variable(np.array([[1.0, 2.0]], np.float32))
    loss = fit_script.with_l2(lambda y_true, y_pred: keras.ops.convert_to_tensor(0.25), [kernel], 0.1)
    assert float(loss(None, None)) == pytest.approx(0.25 + 0.5 * 0.1 * (1.0 + 4.0))


# Slow (about 2 minutes on 2 cores): both sides train ResNet-20 on the digits to a low target, fit in Keras's
# mixed_bfloat16 policy.
@pytest.mark.slow
def test_the_race_end_to_end(tmp_path):
    out = tmp_path / "ttt.json"
    proc = subprocess.run([sys.executable, os.path.join(REPO, "tools", "time_to_target.py"),
                           "--target=val_accuracy:0.5", "--repeats=1", "--tfgpu_flag=--eval_every_steps=0",
                           "--tfgpu_flag=--precision=float32", "--fit_precision=mixed_bfloat16",
                           f"--output_json={out}"],
                          cwd=REPO, text=True, capture_output=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads(out.read_text())
    assert [(r["side"], r["precision"]) for r in report["runs"]] == [("tfgpu", "float32"), ("fit", "mixed_bfloat16")]
    assert all(r["target_reached"] and 0 < r["time_to_target_s"] <= r["process_wall_s"] for r in report["runs"])
    assert report["summary"]["ratio_tfgpu_over_fit"]["n"] == 1
    assert "tfgpu/fit time-to-target ratio:" in proc.stdout
