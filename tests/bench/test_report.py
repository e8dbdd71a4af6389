"""tfgpu.bench.report: the printed table states each side's XLA scope and every ratio carries its spread."""
from tfgpu.bench import report


def _row(name, xla_scope, rate, **extra):
    return {"name": name, "batch_size": 128, "precision": "float32", "jit_compile": True, "jit_compile_effective": True,
            "xla_scope": xla_scope, "strategy": "one_device", "num_replicas": 1, "examples_per_sec": rate,
            "examples_per_sec_min": rate - 5, "examples_per_sec_max": rate + 5, "step_time_ms": 10.0,
            "peak_memory_bytes": 2**30, "mfu": None, **extra}


def test_table_names_the_xla_scope_and_ratios_carry_their_spread():
    text = report.format_report({
        "environment": {"cpu": "test CPU", "cpu_count": 2},
        "results": [_row("tfgpu", "grads", 110.0),
                    _row("keras_fit", "step", 100.0, input_to_device="copied to the GPU inside each step (no strategy)")],
        "ratios": {"tfgpu/keras_fit": 1.1, "tfgpu:mixed_bfloat16/float32": 1.2},
        "ratio_spread": {"tfgpu/keras_fit": {"min": 1.02, "max": 1.15, "n": 3},
                         "tfgpu:mixed_bfloat16/float32": {"min": 1.2, "max": 1.2, "n": 1}},
        "precision_auto": {"precision": "float32", "reason": "no bf16 here"}})
    lines = text.splitlines()
    tfgpu_row = next(line for line in lines if line.startswith("tfgpu "))
    fit_row = next(line for line in lines if line.startswith("keras_fit "))
    assert " grads " in tfgpu_row and " step " in fit_row
    assert any(line.startswith("xla: grads = tfgpu: the forward and backward pass") and "step = Keras fit: the whole "
               "train step" in line for line in lines)
    assert any(line.startswith("input: keras_fit copy each batch to the GPU inside the step") for line in lines)
    assert "  tfgpu/keras_fit = 1.100 (min-max 1.020-1.150 over 3 paired repeats)" in lines
    assert "  tfgpu:mixed_bfloat16/float32 = 1.200 (1 repeat: no spread; --repeats=3 or more to tell a trend from " \
           "noise)" in lines
    assert "precision auto = float32 (no bf16 here)" in lines


def test_compute_lines_give_flops_per_example_achieved_and_percent_of_the_probed_peak():
    from tfgpu.bench import stats

    rows = [_row("tfgpu", "none", 1000.0, macs_per_example=2_000_000, peak_tflops_per_device=0.1, num_devices=1,
                 peak_source="CPU float32 matmul probe (1024x1024, this process)"),
            _row("keras_fit", "none", 500.0, macs_per_example=2_000_000, peak_tflops_per_device=0.1, num_devices=1,
                 peak_source="CPU float32 matmul probe (1024x1024, this process)")]
    for r in rows:
        stats.add_mfu(r)
    text = report.format_report({"environment": {}, "results": rows, "ratios": {}})
    assert ("compute: tfgpu float32 batch 128: 12.0 MFLOP per training example (3 x forward), 0.012 TFLOP/s "
            "achieved of 0.1 TFLOP/s peak (CPU float32 matmul probe (1024x1024, this process)): 12.0%") in text
    assert "compute: keras_fit float32 batch 128: 12.0 MFLOP" in text and "6.0%" in text
