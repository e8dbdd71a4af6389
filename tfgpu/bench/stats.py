"""The arithmetic of a benchmark: peak TFLOPS per GPU, window statistics, pooled rounds, ratios and MFU.

Pure functions of measured numbers (no TensorFlow), so they are tested directly.
"""
import re
import statistics

RUNNERS = ("tfgpu", "tfgpu_one_device", "keras_fit", "keras_fit_spe", "keras_fit_strategy", "synthetic")
# What --baseline may name; tfgpu_one_device is added by the runner itself when tfgpu uses more devices than the
# one-device baselines (a ratio is only between runs on the same devices).
BASELINES = RUNNERS[2:]
ONE_DEVICE_BASELINES = ("keras_fit", "keras_fit_spe")
# What XLA compiles on each side when --jit_compile is in effect (``xla_scope`` in the JSON, the table's xla column).
XLA_SCOPES = {"tfgpu": "grads", "keras": "step"}
XLA_SCOPE_TEXT = {"grads": "tfgpu: the forward and backward pass (tf.function(jit_compile=True)); the all-reduce "
                           "and the optimizer update run outside XLA",
                  "step": "Keras fit: the whole train step (forward, backward, optimizer update, metrics)",
                  "none": "no XLA"}

# Peak dense (no 2:4 sparsity) tensor-core TFLOPS per GPU, from NVIDIA's datasheets; the datasheets print
# sparsity figures for TF32/FP16/BF16, which are twice these. float32 runs use the TF32 peak while
# TensorFlow's TF32 execution is on (its default on Ampere and newer), else the plain FP32 peak. None = that
# precision has no tensor-core path on the GPU (MFU is not reported).
#   H100/H200: nvidia.com/en-us/data-center/h100/ and /h200/ datasheets (SXM: 67 FP32, 989 TF32*, 1,979 BF16*;
#              PCIe: 51, 756*, 1,513*; NVL: 60, 835*, 1,671*; * = with sparsity)
#   A100:  nvidia-a100-datasheet (19.5 FP32, 156 TF32, 312 BF16/FP16; SXM and PCIe, 40 and 80 GB)
#   A10:   nvidia-a10-datasheet (31.2, 62.5, 125);  L4: nvidia.com/en-us/data-center/l4/ (30.3, 60, 121)
#   L40S:  nvidia.com/en-us/data-center/l40s/ (91.6, 183, 362)
#   V100:  volta-v100-datasheet (SXM2: 15.7 FP32, 125 FP16 tensor; PCIe: 14, 112)
#   T4:    t4-tensor-core-datasheet (8.1 FP32, 65 FP16 mixed)
GPU_PEAK_TFLOPS = (
    # (pattern matched against the CUDA device name, label, fp32, tf32, fp16, bf16)
    (r"H200", "H200 SXM", 67.0, 494.7, 989.4, 989.4),
    (r"H100.*NVL", "H100 NVL", 60.0, 417.5, 835.5, 835.5),
    (r"H100.*PCIe", "H100 PCIe", 51.2, 378.0, 756.5, 756.5),
    (r"H100", "H100 SXM", 67.0, 494.7, 989.4, 989.4),
    (r"A100", "A100", 19.5, 156.0, 312.0, 312.0),
    (r"A10(?![0-9])", "A10", 31.2, 62.5, 125.0, 125.0),
    (r"L40S", "L40S", 91.6, 183.0, 362.0, 362.0),
    (r"L4(?![0-9])", "L4", 30.3, 60.0, 121.0, 121.0),
    (r"V100.*PCIE", "V100 PCIe", 14.0, None, 112.0, None),
    (r"V100", "V100 SXM2", 15.7, None, 125.0, None),
    (r"T4(?![0-9])", "T4", 8.1, None, 65.0, None),
)


def peak_tflops(device_name: str, precision: str, tf32: bool = True):
    """(peak dense TFLOPS of one device for ``precision``, label), or (None, why) when unknown."""
    for pattern, label, fp32, tf32_peak, fp16, bf16 in GPU_PEAK_TFLOPS:
        if re.search(pattern, device_name, re.IGNORECASE):
            if precision == "float32":
                return (tf32_peak, f"{label} TF32") if tf32 and tf32_peak else (fp32, f"{label} FP32")
            peak = fp16 if precision == "mixed_float16" else bf16
            if peak is None:
                return None, f"{label} has no {precision.split('_')[1]} tensor cores"
            return peak, f"{label} {precision.split('_')[1].upper()}"
    return None, f"peak TFLOPS of {device_name or 'this device'} unknown"


