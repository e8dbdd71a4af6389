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


def test_the_host_cost_of_the_all_reduce_stands_beside_the_wire():
    # 3 workers send 2·2/3·6 MB = 8 MB each: 2 ms·2 fixed + 8 MB at 5 ns/byte = 44 ms on the hosts; at 1 Gbit/s
    # (125 MB/s) and full efficiency the wire takes 64 ms. The hosts' 40 ms of per-byte work streams with the wire.
    host = scaling.HostCost(fixed_s=0.002, per_byte_s=5e-9)
    m = scaling.Measured(step_s=0.030, per_replica_batch=32, trainable_parameters=1_500_000)
    row = scaling.predict(m, 3, scaling.parse_bandwidth("1gbit"), latency_s=0.0, efficiency=1.0, host=host)
    assert row["terms_s"] == pytest.approx({"compute": 0.030, "host all-reduce": 0.044, "wire": 0.064})
    assert row["overlapped_s"] == pytest.approx(0.040)
    assert row["predicted_step_s"] == pytest.approx(0.030 + 0.004 + 0.064)
    assert row["predicted_step_s"] == pytest.approx(0.030 + scaling.allreduce_s(3, 6e6, 125e6, 0.0, 1.0, host))
    assert row["dominant"] == "wire" and row["efficiency"] == pytest.approx(0.030 / 0.098)
    fast = scaling.predict(m, 3, scaling.parse_bandwidth("100gbit"), 0.0, 1.0, host)
    assert fast["dominant"] == "host all-reduce"  # past the wire, the hosts' own work is what is left
    assert fast["predicted_step_s"] == pytest.approx(0.030 + 0.044)
    assert scaling.predict(m, 1, 1e6, 0.0, 1.0, host)["terms_s"] == {"compute": 0.030, "host all-reduce": 0.0,
                                                                     "wire": 0.0}


def _rows(compute, host, wires, miss):
    """Validation rows of one worker count whose measured step is the prediction plus ``miss(terms)``."""
    rows = []
    for wire in wires:
        terms = {"compute": compute, "host all-reduce": host, "wire": wire}
        predicted = compute + host + wire
        rows.append({"terms_s": terms, "predicted_step_s": predicted, "measured_step_s": predicted + miss(terms)})
    return rows


def test_the_term_that_missed_is_named_from_how_the_miss_follows_the_link():
    wires = (0.99, 0.099)
    assert scaling.missed_term(_rows(0.05, 0.01, wires, lambda t: 0.3 * t["wire"])) == "wire"
    # The same 20 ms at both links: not the wire; compute and host cost do not move with the link, the larger one.
    assert scaling.missed_term(_rows(0.05, 0.01, wires, lambda t: 0.02)) == "compute"
    assert scaling.missed_term(_rows(0.01, 0.05, wires, lambda t: -0.02)) == "host all-reduce"
    assert scaling.missed_term(_rows(0.05, 0.01, (0.2,), lambda t: 0.1)) == "wire"  # one row: the largest term


@given(st.floats(0.005, 0.5), st.floats(0.0005, 0.2), st.lists(st.floats(0.001, 5.0), min_size=2, max_size=4,
                                                             unique=True),
       st.floats(-0.5, 2.0).filter(lambda k: abs(k) > 0.05), st.sampled_from(["wire", "other"]))
def test_a_miss_in_one_term_is_put_on_that_term(compute, host, wires, k, culprit):
    if max(wires) < 1.5 * min(wires):  # rows whose wires hardly differ cannot tell the link from the hosts
        return
    if culprit == "wire":
        assert scaling.missed_term(_rows(compute, host, wires, lambda t: k * t["wire"])) == "wire"
    else:
        named = scaling.missed_term(_rows(compute, host, wires, lambda t: k * (t["compute"] + t["host all-reduce"])))
        assert named == ("compute" if compute >= host else "host all-reduce")
