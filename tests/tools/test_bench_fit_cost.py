"""tools/bench_fit_cost.py: the summary's ratios and verdicts come from the runs' numbers; one real run at a tiny size
prints a JSON line per run and a summary of that structure (slow: three fresh TensorFlow processes)."""
import json
import os
import subprocess
import sys

import pytest

from tests.tools import REPO, load

bench = load("bench_fit_cost")


def _run(round_, runner, ms, startup=5.0, cpu=None, model="tiny"):
    return {"round": round_, "model": model, "runner": runner, "ms_per_step": ms,
            "cpu_ms_per_step": cpu if cpu is not None else ms / 2, "startup_s": startup}


def test_ratios_are_of_the_medians_and_the_paired_range_of_each_round():
    runs = [_run(0, "keras_fit", 2.0), _run(0, "tfgpu_fit", 2.2), _run(1, "keras_fit", 4.0), _run(1, "tfgpu_fit", 4.1),
            _run(2, "keras_fit", 3.0), _run(2, "tfgpu_fit", 3.3)]
    row = bench.summarize(runs)["tiny"]["tfgpu_fit"]
    assert row["ms_per_step"] == 3.3 and row["ratio"] == round(3.3 / 3.0, 3)
    assert row["paired_ratio_range"] == [round(4.1 / 4.0, 3), 1.1]
    assert row["extra_ms_per_step"] == pytest.approx(0.3) and row["verdict"] == "FAIL"  # 0.3 > max(5% of 3, 0.1)


def test_the_bound_is_five_percent_or_a_tenth_of_a_millisecond_and_a_second_of_startup():
    def verdict(keras_ms, mine_ms, keras_start=5.0, mine_start=5.0):
        runs = [_run(0, "keras_fit", keras_ms, keras_start), _run(0, "tfgpu_train", mine_ms, mine_start)]
        return bench.summarize(runs)["tiny"]["tfgpu_train"]["verdict"]

    assert verdict(1.0, 1.09) == "PASS" and verdict(1.0, 1.11) == "FAIL"  # 0.1 ms wins over 5% of 1 ms
    assert verdict(10.0, 10.49) == "PASS" and verdict(10.0, 10.51) == "FAIL"  # 5% wins over 0.1 ms
    assert verdict(1.0, 1.0, 5.0, 5.9) == "PASS" and verdict(1.0, 1.0, 5.0, 6.1) == "FAIL"


@pytest.mark.slow
def test_a_tiny_run_prints_each_run_and_a_summary_computed_from_them(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, os.path.join(REPO, "tools", "bench_fit_cost.py"), "--rounds=1",
                           "--steps_per_call=5", "--epochs=2", "--calls_per_epoch=2", "--models=tiny", "--warmup=0",
                           f"--json_out={out}"], capture_output=True, text=True, timeout=900,
                          env=dict(os.environ, PYTHONPATH=REPO))
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    runs = [json.loads(line) for line in lines if line.startswith("{")]
    assert [r["runner"] for r in runs] == list(bench.RUNNERS)
    for r in runs:
        assert r["steps_timed"] == 15 and r["first_call_steps"] == 5 and r["calls"] == 4
        assert r["ms_per_step"] > 0 and r["cpu_ms_per_step"] > 0 and r["startup_s"] > 0
    summary = json.loads(next(line for line in lines if line.startswith("SUMMARY "))[len("SUMMARY "):])
    keras = next(r for r in runs if r["runner"] == "keras_fit")
    for runner in ("tfgpu_fit", "tfgpu_train"):
        mine = next(r for r in runs if r["runner"] == runner)
        row = summary["tiny"][runner]
        assert row["ratio"] == round(mine["ms_per_step"] / keras["ms_per_step"], 3)
        assert row["extra_startup_s"] == round(mine["startup_s"] - keras["startup_s"], 3)
        assert row["verdict"] in ("PASS", "FAIL") and f"| {runner} | {mine['ms_per_step']:.3f} |" in proc.stdout
    assert json.loads(out.read_text())["summary"] == summary
