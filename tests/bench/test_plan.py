"""tfgpu.bench.plan: --precision=auto resolves per host as tfgpu.train's does, before any measurement."""
import pytest

from tfgpu import benchmark
from tfgpu.bench import plan
from tfgpu.runtime.host import cpu_facts
from tfgpu.runtime.precision import resolve_auto


@pytest.mark.parametrize("names, cpu_flags, gpus, expected", [
    (("auto",), {"avx512_bf16": True, "amx_bf16": True}, [], ("mixed_bfloat16",)),
    (("auto", "mixed_bfloat16"), {"avx512_bf16": True}, [], ("float32", "mixed_bfloat16")),  # no AMX: float32
    (("auto",), {}, [], ("float32",)),
    (("auto", "float32"), {}, [], ("float32",)),  # auto is float32 here: measured once
    (("float32", "auto"), {}, [{"name": "Tesla V100", "compute_capability": "7.0"}], ("float32", "mixed_float16")),
    (("auto",), {}, [{"name": "NVIDIA H100", "compute_capability": "9.0"}], ("mixed_bfloat16",)),
])
def test_auto_is_the_policy_tfgpu_train_picks_on_the_host(names, cpu_flags, gpus, expected):
    resolved, auto = plan.resolve_precisions(names, cpu_flags, gpus)
    assert resolved == expected
    assert auto["precision"] == resolve_auto(cpu_flags, gpus)[0] and auto["reason"]


def test_without_auto_the_list_is_unchanged():
    assert plan.resolve_precisions(("float32", "mixed_bfloat16"), {}, []) == (("float32", "mixed_bfloat16"), {})


def test_the_benchmark_accepts_precision_auto_and_records_the_choice():
    p = benchmark.parser()
    opts = p.parse_args(["--model=small_cnn", "--image_size=8", "--precision=auto", "--baseline=keras_fit"])
    checked = plan.plan(opts, p.config_values(opts))
    chosen, reason = resolve_auto(cpu_facts()["flags"], plan.host_gpus(-1))
    assert checked.precisions == (chosen,)
    assert checked.precision_auto == {"precision": chosen, "reason": reason}
