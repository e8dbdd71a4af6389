"""tfgpu.benchmark: the acceptance command end to end on a tiny CPU case, lists, flag errors, the auto batch
search and real against synthetic input (the arithmetic is in tests/bench)."""
import json
import os
import subprocess
import sys
import time

import pytest

from tfgpu import benchmark

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Tiny and short: 3 timed windows of 5 steps after 5 untimed steps (one tfgpu loop each).
TINY = ["--model=small_cnn", "--image_size=16", "--untimed_steps=5", "--steps_per_window=5", "--windows=3",
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


# Slow: the benchmark end to end (85 s loaded); its plan, ratios, report and child errors are tested in tests/bench
# and below.
@pytest.mark.slow
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
        # the CPU's peak is the matmul probe's in the same process; a small model reaches a fraction of it
        assert r["peak_source"].startswith("CPU ") and 0 < r["mfu"] < 1.5 and r["achieved_tflops"] > 0
        # Two 3x3 convs (16x16x32 from 3 channels, 8x8x64 from 32) and a 64x10 dense layer.
        assert r["macs_per_example"] == 16 * 16 * 32 * 27 + 8 * 8 * 64 * 288 + 64 * 10
    assert by_name["tfgpu"]["strategy"] == "one_device" and by_name["tfgpu"]["steps_per_loop"] == 5
    assert by_name["keras_fit"]["steps_per_execution"] == 1
    # Each side's XLA scope (none here) and how its batches reach the device.
    assert by_name["tfgpu"]["xla_scope"] == by_name["keras_fit"]["xla_scope"] == "none"
    assert by_name["keras_fit"]["input_to_device"] == "host memory (CPU device)"
    assert by_name["tfgpu"]["input_to_device"] == "host memory (CPU device; the dataset's own iterator)"
    assert report["ratio_spread"]["tfgpu/keras_fit"]["n"] == 1
    expected = by_name["tfgpu"]["examples_per_sec"] / by_name["keras_fit"]["examples_per_sec"]
    assert report["ratios"]["tfgpu/keras_fit"] == pytest.approx(expected, rel=1e-3)
    assert list(report["ratios"]) == ["tfgpu/keras_fit"]
    cpu_expected = by_name["keras_fit"]["cpu_ms_per_step"] / by_name["tfgpu"]["cpu_ms_per_step"]
    assert report["cpu_time_ratios"]["tfgpu/keras_fit"] == pytest.approx(cpu_expected, rel=1e-3)
    assert report["environment"]["tensorflow"] and report["environment"]["cpu_count"]
    assert "tfgpu/keras_fit = " in proc.stdout and "keras_fit " in proc.stdout
    assert "(1 repeat: no spread" in proc.stdout


# Slow (46 s): the acceptance test runs the benchmark end to end by default; the ratio keys of a sweep are
# tested in-process (tests/bench/test_stats.py::test_ratio_keys_name_only_the_settings_that_vary).
@pytest.mark.slow
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


# The parent runs in this process (its measurements still run in child processes).
def test_bad_model_fails_with_one_line_before_any_measurement(tmp_path, capsys):
    assert benchmark.main(["--model=resnet_nope", "--output_json=" + str(tmp_path / "b.json")]) == 1
    captured = capsys.readouterr()
    last = captured.err.strip().splitlines()[-1]
    assert last.startswith("error: --model: unknown model 'resnet_nope'") and "resnet20" in last
    assert "[1]" not in captured.out + captured.err  # no child was started
    assert not (tmp_path / "b.json").exists()


def test_an_error_found_in_the_child_is_one_line_naming_the_benchmark_flag(tmp_path, capsys):
    code = benchmark.main(["--model=small_cnn", "--image_size=16", "--batch_size=3", "--cpu_logical_devices=2",
                           "--distribution_strategy=mirrored", "--output_json=" + str(tmp_path / "b.json")])
    captured = capsys.readouterr()
    assert code == 1
    assert captured.err.strip().splitlines()[-1] == "error: --batch_size: 3 is not divisible by the 2 replicas"
    assert "[1]" in captured.out + captured.err and "[2]" not in captured.out + captured.err  # stopped after one
    assert not (tmp_path / "b.json").exists()


@pytest.mark.parametrize("args, flag", [
    (["--precision=float33"], "--precision"),
    (["--precision=auto,float33"], "--precision"),
    (["--keras_one_device_strategy=maybe"], "--keras_one_device_strategy"),
    (["--baseline=tfgpu_one_device"], "--baseline"),
    (["--batch_size=32,big"], "--batch_size"),
    (["--batch_size=0"], "--batch_size"),
    (["--jit_compile=maybe"], "--jit_compile"),
    (["--baseline=torch"], "--baseline"),
    (["--steps_per_window=7", "--steps_per_loop=5"], "--steps_per_window"),
    (["--untimed_steps=0"], "--untimed_steps"),
    (["--warmup_steps=5"], "--warmup_steps: renamed --untimed_steps"),
    (["--global_batch_size=32"], "--global_batch_size: unknown flag"),
    (["--distribution_strategy=tpu"], "--distribution_strategy"),
    (["--windows=three"], "--windows"),
    (["--data_dir=/nonexistent/tfgpu-data"], "--data_dir"),
    (["--output_json=/nonexistent/dir/b.json"], "--output_json"),
])
def test_bad_flags_name_the_flag(args, flag, capsys):
    assert benchmark.main(["--model=small_cnn", *args]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {flag}"), err


# Slow (27 s): the batch search is tested in-process in tests/bench/test_runner.py.
@pytest.mark.slow
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

    from tfgpu.data.schema import tfrecord

    directory = str(tmp_path / "rgb")
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (64, 16, 16, 3), dtype=np.uint8)
    labels = rng.integers(0, 4, 64)
    splits = {"train": tfrecord.write_arrays(directory, "train", images, labels, num_shards=2)}
    tfrecord.write_manifest(directory, {"name": "rgb", "classes": ["a", "b", "c", "d"], "splits": splits,
                                        "compression": "none",
                                        "image_shape": {"height": 16, "width": 16, "channels": 3}})
    return directory


# Slow (32 s): the end-to-end acceptance command stays in the default suite.
@pytest.mark.slow
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
def test_mirrored_on_two_logical_cpus_with_every_fit_baseline(tmp_path):
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
    # fit on one device is compared with tfgpu on one device; the 2-replica run is the scaling figure.
    assert by_name["tfgpu_one_device"]["num_replicas"] == 1 and by_name["keras_fit_spe"]["steps_per_execution"] == 5
    assert set(report["ratios"]) == {"tfgpu/keras_fit", "tfgpu/keras_fit_spe", "tfgpu/keras_fit_strategy",
                                     "tfgpu:2_devices/1_device"}
    expected = by_name["tfgpu_one_device"]["examples_per_sec"] / by_name["keras_fit"]["examples_per_sec"]
    assert report["ratios"]["tfgpu/keras_fit"] == pytest.approx(expected, rel=1e-3)
    assert "off*" in proc.stdout and "note: batch 32 float32: tfgpu ran on 2 devices" in proc.stdout


# Slow (29 s): the end-to-end acceptance command stays in the default suite.
@pytest.mark.slow
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
