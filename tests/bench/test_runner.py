"""tfgpu.bench.runner: the --batch_size=auto search (doubling, then bisection) against a fake child."""
import argparse

import pytest

from tfgpu.bench import runner as bench_runner


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
    search = bench_runner.auto_batch(runner, "mixed_float16", True)
    assert runner.tried == [8, 16, 32, 64, 128, 96, 112, 104]
    assert search["max_per_replica_batch_size"] == 96 and search["limited_by"] == "memory"
    assert search["table_per_replica_batch_sizes"] == [16, 32, 64, 96]
    assert [p["fits"] for p in search["probes"]] == [True] * 4 + [False, True, False, False]


def test_auto_batch_stops_at_max_batch_size_and_caps_cpu_by_default():
    runner = _FakeRunner(limit=10_000, max_batch_size=40)
    search = bench_runner.auto_batch(runner, "float32", False)
    assert runner.tried == [8, 16, 32, 40]
    assert search["max_per_replica_batch_size"] == 40 and search["limited_by"] == "max_batch_size"
    cpu = _FakeRunner(limit=10_000, memory_kind="host_peak_rss_bytes")
    assert bench_runner.auto_batch(cpu, "float32", False)["max_per_replica_batch_size"] == 256


def test_auto_batch_reports_when_nothing_fits():
    with pytest.raises(RuntimeError, match="even a per-replica batch of 8 does not fit"):
        bench_runner.auto_batch(_FakeRunner(limit=4), "float32", False)


class _FakeMeasureRunner:
    """Stands in for the child processes of measure(): every run succeeds; tfgpu uses ``replicas`` devices."""

    def __init__(self, baselines, replicas=1, steps_per_loop=10, keras_steps_per_execution=1, repeats=2):
        opts = argparse.Namespace(repeats=repeats, keras_steps_per_execution=keras_steps_per_execution)
        self.plan = argparse.Namespace(opts=opts, baselines=baselines, shared={"steps_per_loop": steps_per_loop})
        self.replicas, self.calls = replicas, []

    def run(self, runner, batch, precision, jit, per_replica=0, probe=False):
        self.calls.append(runner)
        devices = self.replicas if runner == "tfgpu" else 1
        rate = 100.0 * devices
        return {"name": runner, "status": "ok", "batch_size": batch, "precision": precision, "jit_compile": jit,
                "num_replicas": devices, "strategy": "mirrored" if devices > 1 else "one_device",
                "steps_per_window": 10, "peak_memory_bytes": 1, "examples_per_sec": rate,
                "window_examples_per_sec": [rate]}


def test_measure_runs_tfgpu_on_one_device_too_when_it_uses_more_devices_than_fit():
    runner = _FakeMeasureRunner(("keras_fit", "keras_fit_strategy"), replicas=2)
    results = {r["name"]: r for r in bench_runner.measure(runner, 64, "float32", False)}
    assert runner.calls == ["tfgpu", "tfgpu_one_device", "keras_fit", "keras_fit_strategy"] * 2
    assert results["tfgpu_one_device"]["repeats"] == 2 and results["tfgpu_one_device"]["num_replicas"] == 1
    one_device = _FakeMeasureRunner(("keras_fit",), replicas=1)
    bench_runner.measure(one_device, 64, "float32", False)
    assert one_device.calls == ["tfgpu", "keras_fit"] * 2


def test_keras_fit_spe_runs_fit_with_tfgpus_steps_per_call_and_is_skipped_when_that_is_keras_fits():
    runner = _FakeMeasureRunner(("keras_fit", "keras_fit_spe"), steps_per_loop=10)
    results = bench_runner.measure(runner, 64, "float32", False)
    assert runner.calls == ["tfgpu", "keras_fit", "keras_fit_spe"] * 2
    assert [r["status"] for r in results] == ["ok"] * 3
    same = _FakeMeasureRunner(("keras_fit", "keras_fit_spe"), steps_per_loop=1)
    results = {r["name"]: r for r in bench_runner.measure(same, 64, "float32", False)}
    assert same.calls == ["tfgpu", "keras_fit"] * 2
    skipped = results["keras_fit_spe"]
    assert skipped["status"] == "skipped" and "--steps_per_loop=1" in skipped["reason"]
