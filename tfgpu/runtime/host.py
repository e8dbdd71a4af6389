"""What this host offers for training: versions, TensorFlow's build, GPUs (or why none), NCCL, XLA, CPU, memory, disk.

``collect`` gathers the facts (it imports TensorFlow with its C++ log captured and reads /proc and /sys); the
parsers and ``no_gpu_reasons`` are pure functions over recorded text and facts, tested on recorded hosts.
``python -m tfgpu.doctor`` prints them with advice (``tfgpu.runtime.advice``); the benchmark records
``cpu_facts`` beside its numbers.
"""
import contextlib
import ctypes
import glob
import os
import platform
import re
import shutil
import sys
import tempfile
import time

CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
GIB = 1024 ** 3

# NVIDIA GPU generation by compute capability (CUDA C++ Programming Guide, "Compute Capabilities").
_GENERATIONS = ((10, 0, "Blackwell"), (9, 0, "Hopper"), (8, 9, "Ada Lovelace"), (8, 0, "Ampere"),
                (7, 5, "Turing"), (7, 0, "Volta"), (6, 0, "Pascal"), (0, 0, "pre-Pascal"))

# Lines of TensorFlow's own log that explain a missing GPU (driver, libraries, cuInit, visibility).
_GPU_LOG = re.compile(r"cuda|cuinit|gpu|dlopen|driver|libcu|nccl|visible", re.IGNORECASE)
_GLOG_PREFIX = re.compile(r"^[IWEF]\d{4} [\d:.]+\s+\d+ ")
_SOURCE_PREFIX = re.compile(r"^[\w.]+\.cc:\d+\]\s*")
_NOT_ABOUT_GPUS = re.compile(r"oneDNN|rebuild TensorFlow|StreamExecutor|XLA service|Compiled cluster")


# -- pure functions over recorded facts -----------------------------------------------------------
def gpu_capabilities(compute_capability: str) -> dict:
    """Generation and tensor-core types of a compute capability such as "8.0".

    fp16 tensor cores from 7.0 (Volta); bf16 and tf32 from 8.0 (Ampere): CUDA C++ Programming Guide,
    "Warp Matrix Functions" (alternate floating point: compute capability 8.0 and higher).
    """
    major, minor = (int(x) for x in compute_capability.split(".")[:2])
    generation = next(name for ma, mi, name in _GENERATIONS if (major, minor) >= (ma, mi))
    return {"generation": generation, "fp16_tensor_cores": major >= 7, "bf16_tensor_cores": major >= 8,
            "tf32": major >= 8}


def parse_device_desc(desc: str) -> dict:
    """Fields of TensorFlow's GPU description, e.g. "device: 0, name: Tesla T4, pci bus id: 0000:00:1e.0,
    compute capability: 7.5" -> {"name": "Tesla T4", "pci_bus_id": "0000:00:1e.0", "compute_capability": "7.5"}."""
    out = {}
    for key, field in (("name", "name"), ("pci bus id", "pci_bus_id"), ("compute capability", "compute_capability")):
        m = re.search(rf"(?:^|, ){key}: ([^,]+)", desc)
        if m:
            out[field] = m.group(1).strip()
    return out


def sysfs_bus_id(bus_id: str) -> str:
    """A PCI bus id as /sys/bus/pci/devices names it: lower case, 4-digit domain ("00000000:07:00.0" ->
    "0000:07:00.0", "07:00.0" -> "0000:07:00.0")."""
    parts = bus_id.strip().lower().split(":")
    if len(parts) == 2:
        parts.insert(0, "0000")
    parts[0] = parts[0][-4:].rjust(4, "0")
    return ":".join(parts)


def parse_cpuinfo(text: str) -> dict:
    """CPU model and the training-relevant instruction-set flags from /proc/cpuinfo's text."""
    model, flags = "", set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key == "flags" and not flags:
            flags = set(value.split())
    return {"model": model, "flags": {f: f in flags for f in CPU_FLAGS}}


def cpu_facts() -> dict:
    """This CPU's model and training-relevant flags (``parse_cpuinfo`` of /proc/cpuinfo), the processor name
    when /proc has none."""
    cpu = parse_cpuinfo(_read("/proc/cpuinfo") or "")
    cpu["model"] = cpu["model"] or platform.processor()
    return cpu


def kernel_support(compute_capability: str, built_for: list) -> str:
    """How TensorFlow's CUDA kernels run on a GPU: "native" (a cubin for this major version at or below its
    minor), "ptx-jit" (only PTX for an older target: the driver compiles at start-up), or "unsupported".

    TensorFlow's build list uses "sm_XY" for binary code only and "compute_XY" for binary plus PTX (its
    configure.py). Compatibility rules: CUDA C++ Programming Guide, "Binary Compatibility" and "PTX
    Compatibility".
    """
    if not built_for:
        return "unknown"
    major, minor = (int(x) for x in compute_capability.split(".")[:2])
    targets = []
    for t in built_for:
        m = re.fullmatch(r"(sm|compute)_(\d+)(\d)a?", t)
        if m:
            targets.append((m.group(1), int(m.group(2)), int(m.group(3))))
    if any(ma == major and mi <= minor for _, ma, mi in targets):
        return "native"
    if any(kind == "compute" and (ma, mi) <= (major, minor) for kind, ma, mi in targets):
        return "ptx-jit"
    return "unsupported"