def training_flops(macs_per_example: int) -> int:
    """FLOPs of one training example: forward + backward (2x forward), 2 FLOPs per multiply-add."""
    return 6 * macs_per_example


def window_stats(seconds: list, examples_per_window: int, steps_per_window: int, cpu_seconds: list = ()) -> dict:
    """Median and spread of examples/sec over timed windows, the median step time and, given the process's CPU
    time per window, the median CPU time per step (less sensitive than wall time to other work on the host)."""
    rates = sorted(examples_per_window / s for s in seconds)
    quartiles = statistics.quantiles(rates, n=4, method="inclusive") if len(rates) > 1 else [rates[0]] * 3
    stats = {"examples_per_sec": statistics.median(rates), "examples_per_sec_min": rates[0],
             "examples_per_sec_max": rates[-1], "examples_per_sec_p25": quartiles[0],
             "examples_per_sec_p75": quartiles[2], "window_examples_per_sec": [examples_per_window / s for s in seconds],
             "step_time_ms": 1000 * statistics.median(seconds) / steps_per_window}
    if cpu_seconds:
        stats["window_cpu_seconds"] = list(cpu_seconds)
        stats["cpu_ms_per_step"] = 1000 * statistics.median(cpu_seconds) / steps_per_window
    return stats


def _case_label(result: dict, varying: tuple) -> str:
    if not varying:
        return ""
    return "@" + ",".join(f"{k}={_fmt_value(k, result[k])}" for k in varying)


def _fmt_value(key, value):
    return ("on" if value else "off") if key == "jit_compile" else value


def examples_per_cpu_second(result: dict):
    return 1000 * result["batch_size"] / result["cpu_ms_per_step"] if result.get("cpu_ms_per_step") else None


def _devices(result: dict) -> int:
    return result.get("num_replicas") or 1


def _pairs(results: list, rate) -> list:
    """(key, numerator, denominator) of every ratio the results allow: tfgpu against each baseline on the same
    devices (tfgpu_one_device stands in for tfgpu when tfgpu ran on more devices than the baseline; a pair on
    different devices is never made), tfgpu's scaling over one device, and each runner's precision and XLA
    gains. Keys carry the case's settings only when they vary across the run."""
    ok = [r for r in results if rate(r)]
    dims = ("batch_size", "precision", "jit_compile")
    varying = tuple(d for d in dims if len({r[d] for r in results}) > 1)
    by_key = {(r["name"], r["batch_size"], r["precision"], r["jit_compile"]): r for r in ok}
    out = []
    for r in ok:
        key = (r["batch_size"], r["precision"], r["jit_compile"])
        if r["name"] == "tfgpu":
            one = by_key.get(("tfgpu_one_device",) + key)
            for baseline in BASELINES:
                base = by_key.get((baseline,) + key)
                mine = next((m for m in (r, one) if base and m and _devices(m) == _devices(base)), None)
                if mine:
                    out.append((f"tfgpu/{baseline}{_case_label(r, varying)}", mine, base))
            if one and _devices(r) > 1:
                out.append((f"tfgpu:{_devices(r)}_devices/1_device{_case_label(r, varying)}", r, one))
        if r["name"] not in ("tfgpu", "keras_fit"):
            continue
        if r["precision"] != "float32":
            base = by_key.get((r["name"], r["batch_size"], "float32", r["jit_compile"]))
            if base:
                label = _case_label(r, tuple(d for d in varying if d != "precision"))
                out.append((f"{r['name']}:{r['precision']}/float32{label}", r, base))
        if r["name"] == "tfgpu" and r["jit_compile"] and r.get("jit_compile_effective"):
            base = by_key.get(("tfgpu", r["batch_size"], r["precision"], False))
            if base:
                label = _case_label(r, tuple(d for d in varying if d != "jit_compile"))
                out.append((f"tfgpu:xla_on/xla_off{label}", r, base))
    return out


