"""tfgpu.report: report.md and valid PNG plots from realistic run outputs, partial ones included."""
import dataclasses
import json
import math
import os
import random
import subprocess
import sys

import pytest
import yaml
from PIL import Image

from tfgpu.reporting import report
from tfgpu.metrics import history as history_lib
from tfgpu.metrics import metric_specs, results
from tfgpu.runtime import run_dir

from tests.conftest import REPO

pytestmark = pytest.mark.usefixtures("report_plots")  # the plots drawn, as for a user (the suite leaves them out)


def write_lines(path, records):
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


def declare(model_dir, task):
    """metric_specs.json as the trainer writes it for a run of ``task`` (the registered task's declarations)."""
    from tfgpu.tasks.registry import get_task

    metric_specs.write(str(model_dir), metric_specs.of_task(get_task(task)))


def classification_run(model_dir, steps=3000, loop=100, eval_every=500, resumed_at=None):
    """A ResNet-style history as the trainer writes it: warmup + cosine LR, a slow first (compiling) loop."""
    rng = random.Random(0)
    records, t = [], 1_700_000_000.0
    peak, warmup = 0.4, 500
    for step in range(loop, steps + 1, loop):
        lr = peak * step / warmup if step <= warmup else 0.5 * peak * (1 + math.cos(math.pi * (step - warmup) /
                                                                                       (steps - warmup)))
        first = step == loop
        rate = 900.0 if first else 5200 + rng.gauss(0, 120)
        t += loop * 1024 / rate
        records.append({"kind": "train", "step": step, "time": round(t, 3), "loss": 2.3 * math.exp(-step / 900) +
                        0.05 + rng.uniform(0, 0.03), "accuracy": min(0.99, 0.1 + 0.9 * (1 - math.exp(-step / 700))),
                        "nonfinite_steps": 0, "learning_rate": lr, "examples_per_sec": rate,
                        "step_time_ms": 1024 / rate * 1000})
        if step % eval_every == 0:
            records.append({"kind": "eval", "step": step, "time": round(t + 2, 3),
                            "val_loss": 2.3 * math.exp(-step / 1000) + 0.12, "val_accuracy":
                            min(0.98, 0.1 + 0.85 * (1 - math.exp(-step / 800))), "val_top5_accuracy": 0.99,
                            "eval_time_s": 1.9})
    if resumed_at:  # a crash after step resumed_at + 200, then a resume that logged those steps again
        again = [dict(r, loss=r.get("loss", 0) + 0.001) for r in records if r["kind"] == "train" and
                 resumed_at < r["step"] <= resumed_at + 200]
        records = records[:] + again
        records.sort(key=lambda r: r["time"])
    write_lines(os.path.join(model_dir, "history.jsonl"), records)
    declare(model_dir, "classification")
    config = {"task": "classification", "model": "resnet20", "dataset": "digits", "data_dir": "",
              "global_batch_size": 1024, "precision": "mixed_bfloat16", "distribution_strategy": "mirrored",
              "train_steps": steps, "optimizer": "sgd", "base_learning_rate": 0.1, "lr_schedule": "cosine",
              "warmup_steps": warmup, "data_workers": 0, "cache": False, "jit_compile": True, "seed": 42}
    with open(run_dir.config_yaml(model_dir), "w") as f:
        f.write("# Effective tfgpu config; rerun with --config=<this file>.\n" + yaml.safe_dump(config))
    last_eval = [r for r in records if r["kind"] == "eval"][-1]
    metrics = {"step": steps, "train_loss": 0.08, "train_accuracy": 0.985, "val_loss": last_eval["val_loss"],
               "val_accuracy": last_eval["val_accuracy"], "val_top5_accuracy": 0.99, "examples_per_sec": 5203.4,
               "task": "classification", "model": "resnet20", "precision": "mixed_bfloat16",
               "strategy": "mirrored", "num_replicas": 8, "num_workers": 1, "global_batch_size": 1024,
               "wall_time_s": 640.2}
    with open(os.path.join(model_dir, "metrics.json"), "w") as f:
        json.dump(metrics, f)
    return records