def no_gpu_reasons(facts: dict) -> list:
    """Why TensorFlow lists no GPU, most direct cause first, from the facts ``collect`` gathers."""
    reasons = []
    build, driver = facts.get("build") or {}, facts.get("driver") or {}
    if not build.get("is_cuda_build"):
        reasons.append(f"TensorFlow {facts.get('tensorflow', '')} was built without CUDA (a CPU-only build): "
                       "install tfgpu[gpu] (tensorflow[and-cuda]) or use the GPU Docker image")
    cvd = facts.get("cuda_visible_devices")
    if cvd is not None and not [d for d in cvd.split(",") if d.strip() and not d.strip().startswith("-")]:
        reasons.append(f"CUDA_VISIBLE_DEVICES={cvd!r} hides every GPU")
    nodes, libcuda = driver.get("device_nodes") or [], driver.get("libcuda")
    if libcuda != "loaded":
        where = "and there are no /dev/nvidia* device nodes" if not nodes else f"although {nodes[0]} exists"
        reasons.append(f"no NVIDIA driver: libcuda.so.1 does not load ({libcuda or 'not tried'}) {where}; in a "
                       "container, start it with the NVIDIA container toolkit (docker run --gpus all)")
    elif driver.get("cuinit") not in (None, "CUDA_SUCCESS"):
        reasons.append(f"the NVIDIA driver is present but cuInit failed with {driver['cuinit']}")
    dlopen = [line for line in facts.get("tf_log") or [] if "dlopen" in line.lower() or "could not load" in
              line.lower()]
    if dlopen:
        reasons.append("TensorFlow could not load its CUDA libraries (" + "; ".join(dlopen[:3]) + "): install "
                       "tfgpu[gpu] (tensorflow[and-cuda]) so the matching CUDA/cuDNN wheels are present")
    if not reasons:
        reasons.append("TensorFlow lists no GPU although the driver initialises; is this host's GPU assigned to "
                       "this process (Slurm --gpus, Kubernetes nvidia.com/gpu)?")
    said = [line for line in facts.get("tf_log") or [] if line not in dlopen]
    if said:
        reasons.append("TensorFlow said: " + " | ".join(said[:3]))
    return reasons


# -- collecting the facts (side effects: imports TensorFlow, reads /proc and /sys) ----------------------------------
@contextlib.contextmanager
def _captured_stderr(lines: list):
    """Sends file descriptor 2 (where TensorFlow's C++ logs go) to a temp file; appends its lines on exit."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            lines.extend(tmp.read().decode(errors="replace").splitlines())


def _gpu_log_lines(lines: list) -> list:
    """TensorFlow's log lines about GPUs, without the glog prefix (time, thread), deduplicated."""
    out = []
    for line in lines:
        text = _SOURCE_PREFIX.sub("", _GLOG_PREFIX.sub("", line)).strip()
        if _GPU_LOG.search(text) and not _NOT_ABOUT_GPUS.search(text) and text not in out:
            out.append(text[:300])
    return out


def _read(path: str):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _numa_of(bus_id: str):
    node = _read(f"/sys/bus/pci/devices/{sysfs_bus_id(bus_id)}/numa_node") if bus_id else None
    return int(node) if node not in (None, "") else None


def _numa_nodes() -> dict:
    nodes = {}
    for path in sorted(glob.glob("/sys/devices/system/node/node[0-9]*")):
        nodes[os.path.basename(path)[4:]] = _read(os.path.join(path, "cpulist")) or ""
    return nodes


def _probe_cuda_driver(need_init: bool) -> dict:
    """The NVIDIA driver as CUDA sees it, through libcuda itself (no TensorFlow): loadable, version, cuInit."""
    module = (_read("/proc/driver/nvidia/version") or "").splitlines()
    out = {"device_nodes": sorted(glob.glob("/dev/nvidia[0-9]*")), "kernel_module": module[0] if module else None,
           "libcuda": None, "cuda_driver_version": None, "cuinit": None}
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        out["libcuda"] = str(e).replace("libcuda.so.1: ", "")
        return out
    out["libcuda"] = "loaded"
    version = ctypes.c_int(0)
    if cuda.cuDriverGetVersion(ctypes.byref(version)) == 0:
        out["cuda_driver_version"] = f"{version.value // 1000}.{version.value % 1000 // 10}"
    if need_init:
        code = cuda.cuInit(0)
        name = ctypes.c_char_p()
        cuda.cuGetErrorName(code, ctypes.byref(name))
        out["cuinit"] = f"{name.value.decode() if name.value else 'error'} ({code})" if code else "CUDA_SUCCESS"
    return out


