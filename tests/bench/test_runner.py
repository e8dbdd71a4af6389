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
