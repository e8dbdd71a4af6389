"""tfgpu.doctor: the real report on this machine, and the advice on recorded device descriptions."""
import copy
import glob
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from importlib import metadata

import psutil
import pytest

from tfgpu import doctor

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(REPO, "tests", "fixtures", "devices")


def fixture(name):
    with open(os.path.join(FIXTURES, f"{name}.json")) as f:
        return json.load(f)


def run_doctor(*args, env=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "tfgpu.doctor", *args], cwd=REPO, text=True, timeout=timeout,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """The doctor run for real on this machine: (report JSON, stdout, seconds, the model_dir asked about)."""
    tmp = tmp_path_factory.mktemp("doctor")
    model_dir = tmp / "runs" / "not-yet-created"
    out = tmp / "doctor.json"
    started = time.monotonic()
    proc = run_doctor(f"--model_dir={model_dir}", f"--output_json={out}")
    seconds = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out) as f:
        return json.load(f), proc.stdout, seconds, str(model_dir)


# -- the real report on this machine ------------------------------------------------------------------------------
def test_live_report_versions_and_build(live):
    report, _, seconds, _ = live
    assert seconds < 60  # the issue asks for ~15 s; a shared 2-core machine under load gets slack
    assert report["python"] == platform.python_version()
    assert report["tensorflow"] == metadata.version("tensorflow")
    assert report["keras"] == metadata.version("keras")
    build = report["build"]
    assert isinstance(build["is_cuda_build"], bool)
    if build["is_cuda_build"]:
        assert build["cuda_version"] and build["cudnn_version"] and build["cuda_compute_capabilities"]


def test_live_report_gpus_or_the_reason(live):
    report = live[0]
    assert isinstance(report["gpus"], list)
    if report["gpus"]:
        assert report["gpu_reason"] is None
        for g in report["gpus"]:
            assert g["name"] and g["memory_bytes"] > 0
            assert doctor.gpu_capabilities(g["compute_capability"])["generation"] == g["generation"]
            assert isinstance(g["bf16_tensor_cores"], bool) and isinstance(g["fp16_tensor_cores"], bool)
            assert g["numa_node"] is None or isinstance(g["numa_node"], int)
    else:
        assert report["gpu_reason"] and all(isinstance(r, str) and r for r in report["gpu_reason"])
        assert report["recommendations"][0].startswith("no GPU: ")
        if not os.path.exists("/dev/nvidia0"):  # this machine: no driver, and TensorFlow's own words kept
            assert any("NVIDIA driver" in r for r in report["gpu_reason"])
            assert report["driver"]["libcuda"] != "loaded"


def test_live_report_nccl_xla(live):
    report = live[0]
    nccl = report["nccl"]
    assert isinstance(nccl["available"], bool) and nccl["detail"]
    assert (nccl["library"] is not None) == nccl["available"]
    xla = report["xla"]
    assert xla["cpu_jit_compile"] is True, xla["error"]  # TF 2.21 wheels always carry XLA's CPU backend
    assert 0 < xla["seconds"] < 30


def test_live_report_cpu_memory_disk(live):
    report, _, _, model_dir = live
    cpu = report["cpu"]
    with open("/proc/cpuinfo") as f:
        flags = set(next(line for line in f if line.startswith("flags")).split(":", 1)[1].split())
    assert cpu["flags"] == {f: f in flags for f in doctor.CPU_FLAGS}
    assert cpu["model"]
    assert cpu["logical_cores"] == os.cpu_count()
    assert 1 <= cpu["usable_cores"] == len(os.sched_getaffinity(0))
    assert report["memory"]["total_bytes"] == psutil.virtual_memory().total
    assert 0 < report["memory"]["available_bytes"] <= report["memory"]["total_bytes"]
    disk = report["disk"]
    assert disk["path"] == model_dir and not os.path.exists(model_dir)  # asked about, not created
    assert disk["measured_at"] == os.path.dirname(os.path.dirname(model_dir))
    free_now = shutil.disk_usage(disk["measured_at"]).free
    assert abs(disk["free_bytes"] - free_now) < max(0.05 * free_now, 2 ** 30)


def test_live_report_prints_and_recommends(live):
    report, stdout, _, _ = live
    assert report["recommendations"] == doctor.recommend(report)
    assert f"tensorflow {report['tensorflow']}" in stdout
    tail = stdout.split("Recommendations:", 1)[1]
    assert all(r.strip() in tail for r in report["recommendations"])
    assert "--precision=" in tail and "XLA" in tail


def test_bad_flags_are_one_line_errors(tmp_path, capsys):
    def error(*args):
        assert doctor.main(list(args)) == 1
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1, lines
        return lines[0]

    assert error(f"--output_json={tmp_path}/missing/d.json") == \
        f"error: --output_json: directory {str(tmp_path / 'missing')!r} does not exist or is not writable"
    (tmp_path / "file").write_text("x")
    assert error(f"--model_dir={tmp_path}/file").startswith(f"error: --model_dir: '{tmp_path}/file' is a file")
    assert error("--modeldir=x").startswith("error: --modeldir: unknown flag")


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
        assert doctor.format_report({**report, "recommendations": doctor.recommend(report)})


def test_a100_host_with_two_numa_nodes():
    recs = doctor.recommend(fixture("a100x8_two_numa_nodes"))
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
    recs = doctor.recommend(fixture("v100x4_cloud_no_numa"))
    assert recs[0].startswith("precision: --precision=mixed_float16 (Tesla V100-SXM2-16GB, Volta")
    assert any(r.startswith("NUMA: the GPUs' NUMA node is not reported") for r in recs)
    assert not any("numactl" in r for r in recs)
    assert "driver: it supports CUDA 11.4 but TensorFlow needs CUDA 12.5.1: update the NVIDIA driver" in recs