def _probe_nccl() -> dict:
    """Whether libnccl.so.2 loads (the pip wheel nvidia-nccl-cu12 first, then the loader path) and its version."""
    candidates = []
    with contextlib.suppress(ImportError, AttributeError, TypeError):
        import nvidia.nccl  # the wheel tensorflow[and-cuda] installs

        candidates += [os.path.join(p, "lib", "libnccl.so.2") for p in nvidia.nccl.__path__]
    candidates.append("libnccl.so.2")
    for path in candidates:
        if os.sep in path and not os.path.exists(path):
            continue
        try:
            nccl = ctypes.CDLL(path)
        except OSError:
            continue
        code = ctypes.c_int(0)
        version = None
        if nccl.ncclGetVersion(ctypes.byref(code)) == 0 and code.value:
            v = code.value  # major*10000 + minor*100 + patch since NCCL 2.9 (major*1000 + ... before)
            version = f"{v // 10000}.{v % 10000 // 100}.{v % 100}" if v >= 20900 else f"{v // 1000}.{v % 1000 // 100}"
        return {"available": True, "version": version, "library": path, "detail": f"loaded {path}"}
    return {"available": False, "version": None, "library": None,
            "detail": "libnccl.so.2 is neither in the nvidia-nccl-cu12 wheel nor on the loader path"}


def _check_xla(tf) -> dict:
    """Compiles and runs a tiny function with XLA on the CPU and checks its result."""
    started = time.perf_counter()
    try:
        with tf.device("/CPU:0"):
            fn = tf.function(lambda x: tf.reduce_sum(tf.matmul(x, x) + 1.0), jit_compile=True)
            value = float(fn(tf.eye(4)).numpy())
        ok = abs(value - 20.0) < 1e-5  # eye(4) @ eye(4) + 1 sums to 4 + 16
        return {"cpu_jit_compile": ok, "seconds": round(time.perf_counter() - started, 3),
                "error": None if ok else f"wrong result {value} (expected 20.0)"}
    except Exception as e:  # noqa: BLE001 - the failure itself is the finding
        return {"cpu_jit_compile": False, "seconds": round(time.perf_counter() - started, 3),
                "error": f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"}


def _collect_gpus(tf) -> list:
    """Every GPU TensorFlow sees, from its own device list (memory growth on, so nothing is reserved)."""
    physical = tf.config.list_physical_devices("GPU")
    if not physical:
        return []
    from tensorflow.python.client import device_lib

    session_config = tf.compat.v1.ConfigProto()
    session_config.gpu_options.allow_growth = True
    try:
        described = [d for d in device_lib.list_local_devices(session_config) if d.device_type == "GPU"]
    except Exception:  # noqa: BLE001 - a GPU that fails to initialise still has a name and compute capability
        described = [None] * len(physical)
    gpus = []
    for index, device in enumerate(described):
        desc = parse_device_desc(device.physical_device_desc) if device is not None else {}
        details = tf.config.experimental.get_device_details(physical[index]) if index < len(physical) else {}
        cc = desc.get("compute_capability") or ".".join(map(str, details.get("compute_capability", (0, 0))))
        bus = desc.get("pci_bus_id")
        node = _numa_of(bus)
        gpu = {"index": index, "name": desc.get("name") or details.get("device_name", "unknown"),
               "compute_capability": cc,
               "memory_bytes": int(device.memory_limit) if device is not None else None, "pci_bus_id": bus,
               "numa_node": node,
               "numa_cpus": _read(f"/sys/devices/system/node/node{node}/cpulist") if node is not None and node >= 0
               else None}
        gpu.update(gpu_capabilities(cc))
        gpus.append(gpu)
    return gpus


def _disk(path: str) -> dict:
    """Free space of the filesystem ``path`` will live on (its nearest existing parent)."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    usage = shutil.disk_usage(probe)
    return {"path": os.path.abspath(path), "measured_at": probe, "free_bytes": usage.free, "total_bytes": usage.total}


def collect(model_dir: str = "") -> dict:
    """Every fact of the report (no recommendations); imports TensorFlow with its C++ log captured."""
    import psutil

    log = []
    with _captured_stderr(log):
        import keras
        import tensorflow as tf

        build = dict(tf.sysconfig.get_build_info())
        gpus = _collect_gpus(tf)
        xla = _check_xla(tf)
    report = {
        "time": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "python": platform.python_version(),
        "platform": platform.platform(), "tensorflow": tf.__version__, "keras": keras.__version__,
        "build": {"is_cuda_build": bool(build.get("is_cuda_build")), "cuda_version": build.get("cuda_version"),
                  "cudnn_version": build.get("cudnn_version"),
                  "cuda_compute_capabilities": list(build.get("cuda_compute_capabilities") or [])},
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "gpus": gpus, "gpu_reason": None, "tf_log": _gpu_log_lines(log),
        "driver": _probe_cuda_driver(need_init=not gpus), "nccl": _probe_nccl(), "xla": xla,
    }
    cpu = cpu_facts()
    cpu.update({"logical_cores": os.cpu_count(),
                "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
                "numa_nodes": _numa_nodes()})
    report["cpu"] = cpu
    vm = psutil.virtual_memory()
    report["memory"] = {"total_bytes": vm.total, "available_bytes": vm.available}
    report["disk"] = _disk(model_dir or os.getcwd())
    if not gpus:
        report["gpu_reason"] = no_gpu_reasons(report)
    return report