def gan_run(model_dir, steps=2000, loop=100):
    rng = random.Random(1)
    records = []
    for step in range(loop, steps + 1, loop):
        records.append({"kind": "train", "step": step, "time": 1e9 + step, "d_loss": 1.25 + rng.gauss(0, 0.08),
                        "g_loss": 0.9 + step / 2000 + rng.gauss(0, 0.1), "d_real": 0.6 + rng.gauss(0, 0.02),
                        "d_fake": 0.35 + rng.gauss(0, 0.02), "nonfinite_steps": 0, "learning_rate_g": 2e-4,
                        "learning_rate_d": 2e-4, "loss_scale_g": 32768.0 if step < 1000 else 65536.0,
                        "loss_scale_d": 32768.0, "examples_per_sec": 3000 + rng.gauss(0, 50),
                        "step_time_ms": 21.3})
        if step % 500 == 0:
            records.append({"kind": "eval", "step": step, "time": 1e9 + step + 1, "fid": 300 * math.exp(-step / 700)
                            + 35, "kid": 0.3 * math.exp(-step / 700) + 0.02, "kid_std": 0.002,
                            "feature_extractor": "inception_v3", "fid_initial": 410.0, "fid_num_samples": 2000,
                            "samples": os.path.join(model_dir, "samples", f"step_{step}.png"),
                            "sampled_with": "ema"})
    write_lines(os.path.join(model_dir, "history.jsonl"), records)
    declare(model_dir, "gan")
    with open(run_dir.config_yaml(model_dir), "w") as f:
        yaml.safe_dump({"task": "gan", "model": "dcgan", "dataset": "synthetic", "gan_loss": "non_saturating",
                        "precision": "mixed_float16", "global_batch_size": 64, "train_steps": steps}, f)
    os.makedirs(os.path.join(model_dir, "samples"))
    Image.new("RGB", (64, 64), (40, 90, 160)).save(os.path.join(model_dir, "samples", f"step_{steps}.png"))
    return records


def check_png(path, min_size=(500, 250)):
    with Image.open(path) as image:
        image.verify()  # a truncated or corrupt file raises
    with Image.open(path) as image:
        assert image.format == "PNG"
        assert image.width >= min_size[0] and image.height >= min_size[1], image.size
        colors = image.convert("L").getextrema()
        assert colors[0] < colors[1]  # something was drawn, not a blank canvas


def test_classification_report(tmp_path):
    classification_run(tmp_path)
    with open(tmp_path / "input_profile.json", "w") as f:
        json.dump({"input_examples_per_sec": 3100.0, "compute_examples_per_sec": 8400.0,
                   "train_examples_per_sec": 5208.0, "input_wait_fraction": 0.38}, f)
    path = report.write_report(str(tmp_path))
    assert path == str(tmp_path / "report.md")
    text = (tmp_path / "report.md").read_text()
    assert text.startswith(f"# Run report: {tmp_path.name}\n")
    assert "classification resnet20 on digits (precision=mixed_bfloat16, strategy=mirrored, num_replicas=8" in text
    assert "Last step 3000 of 3000; wall time 640 s." in text
    assert ("input-bound: 38% of step time waiting for data; raise --data_workers or use --cache (or store "
            "smaller images).") in text
    assert "| input pipeline alone | 3,100 |" in text and "| training | 5,208 |" in text
    assert "| val_accuracy | 0.9" in text and "| examples_per_sec | 5,203.4 |" in text
    assert "| model |" not in text.split("## Final metrics")[1].split("##")[0]
    # throughput: the median of loops 2.. excludes the compiling first loop (900 ex/s)
    assert "over 29 loop(s) of steps (the first loop, which may include tracing and compilation, excluded)" in text
    median = float(text.split("Median ")[1].split(" examples/sec")[0].replace(",", ""))
    assert 4900 < median < 5500
    assert "| base_learning_rate | 0.1 |" in text and "| warmup_steps | 500 |" in text
    for name in ("loss", "accuracy", "learning_rate", "throughput"):
        assert f"(plots/{name}.png)" in text
        check_png(tmp_path / "plots" / f"{name}.png")
    assert not (tmp_path / "plots" / "gan_losses.png").exists() and not (tmp_path / "plots" / "fid.png").exists()
    assert "## Notes" not in text
    assert not [p for p in os.listdir(tmp_path / "plots") if p.endswith(".tmp")]
    assert f"TensorBoard: `tensorboard --logdir {tmp_path / 'summaries'}`" in text


