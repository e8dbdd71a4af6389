"""python -m tfgpu.plan: bad requests are one line, a finished run's step is read back, each worker is a host of its
own cores, the validation judges the figure the user reads, and (slow, root) that prediction holds on the emulated
cluster network."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tfgpu import plan
from tfgpu.metrics import results
from tfgpu.runtime import run_dir


def write_run(model_dir, step_ms=(900.0, 40.0, 42.0, 41.0), batch=64, params=4_000_000):
    os.makedirs(model_dir)
    with open(run_dir.config_yaml(model_dir), "w") as f:
        f.write(f"global_batch_size: {batch}\nallreduce_dtype: float32\n")
    results.write(model_dir, results.RunResult(parameters=results.ParameterCounts(trainable=params)))
    with open(os.path.join(model_dir, "history.jsonl"), "w") as f:
        for i, ms in enumerate(step_ms):
            f.write(json.dumps({"kind": "train", "step": 10 * (i + 1), "step_time_ms": ms}) + "\n")


@pytest.mark.parametrize("flag, value, message", [
    ("bandwidth", "fast", "--bandwidth: 'fast' is not a bandwidth like 100mbit"),
    ("num_workers", "0,2", "--num_workers: must be positive"),
    ("latency_ms", "-1", "--latency_ms: must be >= 0"),
    ("tolerance", "0", "--tolerance: must be > 0"),
    ("probe_repeats", "-1", "--probe_repeats: must be >= 0"),
])
def test_a_bad_request_is_one_line_naming_the_flag(capsys, flag, value, message):
    assert plan.main(["--dataset=digits", f"--{flag}={value}"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {message}") and "\n" not in err


def test_a_finished_run_is_read_back_and_predicted(tmp_path, capsys, monkeypatch):
    from tfgpu.bench import allreduce_probe

    probed = []

    def probe(num_workers, wire_bytes, repeats, shares):  # the host's all-reduce cost, as two local workers would
        probed.append((num_workers, wire_bytes, repeats))    # measure it
        return allreduce_probe.Probe(num_workers, 0.004, 2e-9)

    monkeypatch.setattr(allreduce_probe, "measure", probe)
    run = str(tmp_path / "run")
    write_run(run)
    out = str(tmp_path / "plan.json")
    assert plan.main(["--dataset=digits", f"--from_model_dir={run}", "--num_workers=1,2,4",
                      "--bandwidth=100mbit,10gbit", f"--output_json={out}"]) == 0
    with open(out) as f:
        result = json.load(f)
    assert result["one_replica"]["step_s"] == pytest.approx(0.041)  # the first loop (tracing) is not timed
    rows = {(r["workers"], r["bandwidth"]): r for r in result["rows"]}
    assert rows[(1, "100mbit")]["efficiency"] == 1.0
    assert rows[(2, "100mbit")]["predicted_step_s"] > rows[(2, "10gbit")]["predicted_step_s"] > 0.041
    assert rows[(4, "100mbit")]["efficiency"] < rows[(2, "100mbit")]["efficiency"] < 1
    # The probe ran once, in this run, around these gradients; its cost is a term of every multi-worker row.
    assert probed == [(2, 16e6, 9)] and result["host_probe"]["fixed_s"] == 0.004
    assert rows[(2, "10gbit")]["terms_s"]["host all-reduce"] == pytest.approx(0.004 + 2e-9 * 16e6)
    assert rows[(4, "10gbit")]["terms_s"]["host all-reduce"] == pytest.approx(3 * 0.004 + 2e-9 * 24e6)
    assert rows[(2, "100mbit")]["dominant"] == "wire" and rows[(2, "10gbit")]["dominant"] == "compute"
    printed = capsys.readouterr().out
    assert "16.0 MB of float32 gradients" in printed and "with --allreduce_dtype=bfloat16" in printed
    assert "no link limit): 4.0 ms fixed + 2.00 ns/byte sent" in printed
    assert "wire dominates" in printed and "compute dominates" in printed


@pytest.mark.parametrize("workers, validate, max_workers, per, usable, expected", [
    # Without --validate a worker's host is this whole machine; with it, an equal share per worker.
    ([2, 4, 8], False, 3, 0, 2, {"cores_per_host": 2, "validate": [], "note": ""}),
    ([2], True, 3, 0, 2, {"cores_per_host": 1, "validate": [2], "note": ""}),
    ([2, 3], True, 3, 0, 8, {"cores_per_host": 2, "validate": [2, 3], "note": ""}),
    ([1, 2], True, 3, 2, 8, {"cores_per_host": 2, "validate": [2], "note": ""}),
    ([1], True, 3, 0, 2, {"cores_per_host": 2, "validate": [], "note": ""}),
])
def test_each_worker_is_a_host_of_its_own_cores(workers, validate, max_workers, per, usable, expected):
    assert plan.hosts(workers, validate, max_workers, per, usable) == expected


def test_more_workers_than_cores_validates_the_largest_count_that_fits_and_says_so():
    got = plan.hosts([2, 3, 8], True, 3, 0, 2)
    assert got["cores_per_host"] == 1 and got["validate"] == [2]
    assert got["note"] == ("validation: 3 workers of 1 core(s) each do not fit in this host's 2 core(s); "
                           "validating 2 workers, the largest count that fits")
    assert plan.hosts([4], True, 3, 2, 5)["validate"] == [2]


def test_a_host_too_small_for_two_emulated_hosts_is_one_line(capsys):
    with pytest.raises(plan.ConfigError, match="--validate: two emulated hosts of 1 core"):
        plan.hosts([2], True, 3, 0, 1)
    assert plan.main(["--dataset=digits", "--cores_per_host=512"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --cores_per_host: 512 cores asked; this process may use") and "\n" not in err


def test_a_validation_without_the_probe_is_one_line(capsys):
    assert plan.main(["--dataset=digits", "--validate", "--probe_repeats=0"]) == 1
    assert capsys.readouterr().err.strip().startswith("error: --probe_repeats: --validate needs the host probe")


def test_a_directory_that_is_no_finished_run_is_one_line(tmp_path, capsys):
    with pytest.raises(Exception, match="is not a finished tfgpu run"):
        plan.read_run(str(tmp_path))


@pytest.mark.slow
def test_the_prediction_holds_on_the_emulated_cluster_where_the_wire_decides(tmp_path):
    if os.geteuid() != 0 or not shutil.which("tc"):
        pytest.skip("needs root and iproute2 for the emulated cluster network")
    out = tmp_path / "plan.json"
    proc = subprocess.run(
        [sys.executable, "-m", "tfgpu.plan", "--flagfile=configs/quickstart.flags",
         "--model=examples/network_bound/wide_mlp.py:build_model", "--num_workers=2", "--bandwidth=100mbit",
         "--measure_steps=16", "--validate", f"--output_json={out}"],
        cwd=REPO, env={**os.environ, "TFGPU_NETEM_PREFIX": "tfgpu-ncplan"}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:]
    row = json.loads(out.read_text())["rows"][0]
    assert abs(row["error"]) < 0.2 and row["error"] == row["predicted_step_s"] / row["measured_step_s"] - 1, row
