"""tfgpu.bench.allreduce_probe: the host-cost line fitted to an all-reduce's timings, and (slow) the probe itself
between two local workers."""
import pytest
from hypothesis import given, strategies as st

from tfgpu.bench import allreduce_probe, scaling


@given(st.floats(0.0, 0.05), st.floats(0.0, 2e-8), st.lists(st.floats(1e3, 1e8), min_size=2, max_size=5,
                                                          unique=True))
def test_a_line_through_exact_timings_is_recovered(fixed, per_byte, sizes):
    if max(sizes) < 1.01 * min(sizes):
        return
    probe = allreduce_probe.fit(2, [(x, fixed + per_byte * x) for x in sizes])
    assert probe.fixed_s == pytest.approx(fixed, abs=1e-9)
    assert probe.per_byte_s == pytest.approx(per_byte, rel=1e-6, abs=1e-15)


def test_noise_that_tilts_the_line_below_zero_gives_no_negative_cost():
    probe = allreduce_probe.fit(2, [(4096, 0.001), (1e6, 0.002), (2e6, 0.040)])  # a line here has a < 0
    assert probe.fixed_s == 0.0 and probe.per_byte_s > 0
    flat = allreduce_probe.fit(2, [(4096, 0.005), (1e6, 0.004), (2e6, 0.003)])  # slower for fewer bytes: noise
    assert flat.per_byte_s == 0.0 and flat.fixed_s > 0


def test_the_fixed_cost_is_per_ring_step_pair_for_the_model():
    # Three workers paid 8 ms fixed: 4 ms per (N-1), so the model gives 8 ms again for three and 4 ms for two.
    probe = allreduce_probe.Probe(3, 0.008, 3e-9)
    assert probe.cost == scaling.HostCost(0.004, 3e-9)
    assert scaling.host_allreduce_s(3, 3e6, probe.cost) == pytest.approx(probe.seconds(scaling.bytes_sent(3, 3e6)))
    assert allreduce_probe.probe_sizes(1e6) == [4096, 500000, 1000000]


@pytest.mark.slow
def test_two_local_workers_probe_a_cost_that_grows_with_the_bytes():
    probe = allreduce_probe.measure(2, 4e6, repeats=3, timeout_s=240)
    assert len(probe.rows) == 3 and probe.per_byte_s > 0
    assert 0 < probe.seconds(4e6) < 5.0
