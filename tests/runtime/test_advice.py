"""tfgpu.runtime.advice: the doctor's recommendations on recorded hosts (tests/fixtures/devices/*.json)."""
import copy
import glob
import json
import os

import pytest

from tests.conftest import REPO
from tfgpu.runtime import advice, host

FIXTURES = os.path.join(REPO, "tests", "fixtures", "devices")


def fixture(name):
    with open(os.path.join(FIXTURES, f"{name}.json")) as f:
        return json.load(f)



# -- recommendations on recorded device descriptions -------------------------------------------------------------
def test_every_fixture_is_a_complete_report():
    live_keys = {"python", "tensorflow", "keras", "build", "gpus", "gpu_reason", "driver", "nccl", "xla", "cpu",
                 "memory", "disk", "cuda_visible_devices", "tf_log"}
    paths = sorted(glob.glob(os.path.join(FIXTURES, "*.json")))
    assert len(paths) >= 5
    for path in paths:
        with open(path) as f:
            report = json.load(f)
        assert live_keys <= set(report), (path, live_keys - set(report))
        assert report["_source"]
        assert advice.format_report({**report, "recommendations": advice.recommend(report)})


def test_a100_host_with_two_numa_nodes():
    recs = advice.recommend(fixture("a100x8_two_numa_nodes"))
    assert recs[0].startswith("precision: --precision=mixed_bfloat16 (NVIDIA A100-SXM4-80GB, Ampere")
    numa = "\n".join(r for r in recs if "numactl" in r or r.startswith("NUMA"))
    assert "span nodes 0, 1" in numa and "should stay unbound" in numa
    for i in range(8):
        node = 0 if i < 4 else 1
        assert f"GPU {i} (" in numa and f"node {node}" in numa
    assert "CUDA_VISIBLE_DEVICES=0,1,2,3 numactl --cpunodebind=0 --membind=0" in numa
    assert "CUDA_VISIBLE_DEVICES=4,5,6,7 numactl --cpunodebind=1 --membind=1" in numa
    assert any(r.startswith("NCCL 2.21.5: set NCCL_DEBUG=INFO") for r in recs)
    assert not any(r.startswith(("no GPU", "driver:", "disk:", "GPUs differ")) or "PTX" in r for r in recs)


def test_v100_host_without_numa_and_an_old_driver():
    recs = advice.recommend(fixture("v100x4_cloud_no_numa"))
    assert recs[0].startswith("precision: --precision=mixed_float16 (Tesla V100-SXM2-16GB, Volta")
    assert any(r.startswith("NUMA: the GPUs' NUMA node is not reported") for r in recs)
    assert not any("numactl" in r for r in recs)
    assert "driver: it supports CUDA 11.4 but TensorFlow needs CUDA 12.5.1: update the NVIDIA driver" in recs


def test_t4_host_single_numa_node_and_low_disk():
    recs = advice.recommend(fixture("t4_single_small_disk"))
    assert recs[0].startswith("precision: --precision=mixed_float16 (Tesla T4, Turing, compute capability 7.5")
    assert any(r.startswith("NUMA: every GPU is on node 0; run numactl --cpunodebind=0 --membind=0") for r in recs)
    assert any(r.startswith("disk: only 3.0 GiB free at /runs/exp") for r in recs)
    assert not any(r.startswith("NCCL") for r in recs)  # one GPU: nothing to all-reduce between GPUs


def test_cpu_only_hosts_with_and_without_bf16():
    amx = advice.recommend(fixture("cpu_only_amx_bf16"))
    assert amx[0].startswith("no GPU: no NVIDIA driver: libcuda.so.1 does not load")
    assert "TensorFlow said: Could not find cuda drivers" in amx[0]
    assert amx[1].startswith("precision: --precision=mixed_bfloat16 (this CPU has amx_bf16")
    no_amx = advice.recommend(fixture("cpu_only_avx512_bf16_no_amx"))
    assert no_amx[1].startswith("precision: --precision=float32 (this CPU has avx512_bf16 but no AMX")
    plain = fixture("cpu_only_avx2")
    assert plain["gpu_reason"] is None  # recommend derives it from the facts
    recs = advice.recommend(plain)
    assert recs[0].startswith("no GPU: TensorFlow 2.21.0 was built without CUDA")
    assert recs[1].startswith("precision: --precision=float32 (this CPU has no AVX512_BF16/AMX")
    assert any(r.startswith("CPU: this process may use 8 of 16 cores") for r in recs)


def _with_gpus(specs):
    """The A100 host with its GPUs replaced by (name, compute capability) pairs."""
    report = copy.deepcopy(fixture("a100x8_two_numa_nodes"))
    template = report["gpus"][0]
    report["gpus"] = [{**template, "index": i, "name": name, "compute_capability": cc,
                       **host.gpu_capabilities(cc)} for i, (name, cc) in enumerate(specs)]
    return report


@pytest.mark.parametrize("specs, precision, extra", [
    ([("NVIDIA H100 80GB HBM3", "9.0")], "mixed_bfloat16", None),
    ([("NVIDIA L4", "8.9")], "mixed_bfloat16", None),
    ([("Tesla P100-PCIE-16GB", "6.0")], "float32", None),
    ([("NVIDIA A100-SXM4-80GB", "8.0"), ("Tesla T4", "7.5")], "mixed_float16", "GPUs differ"),
    ([("NVIDIA GeForce RTX 5090", "12.0")], "mixed_bfloat16", "JIT-compiles PTX"),
    ([("Tesla M60", "5.2")], "float32", "has no kernels for it (built for sm_60"),
])
def test_precision_and_kernel_advice_by_generation(specs, precision, extra):
    recs = advice.recommend(_with_gpus(specs))
    assert recs[0].startswith(f"precision: --precision={precision} ")
    if extra:
        assert any(extra in r for r in recs), recs