def test_gan_report(tmp_path):
    records = gan_run(tmp_path)
    report.write_report(str(tmp_path))
    text = (tmp_path / "report.md").read_text()
    for name in ("gan_losses", "fid", "learning_rate", "throughput"):
        check_png(tmp_path / "plots" / f"{name}.png")
    assert not (tmp_path / "plots" / "accuracy.png").exists() and not (tmp_path / "plots" / "loss.png").exists()
    assert "![generated samples](samples/step_2000.png)" in text
    assert "input-bound: not measured; rerun with --profile_input" in text
    assert "## Latest logged metrics (no metrics.json)" in text
    assert "| fid | " in text and "| d_loss | " in text
    assert "| gan_loss | non_saturating |" in text
    # Every FID is reported with what it was measured with: extractor and sample count.
    last = [r for r in records if r["kind"] == "eval"][-1]
    assert (f"FID {last['fid']:.4g} and KID {last['kid']:.4g} at N=2,000 generated and 2,000 real images, "
            "features: `inception_v3`") in text
    assert "compares only with FIDs from the same extractor and the same N" in text
    with Image.open(tmp_path / "plots" / "learning_rate.png") as two_panels, \
            Image.open(tmp_path / "plots" / "throughput.png") as also_two:
        assert two_panels.height == also_two.height  # the varying float16 loss scale gets its own panel


def test_resumed_history_keeps_one_point_per_step(tmp_path):
    classification_run(tmp_path, resumed_at=1000)
    with open(tmp_path / "history.jsonl", "a") as f:
        f.write('{"kind": "train", "step": 3100, "loss": 0.')  # killed mid-write
    history, bad = history_lib.read_by_kind(str(tmp_path))
    steps = [r["step"] for r in history["train"]]
    assert steps == sorted(set(steps)) and len(steps) == 30 and bad == 1
    assert history["train"][10]["loss"] == pytest.approx(
        [r for r in history["train"] if r["step"] == 1100][0]["loss"])
    report.write_report(str(tmp_path))
    assert "history.jsonl has 1 unreadable line(s), skipped" in (tmp_path / "report.md").read_text()


def test_the_report_lists_every_config_change_a_resume_was_allowed_to_make(tmp_path):
    """Two fields changed at one resume and one more at a later resume at the same step (nothing trained in
    between): config changes are events, so none of them is lost to the one-point-per-step rule."""
    classification_run(tmp_path, steps=600)
    with open(tmp_path / "history.jsonl", "a") as f:
        for field, old, new in (("global_batch_size", 128, 64), ("lr_decay_epochs", [30.0], [30.0, 60.0]),
                                ("augment", "none", "flip|crop")):
            f.write(json.dumps({"kind": "config_change", "step": 600, "time": 0, "field": field, "old": old,
                                "new": new}) + "\n")
    report.write_report(str(tmp_path))
    text = (tmp_path / "report.md").read_text()
    section = text.split("## Config changes\n\n")[1].split("\n\n## ")[0]
    assert section.splitlines()[-3:] == ["| 600 | global_batch_size | 128 | 64 |",
                                         "| 600 | lr_decay_epochs | 30 | 30, 60 |",
                                         "| 600 | augment | none | flip/crop |"]


