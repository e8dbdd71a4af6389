"""tfgpu.bench.stats: the arithmetic of ratios, spread, pooled rounds, peak TFLOPS and MFU."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfgpu.bench import stats


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
    assert stats.peak_tflops(name, precision, tf32)[0] == expected


def test_mfu_is_training_flops_over_the_summed_peak():
    result = {"examples_per_sec": 3000.0, "macs_per_example": 4_100_000_000, "peak_tflops_per_device": 989.4,
              "num_devices": 2}
    stats.add_mfu(result)
    assert result["mfu"] == pytest.approx(3000 * 6 * 4.1e9 / (2 * 989.4e12), abs=1e-4)
    cpu = {"examples_per_sec": 300.0, "macs_per_example": 40_000_000, "peak_tflops_per_device": None,
           "num_devices": 1}
    stats.add_mfu(cpu)
    assert cpu["mfu"] is None


def test_window_stats_median_and_spread():
    result = stats.window_stats([2.0, 1.0, 4.0, 1.0], examples_per_window=400, steps_per_window=10,
                                    cpu_seconds=[3.0, 2.0, 7.0, 2.0])
    assert result["examples_per_sec"] == 300.0  # rates 200, 400, 100, 400 -> median of 200 and 400
    assert (result["examples_per_sec_min"], result["examples_per_sec_max"]) == (100.0, 400.0)
    assert result["examples_per_sec_p25"] <= result["examples_per_sec"] <= result["examples_per_sec_p75"]
    assert result["step_time_ms"] == 150.0
    assert result["cpu_ms_per_step"] == 250.0  # median CPU seconds per window 2.5, over 10 steps


def test_repeats_pool_their_windows():
    rounds = [{"name": "tfgpu", "status": "ok", "batch_size": 10, "steps_per_window": 10, "peak_memory_bytes": m,
               "window_examples_per_sec": rates} for m, rates in ((5, [100.0, 200.0, 300.0]), (7, [400.0, 500.0, 600.0]))]
    pooled = stats.pool_rounds(rounds)
    assert pooled["examples_per_sec"] == pytest.approx(350.0)
    assert (pooled["examples_per_sec_min"], pooled["examples_per_sec_max"]) == pytest.approx((100.0, 600.0))
    assert pooled["repeats"] == 2 and pooled["peak_memory_bytes"] == 7 and len(pooled["window_examples_per_sec"]) == 6
    failed = stats.pool_rounds([rounds[0], {"name": "tfgpu", "status": "failed", "reason": "boom"}])
    assert failed["status"] == "failed" and failed["reason"] == "boom"


def _result(name, batch, precision, rate, jit=False, effective=None):
    return {"name": name, "batch_size": batch, "precision": precision, "jit_compile": jit, "examples_per_sec": rate,
            "jit_compile_effective": jit if effective is None else effective}


def test_ratio_keys_name_only_the_settings_that_vary():
    results = [_result("tfgpu", 64, "float32", 100.0), _result("keras_fit", 64, "float32", 80.0),
               _result("tfgpu", 64, "mixed_bfloat16", 180.0), _result("keras_fit", 64, "mixed_bfloat16", 120.0),
               {**_result("keras_fit_strategy", 64, "float32", None), "status": "failed"}]
    assert stats.ratios(results) == {"tfgpu/keras_fit@precision=float32": 1.25,
                                         "tfgpu/keras_fit@precision=mixed_bfloat16": 1.5,
                                         "tfgpu:mixed_bfloat16/float32": 1.8,
                                         "keras_fit:mixed_bfloat16/float32": 1.5}
    # Examples per CPU-second: the baseline's CPU time per step over tfgpu's (same batch).
    for r, cpu_ms in zip(results, (50.0, 60.0, 30.0, 30.0)):
        r["cpu_ms_per_step"] = cpu_ms
    assert stats.ratios(results, stats.examples_per_cpu_second) == {
        "tfgpu/keras_fit@precision=float32": 1.2, "tfgpu/keras_fit@precision=mixed_bfloat16": 1.0,
        "tfgpu:mixed_bfloat16/float32": pytest.approx(50 / 30, abs=1e-4), "keras_fit:mixed_bfloat16/float32": 2.0}
    # XLA that was asked for but not in effect (logical CPU replicas) gives no XLA ratio.
    xla = [_result("tfgpu", 64, "float32", 100.0), _result("tfgpu", 64, "float32", 130.0, jit=True, effective=False)]
    assert stats.ratios(xla) == {}
    xla[1]["jit_compile_effective"] = True
    assert stats.ratios(xla) == {"tfgpu:xla_on/xla_off": 1.3}


def _on(devices, result):
    return {**result, "num_replicas": devices, "status": "ok"}


def test_ratios_compare_runs_on_the_same_devices_only():
    # tfgpu on 2 GPUs against fit on 1: no tfgpu/keras_fit from that pair; tfgpu on one device stands in.
    two = _on(2, _result("tfgpu", 64, "float32", 190.0))
    fit = _on(1, _result("keras_fit", 64, "float32", 100.0))
    fit_strategy = _on(2, _result("keras_fit_strategy", 64, "float32", 180.0))
    assert stats.ratios([two, fit, fit_strategy]) == {"tfgpu/keras_fit_strategy": pytest.approx(190 / 180, abs=1e-4)}
    one = _on(1, _result("tfgpu_one_device", 64, "float32", 105.0))
    assert stats.ratios([two, fit, fit_strategy, one]) == {
        "tfgpu/keras_fit": 1.05, "tfgpu/keras_fit_strategy": pytest.approx(190 / 180, abs=1e-4),
        "tfgpu:2_devices/1_device": pytest.approx(190 / 105, abs=1e-4)}
    notes = stats.devices_note([two, fit, one])
    assert len(notes) == 1 and "tfgpu ran on 2 devices" in notes[0] and "tfgpu_one_device" in notes[0]
    # On one device nothing stands in and there is no scaling figure.
    assert stats.ratios([_on(1, _result("tfgpu", 64, "float32", 100.0)), fit]) == {"tfgpu/keras_fit": 1.0}


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(stats.RUNNERS), st.integers(1, 4), st.floats(1.0, 1000.0)),
                min_size=1, max_size=8, unique_by=lambda t: t[0]))
def test_no_ratio_of_tfgpu_against_a_baseline_spans_different_device_counts(rows):
    results = [_on(devices, _result(name, 64, "float32", rate)) for name, devices, rate in rows]
    for key, mine, base in stats._pairs(results, lambda r: r.get("examples_per_sec")):
        if "/" in key and ":" not in key.split("/")[0]:  # tfgpu/BASELINE, not scaling or precision
            assert stats._devices(mine) == stats._devices(base), key


def test_ratio_spread_pairs_the_rounds_of_two_runners():
    def pooled(name, round_rates):
        rounds = [{"name": name, "status": "ok", "batch_size": 10, "steps_per_window": 10, "peak_memory_bytes": 1,
                   "examples_per_sec": rate, "window_examples_per_sec": [rate]} for rate in round_rates]
        return {**stats.pool_rounds(rounds), "precision": "float32", "jit_compile": False}

    mine, fit = pooled("tfgpu", [100.0, 90.0, 120.0]), pooled("keras_fit", [100.0, 100.0, 100.0])
    assert [r["examples_per_sec"] for r in mine["rounds"]] == [100.0, 90.0, 120.0]
    assert stats.ratios([mine, fit]) == {"tfgpu/keras_fit": 1.0}  # the pooled medians
    assert stats.ratio_spread([mine, fit]) == {"tfgpu/keras_fit": {"min": 0.9, "max": 1.2, "n": 3}}
    # One round each: n = 1, which the report prints as no spread.
    single = [pooled("tfgpu", [100.0]), pooled("keras_fit", [80.0])]
    assert stats.ratio_spread(single) == {"tfgpu/keras_fit": {"min": 1.25, "max": 1.25, "n": 1}}
