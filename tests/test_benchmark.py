"""tfgpu.benchmark: the acceptance command end to end on a tiny CPU case, lists, flag errors, auto batch search,
and the arithmetic of ratios, spread and MFU."""
import argparse
import json
import os
import subprocess
import sys
import time

import pytest

from tfgpu import benchmark
from tfgpu.config import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Tiny and short: 3 timed windows of 5 steps after 5 warmup steps (one tfgpu loop each).
TINY = ["--model=small_cnn", "--image_size=16", "--warmup_steps=5", "--steps_per_window=5", "--windows=3",
        "--steps_per_loop=5"]


def run_benchmark(*args, timeout=300):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    started = time.time()
    proc = subprocess.run([sys.executable, "-m", "tfgpu.benchmark", *args], cwd=REPO, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
    proc.seconds = time.time() - started
    return proc


def load(path):
    with open(path) as f:
        return json.load(f)


def test_acceptance_command_writes_results_and_ratio(tmp_path):
    out = tmp_path / "bench.json"
    proc = run_benchmark(*TINY, "--batch_size=32", "--precision=float32", "--baseline=keras_fit",
                         f"--output_json={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = load(out)
    by_name = {r["name"]: r for r in report["results"]}
    assert set(by_name) == {"tfgpu", "keras_fit"}
    for r in by_name.values():
        assert r["status"] == "ok"
        assert r["batch_size"] == 32 and r["precision"] == "float32"
        assert r["examples_per_sec_min"] <= r["examples_per_sec"] <= r["examples_per_sec_max"]
        assert len(r["window_examples_per_sec"]) == 3
        # Three windows: the median window's step time is the median rate's.
        assert r["step_time_ms"] == pytest.approx(1000 * 32 / r["examples_per_sec"], rel=1e-6)
        assert len(r["window_cpu_seconds"]) == 3 and r["cpu_ms_per_step"] > 0
        assert r["memory_kind"] == "host_peak_rss_bytes" and r["peak_memory_bytes"] > 50 * 2**20
        assert r["mfu"] is None  # no known peak on a CPU
        # Two 3x3 convs (16x16x32 from 3 channels, 8x8x64 from 32) and a 64x10 dense layer.
        assert r["macs_per_example"] == 16 * 16 * 32 * 27 + 8 * 8 * 64 * 288 + 64 * 10
    assert by_name["tfgpu"]["strategy"] == "one_device" and by_name["tfgpu"]["steps_per_loop"] == 5
    assert by_name["keras_fit"]["steps_per_execution"] == 1
    expected = by_name["tfgpu"]["examples_per_sec"] / by_name["keras_fit"]["examples_per_sec"]
    assert report["ratios"]["tfgpu/keras_fit"] == pytest.approx(expected, rel=1e-3)
    assert list(report["ratios"]) == ["tfgpu/keras_fit"]
    cpu_expected = by_name["keras_fit"]["cpu_ms_per_step"] / by_name["tfgpu"]["cpu_ms_per_step"]
    assert report["cpu_time_ratios"]["tfgpu/keras_fit"] == pytest.approx(cpu_expected, rel=1e-3)
    assert report["environment"]["tensorflow"] and report["environment"]["cpu_count"]
    assert "tfgpu/keras_fit = " in proc.stdout and "keras_fit " in proc.stdout


def test_batch_and_precision_lists_give_the_cross_product(tmp_path):
    out = tmp_path / "bench.json"
    proc = run_benchmark(*TINY, "--batch_size=16,32", "--precision=float32,mixed_bfloat16", "--baseline=none",
                         f"--output_json={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = load(out)
    cases = sorted((r["name"], r["batch_size"], r["precision"]) for r in report["results"])
    assert cases == [("tfgpu", b, p) for b in (16, 32) for p in ("float32", "mixed_bfloat16")]
    assert all(r["examples_per_sec"] > 0 for r in report["results"])
    assert set(report["ratios"]) == {"tfgpu:mixed_bfloat16/float32@batch_size=16",
                                     "tfgpu:mixed_bfloat16/float32@batch_size=32"}


def test_bad_model_fails_with_one_line_before_any_measurement(tmp_path):
    proc = run_benchmark("--model=resnet_nope", "--output_json=" + str(tmp_path / "b.json"), timeout=120)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: --model: unknown model 'resnet_nope'") and "resnet20" in last
    assert "[1]" not in proc.stderr  # no child was started
    assert not (tmp_path / "b.json").exists()


def test_an_error_found_in_the_child_is_one_line_naming_the_benchmark_flag(tmp_path):
    proc = run_benchmark("--model=small_cnn", "--image_size=16", "--batch_size=3", "--cpu_logical_devices=2",
                         "--distribution_strategy=mirrored", "--output_json=" + str(tmp_path / "b.json"))
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == "error: --batch_size: 3 is not divisible by the 2 replicas"
    assert "[2]" not in proc.stderr  # stopped after the first measurement
    assert not (tmp_path / "b.json").exists()


@pytest.mark.parametrize("args, flag", [
    (["--precision=float33"], "--precision"),
    (["--batch_size=32,big"], "--batch_size"),
    (["--batch_size=0"], "--batch_size"),
    (["--jit_compile=maybe"], "--jit_compile"),
    (["--baseline=torch"], "--baseline"),
    (["--steps_per_window=7", "--steps_per_loop=5"], "--steps_per_window"),
    (["--warmup_steps=0"], "--warmup_steps"),
    (["--distribution_strategy=tpu"], "--distribution_strategy"),
    (["--windows=three"], "--windows"),
    (["--data_dir=/nonexistent/tfgpu-data"], "--data_dir"),
    (["--output_json=/nonexistent/dir/b.json"], "--output_json"),
])
def test_bad_flags_name_the_flag(args, flag, capsys):
    assert benchmark.main(["--model=small_cnn", *args]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {flag}"), err


@pytest.mark.parametrize("name, precision, tf32, expected", [
    ("NVIDIA H100 80GB HBM3", "mixed_float16", True, 989.4),
    ("NVIDIA H100 80GB HBM3", "float32", True, 494.7),
    ("NVIDIA H100 80GB HBM3", "float32", False, 67.0),
    ("NVIDIA H100 PCIe", "mixed_bfloat16", True, 756.5),
    ("NVIDIA H200", "mixed_bfloat16", True, 989.4),
    ("NVIDIA A100-SXM4-80GB", "mixed_float16", True, 312.0),
    ("NVIDIA A10", "mixed_float16", True, 125.0),
    ("NVIDIA L4", "mixed_float16", True, 121.0),
    ("NVIDIA L40S", "mixed_float16", True, 362.0),
    ("Tesla V100-SXM2-16GB", "float32", True, 15.7),
    ("Tesla V100-SXM2-16GB", "mixed_bfloat16", True, None),
    ("Tesla T4", "mixed_float16", True, 65.0),
    ("Some Future GPU", "float32", True, None),
])
def test_peak_tflops_table(name, precision, tf32, expected):
    assert benchmark.peak_tflops(name, precision, tf32)[0] == expected


def test_mfu_is_training_flops_over_the_summed_peak():
    result = {"examples_per_sec": 3000.0, "macs_per_example": 4_100_000_000, "peak_tflops_per_device": 989.4,
              "num_devices": 2}
    benchmark.add_mfu(result)
    assert result["mfu"] == pytest.approx(3000 * 6 * 4.1e9 / (2 * 989.4e12), abs=1e-4)
    cpu = {"examples_per_sec": 300.0, "macs_per_example": 40_000_000, "peak_tflops_per_device": None,
           "num_devices": 1}
    benchmark.add_mfu(cpu)
    assert cpu["mfu"] is None


def test_window_stats_median_and_spread():
    stats = benchmark.window_stats([2.0, 1.0, 4.0, 1.0], examples_per_window=400, steps_per_window=10,
                                   cpu_seconds=[3.0, 2.0, 7.0, 2.0])
    assert stats["examples_per_sec"] == 300.0  # rates 200, 400, 100, 400 -> median of 200 and 400
    assert (stats["examples_per_sec_min"], stats["examples_per_sec_max"]) == (100.0, 400.0)
    assert stats["examples_per_sec_p25"] <= stats["examples_per_sec"] <= stats["examples_per_sec_p75"]
    assert stats["step_time_ms"] == 150.0
    assert stats["cpu_ms_per_step"] == 250.0  # median CPU seconds per window 2.5, over 10 steps


def test_repeats_pool_their_windows():
    rounds = [{"name": "tfgpu", "status": "ok", "batch_size": 10, "steps_per_window": 10, "peak_memory_bytes": m,
               "window_examples_per_sec": rates} for m, rates in ((5, [100.0, 200.0, 300.0]), (7, [400.0, 500.0, 600.0]))]
    pooled = benchmark.pool_rounds(rounds)
    assert pooled["examples_per_sec"] == pytest.approx(350.0)
    assert (pooled["examples_per_sec_min"], pooled["examples_per_sec_max"]) == pytest.approx((100.0, 600.0))
    assert pooled["repeats"] == 2 and pooled["peak_memory_bytes"] == 7 and len(pooled["window_examples_per_sec"]) == 6
    failed = benchmark.pool_rounds([rounds[0], {"name": "tfgpu", "status": "failed", "reason": "boom"}])
    assert failed["status"] == "failed" and failed["reason"] == "boom"


def _result(name, batch, precision, rate, jit=False, effective=None):
    return {"name": name, "batch_size": batch, "precision": precision, "jit_compile": jit, "examples_per_sec": rate,
            "jit_compile_effective": jit if effective is None else effective}


def test_ratio_keys_name_only_the_settings_that_vary():
    results = [_result("tfgpu", 64, "float32", 100.0), _result("keras_fit", 64, "float32", 80.0),
               _result("tfgpu", 64, "mixed_bfloat16", 180.0), _result("keras_fit", 64, "mixed_bfloat16", 120.0),
               {**_result("keras_fit_strategy", 64, "float32", None), "status": "failed"}]
    assert benchmark.ratios(results) == {"tfgpu/keras_fit@precision=float32": 1.25,
                                         "tfgpu/keras_fit@precision=mixed_bfloat16": 1.5,
                                         "tfgpu:mixed_bfloat16/float32": 1.8}
    # Examples per CPU-second: the baseline's CPU time per step over tfgpu's (same batch).
    for r, cpu_ms in zip(results, (50.0, 60.0, 30.0, 30.0)):
        r["cpu_ms_per_step"] = cpu_ms
    assert benchmark.ratios(results, benchmark._examples_per_cpu_second) == {
        "tfgpu/keras_fit@precision=float32": 1.2, "tfgpu/keras_fit@precision=mixed_bfloat16": 1.0,
        "tfgpu:mixed_bfloat16/float32": pytest.approx(50 / 30, abs=1e-4)}
    # XLA that was asked for but not in effect (logical CPU replicas) gives no XLA ratio.
    xla = [_result("tfgpu", 64, "float32", 100.0), _result("tfgpu", 64, "float32", 130.0, jit=True, effective=False)]
    assert benchmark.ratios(xla) == {}
    xla[1]["jit_compile_effective"] = True
    assert benchmark.ratios(xla) == {"tfgpu:xla_on/xla_off": 1.3}


class _FakeRunner:
    """Stands in for the child processes: a per-replica batch above ``limit`` runs out of GPU memory."""

    def __init__(self, limit, max_batch_size=0, memory_kind="gpu_peak_bytes"):
        opts = argparse.Namespace(batch_granularity=8, max_batch_size=max_batch_size)
        self.plan = argparse.Namespace(opts=opts)
        self.limit, self.memory_kind, self.tried = limit, memory_kind, []

    def run(self, runner, batch, precision, jit, per_replica=0, probe=False):
        assert probe and runner == "tfgpu" and batch == 0
        self.tried.append(per_replica)
        fits = per_replica <= self.limit
        return {"status": "ok" if fits else "oom", "peak_memory_bytes": per_replica * 1000,
                "memory_kind": self.memory_kind, "num_replicas": 1, "reason": None if fits else "OOM"}


def test_auto_batch_doubles_then_bisects_to_the_largest_fitting_batch():
    runner = _FakeRunner(limit=100)
    search = benchmark.auto_batch(runner, "mixed_float16", True)
    assert runner.tried == [8, 16, 32, 64, 128, 96, 112, 104]
    assert search["max_per_replica_batch_size"] == 96 and search["limited_by"] == "memory"
    assert search["table_per_replica_batch_sizes"] == [16, 32, 64, 96]
    assert [p["fits"] for p in search["probes"]] == [True] * 4 + [False, True, False, False]


def test_auto_batch_stops_at_max_batch_size_and_caps_cpu_by_default():
    runner = _FakeRunner(limit=10_000, max_batch_size=40)
    search = benchmark.auto_batch(runner, "float32", False)
    assert runner.tried == [8, 16, 32, 40]
    assert search["max_per_replica_batch_size"] == 40 and search["limited_by"] == "max_batch_size"
    cpu = _FakeRunner(limit=10_000, memory_kind="host_peak_rss_bytes")
    assert benchmark.auto_batch(cpu, "float32", False)["max_per_replica_batch_size"] == 256


def test_auto_batch_reports_when_nothing_fits():
    with pytest.raises(RuntimeError, match="even a per-replica batch of 8 does not fit"):
        benchmark.auto_batch(_FakeRunner(limit=4), "float32", False)


def test_auto_batch_size_end_to_end_on_cpu(tmp_path):
    out = tmp_path / "bench.json"
    proc = run_benchmark(*TINY, "--batch_size=auto", "--max_batch_size=8", "--baseline=none",
                         f"--output_json={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = load(out)
    (search,) = report["auto_batch_size"]
    assert search["max_per_replica_batch_size"] == 8 and search["limited_by"] == "max_batch_size"
    assert [(p["per_replica_batch_size"], p["fits"]) for p in search["probes"]] == [(8, True)]
    assert search["probes"][0]["peak_memory_bytes"] > 0
    assert [(r["batch_size"], r["status"]) for r in report["results"]] == [(8, "ok")]
    assert "largest per-replica batch that fits = 8" in proc.stdout


@pytest.fixture
def rgb_dataset(tmp_path):
    """A converted dataset of 64 random 16x16 RGB PNGs in 4 classes (real input pipeline, decode included)."""
    import numpy as np

    from tfgpu.data import tfrecord

    directory = str(tmp_path / "rgb")
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (64, 16, 16, 3), dtype=np.uint8)
    labels = rng.integers(0, 4, 64)
    splits = {"train": tfrecord.write_arrays(directory, "train", images, labels, num_shards=2)}
    tfrecord.write_manifest(directory, {"name": "rgb", "classes": ["a", "b", "c", "d"], "splits": splits,
                                        "compression": "none",
                                        "image_shape": {"height": 16, "width": 16, "channels": 3}})
    return directory


def test_real_data_against_synthetic_input_of_the_same_shape(tmp_path, rgb_dataset):
    out = tmp_path / "bench.json"
    proc = run_benchmark(*TINY, "--batch_size=16", f"--data_dir={rgb_dataset}", "--baseline=synthetic",
                         f"--output_json={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = load(out)
    by_name = {r["name"]: r for r in report["results"]}
    assert by_name["tfgpu"]["dataset"] == rgb_dataset
    assert by_name["synthetic"]["dataset"] == "synthetic" and by_name["synthetic"]["status"] == "ok"
    # Same model on the same shape: 4 classes from the manifest, 16x16x3.
    assert by_name["synthetic"]["macs_per_example"] == by_name["tfgpu"]["macs_per_example"]
    assert list(report["ratios"]) == ["tfgpu/synthetic"]


def test_synthetic_baseline_needs_real_data(capsys):
    assert benchmark.main(["--model=small_cnn", "--baseline=synthetic"]) == 1
    assert capsys.readouterr().err.strip().startswith("error: --baseline: synthetic compares real input")


@pytest.mark.slow
def test_mirrored_on_two_logical_cpus_with_both_baselines(tmp_path):
    out = tmp_path / "bench.json"
    proc = run_benchmark(*TINY, "--batch_size=32", "--distribution_strategy=mirrored", "--cpu_logical_devices=2",
                         "--jit_compile=true", f"--output_json={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = load(out)
    by_name = {r["name"]: r for r in report["results"]}
    mine = by_name["tfgpu"]
    assert (mine["strategy"], mine["num_replicas"], mine["per_replica_batch_size"]) == ("mirrored", 2, 16)
    assert mine["jit_compile"] and not mine["jit_compile_effective"]  # XLA cannot span logical CPUs
    assert by_name["keras_fit"]["strategy"] == "keras_default" and by_name["keras_fit"]["num_replicas"] == 1
    fit_mirrored = by_name["keras_fit_strategy"]
    assert fit_mirrored["status"] == "ok" and fit_mirrored["steps_per_execution"] == 1
    assert fit_mirrored["num_replicas"] == 2
    assert set(report["ratios"]) == {"tfgpu/keras_fit", "tfgpu/keras_fit_strategy"}
    assert "off*" in proc.stdout


def test_one_device_skips_keras_fit_strategy_with_a_reason(tmp_path):
    out = tmp_path / "bench.json"
    proc = run_benchmark(*TINY, "--batch_size=16", "--baseline=keras_fit_strategy", "--repeats=2",
                         f"--output_json={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = load(out)["results"]
    assert [r["name"] for r in results] == ["tfgpu", "keras_fit_strategy"]
    assert results[0]["repeats"] == 2 and len(results[0]["window_examples_per_sec"]) == 6
    skipped = [r for r in results if r["name"] == "keras_fit_strategy"]
    assert skipped[0]["status"] == "skipped" and "one_device" in skipped[0]["reason"]
    assert skipped[0]["examples_per_sec"] is None
    assert "skipped: the strategy is one_device" in proc.stdout