def test_t4_host_single_numa_node_and_low_disk():
    recs = doctor.recommend(fixture("t4_single_small_disk"))
    assert recs[0].startswith("precision: --precision=mixed_float16 (Tesla T4, Turing, compute capability 7.5")
    assert any(r.startswith("NUMA: every GPU is on node 0; run numactl --cpunodebind=0 --membind=0") for r in recs)
    assert any(r.startswith("disk: only 3.0 GiB free at /runs/exp") for r in recs)
    assert not any(r.startswith("NCCL") for r in recs)  # one GPU: nothing to all-reduce between GPUs


def test_cpu_only_hosts_with_and_without_bf16():
    amx = doctor.recommend(fixture("cpu_only_amx_bf16"))
    assert amx[0].startswith("no GPU: no NVIDIA driver: libcuda.so.1 does not load")
    assert "TensorFlow said: Could not find cuda drivers" in amx[0]
    assert amx[1].startswith("precision: --precision=mixed_bfloat16 (this CPU has avx512_bf16 and amx_bf16")
    plain = fixture("cpu_only_avx2")
    assert plain["gpu_reason"] is None  # recommend derives it from the facts
    recs = doctor.recommend(plain)
    assert recs[0].startswith("no GPU: TensorFlow 2.21.0 was built without CUDA")
    assert recs[1].startswith("precision: --precision=float32 (this CPU has no AVX512_BF16/AMX")
    assert any(r.startswith("CPU: this process may use 8 of 16 cores") for r in recs)


def _with_gpus(specs):
    """The A100 host with its GPUs replaced by (name, compute capability) pairs."""
    report = copy.deepcopy(fixture("a100x8_two_numa_nodes"))
    template = report["gpus"][0]
    report["gpus"] = [{**template, "index": i, "name": name, "compute_capability": cc,
                       **doctor.gpu_capabilities(cc)} for i, (name, cc) in enumerate(specs)]
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
    recs = doctor.recommend(_with_gpus(specs))
    assert recs[0].startswith(f"precision: --precision={precision} ")
    if extra:
        assert any(extra in r for r in recs), recs


def test_no_gpu_reasons_name_the_cause():
    base = fixture("cpu_only_amx_bf16")
    hidden = {**base, "cuda_visible_devices": "-1"}
    assert "CUDA_VISIBLE_DEVICES='-1' hides every GPU" in doctor.no_gpu_reasons(hidden)
    assert any("CUDA_VISIBLE_DEVICES=''" in r for r in doctor.no_gpu_reasons({**base, "cuda_visible_devices": ""}))
    assert not any("CUDA_VISIBLE" in r for r in doctor.no_gpu_reasons({**base, "cuda_visible_devices": "0,1"}))
    driver_ok = {**base, "driver": {**base["driver"], "libcuda": "loaded", "device_nodes": ["/dev/nvidia0"],
                                    "cuinit": "CUDA_ERROR_NO_DEVICE (100)"}, "tf_log": []}
    assert doctor.no_gpu_reasons(driver_ok) == [
        "the NVIDIA driver is present but cuInit failed with CUDA_ERROR_NO_DEVICE (100)"]
    missing_libs = {**driver_ok, "driver": {**driver_ok["driver"], "cuinit": "CUDA_SUCCESS"},
                    "tf_log": ["Could not load dynamic library 'libcudnn.so.9'; dlerror: libcudnn.so.9: cannot open",
                               "Cannot dlopen some GPU libraries."]}
    (reason,) = doctor.no_gpu_reasons(missing_libs)
    assert reason.startswith("TensorFlow could not load its CUDA libraries (Could not load dynamic library "
                             "'libcudnn.so.9'") and "tensorflow[and-cuda]" in reason


def test_parsers():
    assert doctor.parse_device_desc("device: 3, name: NVIDIA A100-SXM4-80GB, pci bus id: 0000:4e:00.0, "
                                    "compute capability: 8.0") == {
        "name": "NVIDIA A100-SXM4-80GB", "pci_bus_id": "0000:4e:00.0", "compute_capability": "8.0"}
    assert doctor.sysfs_bus_id("00000000:4E:00.0") == "0000:4e:00.0"
    assert doctor.sysfs_bus_id("07:00.0") == "0000:07:00.0"
    info = doctor.parse_cpuinfo("processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu avx2 avx512f amx_tile\n"
                                "processor\t: 1\nmodel name\t: Some CPU\nflags\t\t: fpu\n")
    assert info == {"model": "Some CPU", "flags": {"avx2": True, "avx512f": True, "avx512_bf16": False,
                                                   "amx_bf16": False, "amx_tile": True}}
    built = ["sm_60", "sm_70", "sm_80", "sm_89", "compute_90"]
    assert [doctor.kernel_support(cc, built) for cc in ("8.6", "9.0", "10.0", "12.0", "5.2", "7.5")] == [
        "native", "native", "ptx-jit", "ptx-jit", "unsupported", "native"]  # compute_90 = sm_90 code + PTX
    assert [doctor.gpu_capabilities(cc)["generation"] for cc in ("6.1", "7.0", "7.5", "8.0", "8.6", "8.9", "9.0",
                                                                   "10.0", "12.0")] == [
        "Pascal", "Volta", "Turing", "Ampere", "Ampere", "Ada Lovelace", "Hopper", "Blackwell", "Blackwell"]
