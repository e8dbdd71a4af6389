"""The ring all-reduce cost model behind tfgpu.plan: exact on hand-checked cases, monotone where it must be."""
import pytest
from hypothesis import given, strategies as st

from tfgpu.bench import scaling


def test_two_workers_send_the_gradient_once_each_way():
    # 2(N-1)/N = 1: 12.5 MB over 100 Mbit/s (12.5 MB/s) at full efficiency is one second, plus one ring step.
    t = scaling.allreduce_s(2, 12.5e6, scaling.parse_bandwidth("100mbit"), latency_s=0.0, efficiency=1.0)
    assert t == pytest.approx(1.0 + scaling.STEP_OVERHEAD_S)
    assert scaling.allreduce_s(1, 12.5e6, 1e6, 0.01) == 0.0


def test_prediction_and_efficiency():
    m = scaling.Measured(step_s=0.1, per_replica_batch=64, trainable_parameters=1_000_000)
    row = scaling.predict(m, 4, scaling.parse_bandwidth("1gbit"), latency_s=0.0005, efficiency=1.0)
    wire = 3 * (2 * 0.0005 + scaling.STEP_OVERHEAD_S) + 1.5 * 4e6 / 125e6
    assert row["predicted_step_s"] == pytest.approx(0.1 + wire)
    assert row["predicted_examples_per_sec"] == pytest.approx(4 * 64 / (0.1 + wire))
    assert row["efficiency"] == pytest.approx(0.1 / (0.1 + wire))


def test_halving_the_bytes_keeps_the_recipe_and_ranks_with_doubling_the_batch():
    m = scaling.Measured(step_s=0.05, per_replica_batch=64, trainable_parameters=4_000_000)
    assert m.wire_bytes == 16e6
    rows = {r["remedy"]: r for r in scaling.remedies(m, 2, scaling.parse_bandwidth("1gbit"), 0.0)}
    base = scaling.predict(m, 2, scaling.parse_bandwidth("1gbit"), 0.0)["efficiency"]
    half = rows["--allreduce_dtype=bfloat16"]
    assert half["keeps_recipe"] and half["efficiency"] > base + 0.1
    assert not rows["per-replica batch 128"]["keeps_recipe"]
    assert rows["per-replica batch 128"]["efficiency"] == pytest.approx(half["efficiency"], abs=0.01)
    assert rows["--steps_per_loop"]["efficiency"] == base  # it changes no byte on the wire


@given(st.integers(2, 64), st.floats(1e3, 1e9), st.floats(1e6, 1e10), st.floats(0, 0.01))
def test_more_bytes_more_workers_or_less_bandwidth_never_predicts_a_faster_all_reduce(n, size, bandwidth, latency):
    t = scaling.allreduce_s(n, size, bandwidth, latency)
    assert scaling.allreduce_s(n, 2 * size, bandwidth, latency) > t
    assert scaling.allreduce_s(n + 1, size, bandwidth, latency) > t
    assert scaling.allreduce_s(n, size, bandwidth / 2, latency) > t


@pytest.mark.parametrize("text", ["fast", "100", "1gb", "-1gbit"])
def test_a_bandwidth_needs_a_unit(text):
    with pytest.raises(ValueError, match="is not a bandwidth like 100mbit"):
        scaling.parse_bandwidth(text)