def ratios(results: list, rate=lambda r: r.get("examples_per_sec")) -> dict:
    """Ratios of ``rate`` (default examples/sec, the pooled median of each runner) per case: ``tfgpu/BASELINE``
    on the same devices, ``tfgpu:N_devices/1_device`` (scaling, its own figure), ``RUNNER:PRECISION/float32``
    and ``tfgpu:xla_on/xla_off``; one case gives e.g. ``{"tfgpu/keras_fit": 1.04}``."""
    return {key: round(rate(a) / rate(b), 4) for key, a, b in _pairs(results, rate)}


def ratio_spread(results: list, rate=lambda r: r.get("examples_per_sec")) -> dict:
    """Per ratio of ``ratios``: min, max and count of the per-repeat ratios (round i of one runner over round i of
    the other; the runners alternate within a round), so a single run cannot pass for a trend. A ratio over
    one repeat has n = 1 and no spread."""
    out = {}
    for key, a, b in _pairs(results, rate):
        each = [rate(x) / rate(y) for x, y in zip(a.get("rounds") or [a], b.get("rounds") or [b])
                if rate(x) and rate(y)]
        if each:
            out[key] = {"min": round(min(each), 4), "max": round(max(each), 4), "n": len(each)}
    return out


def devices_note(results: list) -> list:
    """One line per case where tfgpu ran on more devices than the one-device baselines: which run stood in."""
    tfgpu = {(r["batch_size"], r["precision"], r["jit_compile"]): r for r in results if r["name"] == "tfgpu"}
    notes = []
    for r in results:
        mine = tfgpu.get((r["batch_size"], r["precision"], r["jit_compile"]))
        if r["name"] == "tfgpu_one_device" and r.get("status") == "ok" and mine:
            notes.append(f"batch {r['batch_size']} {r['precision']}: tfgpu ran on {_devices(mine)} devices, "
                         f"keras_fit on 1, so tfgpu/keras_fit* compares tfgpu_one_device (tfgpu on one device); "
                         f"the {_devices(mine)}-device run is the scaling ratio")
    return notes


def add_mfu(result: dict) -> None:
    """Model FLOPs utilisation: achieved training FLOP/s over the devices' summed dense peak (a GPU's datasheet
    peak; on a CPU the matmul probe's, ``case.cpu_matmul_peak_tflops``); None where the peak is unknown."""
    peak = result.get("peak_tflops_per_device")
    achieved = None
    if result.get("examples_per_sec") and result.get("macs_per_example"):
        achieved = result["examples_per_sec"] * training_flops(result["macs_per_example"])
        result["achieved_tflops"] = achieved / 1e12
    if achieved and peak:
        result["mfu"] = round(achieved / (peak * 1e12 * result["num_devices"]), 4)
    else:
        result["mfu"] = None


def pool_rounds(results: list) -> dict:
    """One result from several rounds of the same measurement: all their windows pooled, the highest peak
    memory; a round that failed makes the whole measurement fail (its reason is kept)."""
    failed = [r for r in results if r.get("status") != "ok"]
    if failed or len(results) == 1:
        return {**(failed or results)[0], "repeats": len(results), **({} if failed else {"rounds": _rounds(results)})}
    first = results[0]
    per_window = first["steps_per_window"] * first["batch_size"]
    rates = [rate for r in results for rate in r["window_examples_per_sec"]]
    pooled = {**first, "repeats": len(results), "peak_memory_bytes": max(r["peak_memory_bytes"] for r in results)}
    cpu = [c for r in results for c in r.get("window_cpu_seconds", ())]
    pooled.update(window_stats([per_window / rate for rate in rates], per_window, first["steps_per_window"], cpu))
    pooled["window_examples_per_sec"] = rates
    pooled["rounds"] = _rounds(results)
    return pooled


def _rounds(results: list) -> list:
    """Each round's own median rate and CPU time per step: the ratio spread pairs rounds of two runners."""
    return [{"examples_per_sec": r.get("examples_per_sec"), "cpu_ms_per_step": r.get("cpu_ms_per_step"),
             "batch_size": r.get("batch_size")} for r in results]