def test_missing_and_partial_files(tmp_path):
    # Nothing but a config: a run that has not logged yet.
    (tmp_path / run_dir.CONFIG_FILE).write_text("task: classification\nmodel: resnet20\n")
    report.write_report(str(tmp_path))
    text = (tmp_path / "report.md").read_text()
    assert "history.jsonl is missing or empty: no curves to plot" in text
    assert "No metrics.json yet (the run is still going" in text
    assert not (tmp_path / "plots").exists()
    # Only metrics.json, with a non-finite loss, and a broken config.yaml.
    other = tmp_path / "other"
    other.mkdir()
    (other / "metrics.json").write_text('{"step": 7, "train_loss": NaN, "val_accuracy": 0.5}')
    (other / run_dir.CONFIG_FILE).write_text("{unclosed: [")
    report.write_report(str(other))
    text = (other / "report.md").read_text()
    assert "| val_accuracy | 0.5 |" in text and "| train_loss | nan |" not in text
    assert "config.yaml is missing or unreadable" in text and "Last step 7." in text
    # History lines with only some keys: only what exists is plotted.
    third = tmp_path / "third"
    third.mkdir()
    declare(third, "classification")
    write_lines(third / "history.jsonl", [{"kind": "train", "step": s, "loss": 1.0 / s} for s in (10, 20, 30)])
    report.write_report(str(third))
    assert sorted(os.listdir(third / "plots")) == ["loss.png"]
    check_png(third / "plots" / "loss.png")


def test_report_plots_0_writes_the_report_without_its_plots_and_another_value_is_refused(tmp_path, monkeypatch):
    declare(tmp_path, "classification")
    write_lines(tmp_path / "history.jsonl", [{"kind": "train", "step": s, "loss": 1.0 / s} for s in (10, 20, 30)])
    monkeypatch.setenv("TFGPU_REPORT_PLOTS", "0")
    report.write_report(str(tmp_path))
    text = (tmp_path / "report.md").read_text()
    assert not (tmp_path / "plots").exists() and "## Plots" not in text
    assert "| loss | 0.0333 |" in text  # the rest of the report as ever
    monkeypatch.setenv("TFGPU_REPORT_PLOTS", "no")
    with pytest.raises(ValueError, match=r"^TFGPU_REPORT_PLOTS must be 0 \(no plots\) or 1, got 'no'$"):
        report.write_report(str(tmp_path))


def test_the_plots_follow_the_declarations_and_an_older_run_falls_back_to_its_task(tmp_path):
    """The report draws what metric_specs.json declares; a run from before that file gets its task's
    declarations through config.yaml's task."""
    classification_run(tmp_path)
    declared = metric_specs.read(str(tmp_path))
    renamed = [dataclasses.replace(s, plot="curves", title="Curves") if s.plot == "loss" else s
               for s in declared.metrics]
    metric_specs.write(str(tmp_path), dataclasses.replace(declared, metrics=tuple(renamed)))
    report.write_report(str(tmp_path))
    assert "![Curves](plots/curves.png)" in (tmp_path / "report.md").read_text()
    assert not (tmp_path / "plots" / "loss.png").exists()
    os.remove(tmp_path / metric_specs.SPECS_FILE)
    report.write_report(str(tmp_path))
    text = (tmp_path / "report.md").read_text()
    for name in ("loss", "accuracy", "learning_rate", "throughput"):
        assert f"(plots/{name}.png)" in text
    assert "| val_accuracy | " in text.split("## Best evaluation")[1]


