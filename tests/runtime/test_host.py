"""tfgpu.runtime.host: the pure parts of collecting host facts (parsers, why no GPU), on recorded text."""
import json
import os


from tests.conftest import REPO
from tfgpu.runtime import host

FIXTURES = os.path.join(REPO, "tests", "fixtures", "devices")


def fixture(name):
    with open(os.path.join(FIXTURES, f"{name}.json")) as f:
        return json.load(f)


def test_no_gpu_reasons_name_the_cause():
    base = fixture("cpu_only_amx_bf16")
    hidden = {**base, "cuda_visible_devices": "-1"}
    assert "CUDA_VISIBLE_DEVICES='-1' hides every GPU" in host.no_gpu_reasons(hidden)
    assert any("CUDA_VISIBLE_DEVICES=''" in r for r in host.no_gpu_reasons({**base, "cuda_visible_devices": ""}))
    assert not any("CUDA_VISIBLE" in r for r in host.no_gpu_reasons({**base, "cuda_visible_devices": "0,1"}))
    driver_ok = {**base, "driver": {**base["driver"], "libcuda": "loaded", "device_nodes": ["/dev/nvidia0"],
                                    "cuinit": "CUDA_ERROR_NO_DEVICE (100)"}, "tf_log": []}
    assert host.no_gpu_reasons(driver_ok) == [
        "the NVIDIA driver is present but cuInit failed with CUDA_ERROR_NO_DEVICE (100)"]
    missing_libs = {**driver_ok, "driver": {**driver_ok["driver"], "cuinit": "CUDA_SUCCESS"},
                    "tf_log": ["Could not load dynamic library 'libcudnn.so.9'; dlerror: libcudnn.so.9: cannot open",
                               "Cannot dlopen some GPU libraries."]}
    (reason,) = host.no_gpu_reasons(missing_libs)
    assert reason.startswith("TensorFlow could not load its CUDA libraries (Could not load dynamic library "
                             "'libcudnn.so.9'") and "tensorflow[and-cuda]" in reason


def test_parsers():
    assert host.parse_device_desc("device: 3, name: NVIDIA A100-SXM4-80GB, pci bus id: 0000:4e:00.0, "
                                    "compute capability: 8.0") == {
        "name": "NVIDIA A100-SXM4-80GB", "pci_bus_id": "0000:4e:00.0", "compute_capability": "8.0"}
    assert host.sysfs_bus_id("00000000:4E:00.0") == "0000:4e:00.0"
    assert host.sysfs_bus_id("07:00.0") == "0000:07:00.0"
    info = host.parse_cpuinfo("processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu avx2 avx512f amx_tile\n"
                                "processor\t: 1\nmodel name\t: Some CPU\nflags\t\t: fpu\n")
    assert info == {"model": "Some CPU", "flags": {"avx2": True, "avx512f": True, "avx512_bf16": False,
                                                   "amx_bf16": False, "amx_tile": True}}
    built = ["sm_60", "sm_70", "sm_80", "sm_89", "compute_90"]
    assert [host.kernel_support(cc, built) for cc in ("8.6", "9.0", "10.0", "12.0", "5.2", "7.5")] == [
        "native", "native", "ptx-jit", "ptx-jit", "unsupported", "native"]  # compute_90 = sm_90 code + PTX
    assert [host.gpu_capabilities(cc)["generation"] for cc in ("6.1", "7.0", "7.5", "8.0", "8.6", "8.9", "9.0",
                                                                   "10.0", "12.0")] == [
        "Pascal", "Volta", "Turing", "Ampere", "Ampere", "Ada Lovelace", "Hopper", "Blackwell", "Blackwell"]
