"""The readable benchmark report: a fixed-width table of every measurement, the auto batch search, then the
ratios with their spread over the paired repeats."""
from tfgpu.bench.stats import XLA_SCOPE_TEXT


def _mib(n):
    return f"{n / 2**20:,.0f} MiB" if n else "-"


def format_report(report: dict) -> str:
    """A fixed-width table of every measurement, then the ratios."""
    env = report.get("environment") or {}
    lines = [f"machine: {', '.join(env.get('gpus') or []) or env.get('cpu', '?')} ({env.get('cpu_count')} CPUs); "
             f"TensorFlow {env.get('tensorflow')}, Keras {env.get('keras')}"]
    head = ("name", "batch", "precision", "xla", "strategy", "ex/s", "min-max", "step ms", "cpu ms", "peak mem",
            "MFU")
    rows, xla_dropped = [], False
    for r in report["results"]:
        xla = r.get("xla_scope") or ("on" if r["jit_compile"] else "off")
        xla = "off" if xla == "none" else xla
        if r["jit_compile"] and r.get("jit_compile_effective") is False:
            xla, xla_dropped = "off*", True
        strategy = f"{r.get('strategy', '-')}({r['num_replicas']})" if r.get("num_replicas") else "-"
        if r.get("examples_per_sec"):
            rows.append((r["name"], str(r["batch_size"]), r["precision"], xla,
                         strategy, f"{r['examples_per_sec']:.1f}",
                         f"{r['examples_per_sec_min']:.0f}-{r['examples_per_sec_max']:.0f}",
                         f"{r['step_time_ms']:.1f}",
                         f"{r['cpu_ms_per_step']:.1f}" if r.get("cpu_ms_per_step") else "-",
                         _mib(r.get("peak_memory_bytes")),
                         f"{100 * r['mfu']:.1f}%" if r.get("mfu") is not None else "-"))
        else:
            rows.append((r["name"], str(r.get("batch_size")), r["precision"], xla,
                         strategy, f"{r['status']}: {r.get('reason', '')}"[:120]) + ("",) * 5)
    done = [row for row in rows if row[6]]
    widths = [max(len(row[i]) for row in [head] + done) for i in range(len(head))]
    for row in [head] + rows:
        if not row[6]:  # a failed or skipped run: its reason instead of numbers
            lines.append("  ".join(c.ljust(w) for c, w in zip(row[:5], widths)) + "  " + row[5])
            continue
        lines.append("  ".join(c.rjust(w) if i in (1, 5, 6, 7, 8, 9, 10) else c.ljust(w)
                               for i, (c, w) in enumerate(zip(row, widths))).rstrip())
    scopes = sorted({r.get("xla_scope") for r in report["results"]} - {None, "none"})
    if scopes:
        lines.append("xla: " + "; ".join(f"{k} = {XLA_SCOPE_TEXT[k]}" for k in scopes))
    copied = sorted({r["name"] for r in report["results"] if "inside each step" in (r.get("input_to_device") or "")})
    if copied:
        lines.append(f"input: {', '.join(copied)} copy each batch to the GPU inside the step, tfgpu prefetches it to "
                     "the device; --keras_one_device_strategy gives fit the same")
    for r in report["results"]:
        if r.get("achieved_tflops"):
            peak = r.get("peak_tflops_per_device")
            of_peak = (f" of {peak * r['num_devices']:.3g} TFLOP/s peak ({r.get('peak_source')}): {100 * r['mfu']:.1f}%"
                       if peak and r.get("mfu") is not None else f" (peak unknown: {r.get('peak_source')})")
            lines.append(f"compute: {r['name']} {r['precision']} batch {r['batch_size']}: "
                         f"{6 * r['macs_per_example'] / 1e6:,.1f} MFLOP per training example (3 x forward), "
                         f"{r['achieved_tflops']:.3g} TFLOP/s achieved" + of_peak)
    if xla_dropped:
        lines.append("off* = --jit_compile asked for, not in effect (XLA cannot span logical CPU replicas, "
                     "or synchronized BatchNorm)")
    for search in report.get("auto_batch_size", []):
        lines.append(f"auto batch ({search['precision']}, xla {'on' if search['jit_compile'] else 'off'}): largest "
                     f"per-replica batch that fits = {search['max_per_replica_batch_size']} (limited by "
                     f"{search['limited_by']}; probes: " + ", ".join(
                         f"{pr['per_replica_batch_size']}{'' if pr['fits'] else ' OOM'}" for pr in search["probes"])
                     + ")")
    if report.get("precision_auto"):
        auto = report["precision_auto"]
        lines.append(f"precision auto = {auto['precision']} ({auto['reason']})")
    lines += [f"note: {n}" for n in report.get("notes", [])]
    lines.append("ratios (pooled medians; min-max of the per-repeat ratios):" if report["ratios"] else
                 "ratios: none (a runner failed or no baseline was asked for)")
    lines += [format_ratio(k, v, report.get("ratio_spread", {}).get(k)) for k, v in report["ratios"].items()]
    if report.get("cpu_time_ratios"):
        lines.append("examples per CPU-second ratios (less moved by other work on the host than wall clock):")
        lines += [format_ratio(k, v, report.get("cpu_time_ratio_spread", {}).get(k))
                  for k, v in report["cpu_time_ratios"].items()]
    return "\n".join(lines)


def format_ratio(key: str, value: float, spread) -> str:
    """``  key = 0.998 (min-max 0.981-1.012 over 3 paired repeats)``; one repeat says it has no spread."""
    if not spread or spread["n"] < 2:
        return f"  {key} = {value:.3f} (1 repeat: no spread; --repeats=3 or more to tell a trend from noise)"
    return f"  {key} = {value:.3f} (min-max {spread['min']:.3f}-{spread['max']:.3f} over {spread['n']} paired repeats)"