def test_input_verdicts():
    assert report.input_verdict({"input_wait_fraction": 0.05}) == "not input-bound: 5% of step time waiting for data"
    assert report.input_verdict({"input_wait_fraction": 0.38}).startswith("input-bound: 38% of step time")
    assert report.input_verdict({"verdict": "input-bound: 12% of step time waiting for data; raise x"}) == \
        "input-bound: 12% of step time waiting for data; raise x"  # an older profile: the trainer's own words
    assert report.input_verdict(None).startswith("input-bound: not measured")


def test_command_line(tmp_path):
    classification_run(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "tfgpu.report", f"--model_dir={tmp_path}"], cwd=REPO, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(tmp_path / "report.md")
    check_png(tmp_path / "plots" / "loss.png")
    empty = tmp_path / "empty"
    empty.mkdir()
    for args, message in (([f"--model_dir={empty}"], "not a tfgpu run directory"),
                          ([f"--model_dir={tmp_path}/nope"], "is not a directory"), ([], "--model_dir")):
        proc = subprocess.run([sys.executable, "-m", "tfgpu.report", *args], cwd=REPO, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
        assert proc.returncode == 1 and message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


# Slow (19 s): tests/tasks/test_base.py trains a toy task in-process and reads its report; the other tests here
# build reports from written runs.
@pytest.mark.slow
def test_a_short_training_run_ends_with_a_report(run_train, tmp_path):
    """The chief writes report.md and valid plots at the end of a real run (the trainer calls write_report)."""
    model_dir = tmp_path / "run"
    run_train("--flagfile=configs/quickstart.flags", f"--model_dir={model_dir}", "--train_steps=40",
              "--steps_per_loop=10", "--eval_every_steps=20", "--checkpoint_every_steps=0", "--profile_input")
    text = (model_dir / "report.md").read_text()
    profile = json.loads((model_dir / "input_profile.json").read_text())
    verdict = text.split("## Input pipeline\n\n")[1].splitlines()[0]
    assert verdict.startswith(report.input_verdict(profile)) and f"{profile['input_wait_fraction']:.0%}" in verdict
    assert "classification resnet20 on digits" in text and "Last step 40 of 40" in text
    assert "| val_accuracy | " in text
    for name in ("loss", "accuracy", "learning_rate", "throughput"):
        check_png(model_dir / "plots" / f"{name}.png")


def test_verdict_when_the_pipeline_outruns_the_step():
    fast_input = {"input_examples_per_sec": 19439.0, "compute_examples_per_sec": 2801.0,
                  "train_examples_per_sec": 2087.0, "input_wait_fraction": 0.25}
    assert report.input_verdict(fast_input) == (
        "input-bound: 25% of step time waiting for data, although the pipeline alone is 6.9x faster than the step; "
        "try --cache or a larger --steps_per_loop before more --data_workers")
    assert report.contention_note(fast_input).startswith(
        "The pipeline alone delivers 19,439 examples/sec and the step alone consumes 2,801")
    slow_input = dict(fast_input, input_examples_per_sec=2000.0)
    assert report.contention_note(slow_input) == ""
    assert report.input_verdict(slow_input).endswith("; raise --data_workers or use --cache (or store smaller images)")
    assert report.contention_note(dict(fast_input, input_wait_fraction=0.05)) == ""
    assert report.contention_note(None) == ""


def test_the_report_says_in_one_line_whether_the_target_was_reached(tmp_path):
    reached = results.RunResult(step=440, target=results.TargetOutcome("val_accuracy:0.97", True, 62.04, 440, 19.57))
    text = report.render(str(tmp_path), {}, 0, reached, {"train_steps": 675}, None, [])
    assert "Target val_accuracy >= 0.97 reached at step 440 (19.57 epochs) in 62.0 s." in text.splitlines()
    missed = results.RunResult(step=675, target=results.TargetOutcome("val_loss:0.01", False))
    text = report.render(str(tmp_path), {}, 0, missed, {"train_steps": 675}, None, [])
    assert "Target val_loss <= 0.01 not reached in 675 steps." in text.splitlines()
    assert "arget" not in report.render(str(tmp_path), {}, 0, results.RunResult(step=3), {}, None, [])


def test_a_resume_on_another_topology_is_one_line_of_the_report(tmp_path):
    change = {"kind": "topology", "step": 30, "epoch": 1, "records_consumed_in_epoch": 720, "records": 1438,
              "before": {"num_workers": 2, "replicas_per_worker": 1, "global_batch_size": 24, "batches_per_step": 1},
              "after": {"num_workers": 1, "replicas_per_worker": 2, "global_batch_size": 24, "batches_per_step": 1}}
    text = report.render(str(tmp_path), {"topology": [change]}, 0, results.RunResult(step=60), {}, None, [])
    assert ("## Topology changes\n\n- step 30: 2 worker(s) x 1 replica(s), global batch 24 -> 1 worker(s) x 2 "
            "replica(s), global batch 24; epoch 1 resumed at record 720 of 1,438, the rest of it read once\n") in text
    assert "Topology" not in report.render(str(tmp_path), {}, 0, results.RunResult(step=60), {}, None, [])


def test_a_metrics_json_that_is_not_tfgpus_is_a_note_naming_it_not_a_run_still_going(tmp_path):
    """A metrics.json the run did not write (a list, here) is named in the report's notes; before, the report
    said the run had none yet, as if it were still going."""
    (tmp_path / run_dir.CONFIG_FILE).write_text("task: classification\nmodel: resnet20\n")
    (tmp_path / "metrics.json").write_text("[0.97]")
    report.write_report(str(tmp_path))
    text = (tmp_path / "report.md").read_text()
    assert f"- {tmp_path / 'metrics.json'} is not a tfgpu metrics.json: it holds a list, not an object." in text
    assert "No metrics.json yet" not in text


def test_each_restart_of_the_launcher_is_one_line_even_two_from_one_checkpoint(tmp_path):
    records = [{"kind": "restart", "step": 100, "time": 1.0 + i, "restart": i + 1, "worker": 1,
                "reason": "was killed by SIGKILL (exit 137)", "last_step": 120 + i, "workers_before": 3 - i,
                "workers_after": 2, "steps_lost": 20 + i} for i in range(2)]
    (tmp_path / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    history, bad = history_lib.read_by_kind(str(tmp_path))
    assert bad == 0 and len(history["restart"]) == 2  # both resumed from step 100: neither replaces the other
    text = report.render(str(tmp_path), history, 0, results.RunResult(step=450), {}, None, [])
    assert ("## Restarts\n\n- restart 1: worker 1 was killed by SIGKILL (exit 137) after step 120; 3 -> 2 workers, "
            "resumed from step 100 (20 steps lost)\n- restart 2: worker 1 was killed by SIGKILL (exit 137) after "
            "step 121; 2 -> 2 workers, resumed from step 100 (21 steps lost)\n") in text


def test_a_report_section_whose_module_is_a_file_inside_the_run_directory_is_a_note_not_run(tmp_path, monkeypatch):
    """metric_specs.json names the report's sections as module:function; a module found inside the run directory
    (e.g. the report started there: sys.path[0] is the current directory) is not imported, and the note says so."""
    classification_run(tmp_path)
    (tmp_path / "planted.py").write_text("open(__file__ + '.ran', 'w').close()\ndef section(m, e): return ['x']\n")
    declare(tmp_path, "classification")
    declared = metric_specs.read(str(tmp_path))
    metric_specs.write(str(tmp_path), dataclasses.replace(declared, report_sections=("planted:section",)))
    monkeypatch.syspath_prepend(str(tmp_path))
    text = (tmp_path / "report.md").read_text() if report.write_report(str(tmp_path)) else ""
    assert f"report section planted:section not run: its module is a file inside the run directory " \
           f"({tmp_path}/planted.py)" in text
    assert not (tmp_path / "planted.py.ran").exists()
