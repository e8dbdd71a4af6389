"""``python -m tfgpu.doctor [--model_dir=DIR] [--output_json=F]``: what this host offers for training, and advice.

Prints, and writes as JSON, the versions (Python, TensorFlow, Keras), how
TensorFlow was built (CUDA, cuDNN, compute capabilities), every GPU TensorFlow
sees (name, compute capability, memory, tensor-core types, NUMA node) or why
it sees none, NCCL, whether XLA compiles and runs a function on the CPU, the
CPU (model, cores, AVX2/AVX-512/BF16/AMX flags), host memory and the free disk
under ``--model_dir``. It ends with recommendations from ``recommend(report)``,
a pure function of the JSON, so advice can be checked on recorded hosts. It
needs no GPU and finishes in seconds (most of it is importing TensorFlow).
"""
import contextlib
import ctypes
import glob
import json
import os
import platform
import re
import shutil
import sys
import tempfile
import time

from tfgpu import cli
from tfgpu.config import ConfigError

CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
GIB = 1024 ** 3
LOW_DISK_BYTES = 5 * GIB  # below this, say so: checkpoints, exports and summaries all land in model_dir
FEW_CORES_PER_GPU = 4  # below this, decoding/augmentation competes for cores; a prompt to check the report

# NVIDIA GPU generation by compute capability (CUDA C++ Programming Guide, "Compute Capabilities").
_GENERATIONS = ((10, 0, "Blackwell"), (9, 0, "Hopper"), (8, 9, "Ada Lovelace"), (8, 0, "Ampere"),
                (7, 5, "Turing"), (7, 0, "Volta"), (6, 0, "Pascal"), (0, 0, "pre-Pascal"))

# Lines of TensorFlow's own log that explain a missing GPU (driver, libraries, cuInit, visibility).
_GPU_LOG = re.compile(r"cuda|cuinit|gpu|dlopen|driver|libcu|nccl|visible", re.IGNORECASE)
_GLOG_PREFIX = re.compile(r"^[IWEF]\d{4} [\d:.]+\s+\d+ ")
_SOURCE_PREFIX = re.compile(r"^[\w.]+\.cc:\d+\]\s*")
_NOT_ABOUT_GPUS = re.compile(r"oneDNN|rebuild TensorFlow|StreamExecutor|XLA service|Compiled cluster")


# -- pure functions over facts (tested on recorded hosts) -----------------------------------------------------------
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


def _precision_for_gpus(gpus: list) -> tuple:
    """(precision, why) for GPUs that must all run one dtype policy: the oldest GPU decides."""
    oldest = min(gpus, key=lambda g: tuple(int(x) for x in g["compute_capability"].split(".")[:2]))
    caps, name, cc = gpu_capabilities(oldest["compute_capability"]), oldest["name"], oldest["compute_capability"]
    gen = f"{name}, {caps['generation']}, compute capability {cc}"
    if caps["bf16_tensor_cores"]:
        return "mixed_bfloat16", f"{gen}: bfloat16 tensor cores, and bfloat16 needs no loss scaling"
    if caps["fp16_tensor_cores"]:
        return "mixed_float16", f"{gen}: float16 tensor cores but no bfloat16 ones; tfgpu scales the loss dynamically"
    return "float32", f"{gen}: no tensor cores, so mixed precision saves memory but little time"


def _bytes(n) -> str:
    return f"{n / GIB:.1f} GiB" if n is not None else "unknown"


def recommend(report: dict) -> list:
    """Concrete advice for this host (precision, NUMA binding, memory, XLA, NCCL, disk) from a doctor report."""
    recs = []
    gpus = report.get("gpus") or []
    cpu = report.get("cpu") or {}
    flags = cpu.get("flags") or {}
    build = report.get("build") or {}
    if gpus:
        precision, why = _precision_for_gpus(gpus)
        recs.append(f"precision: --precision={precision} ({why})")
        names = {(g["name"], g["compute_capability"]) for g in gpus}
        if len(names) > 1:
            recs.append("GPUs differ (" + ", ".join(f"{n} {cc}" for n, cc in sorted(names)) + "): every replica "
                        "runs the same model at the pace of the slowest; train on one kind (CUDA_VISIBLE_DEVICES)")
        for g in gpus:
            support = kernel_support(g["compute_capability"], build.get("cuda_compute_capabilities") or [])
            if support == "ptx-jit":
                recs.append(f"GPU {g['index']} ({g['name']}, {g['compute_capability']}): TensorFlow has no compiled "
                            "kernels for it, so the driver JIT-compiles PTX at first start (slow once, then cached "
                            "in ~/.nv/ComputeCache; raise CUDA_CACHE_MAXSIZE if it recompiles every run)")
            elif support == "unsupported":
                recs.append(f"GPU {g['index']} ({g['name']}, {g['compute_capability']}): this TensorFlow build has "
                            f"no kernels for it (built for {', '.join(build['cuda_compute_capabilities'])})")
        recs.extend(_numa_advice(gpus))
        recs.append("memory: tfgpu turns on memory growth (--gpu_memory_growth, the default), so nvidia-smi shows "
                    "what the run really uses and other processes can share the GPU; your own scripts get the same "
                    "with TF_FORCE_GPU_ALLOW_GROWTH=true")
        nccl = report.get("nccl") or {}
        if len(gpus) > 1 and not nccl.get("available"):
            recs.append("NCCL: not found, and it carries MirroredStrategy's all-reduce between GPUs; install "
                        "tfgpu[gpu] (nvidia-nccl-cu12) or use --all_reduce_alg=hierarchical_copy")
        elif len(gpus) > 1:
            recs.append(f"NCCL {nccl.get('version') or ''}: set NCCL_DEBUG=INFO once to see which transport it "
                        "picks (NVLink/P2P inside a host, IB or sockets between hosts)".replace("NCCL :", "NCCL:"))
        driver_cuda, tf_cuda = (report.get("driver") or {}).get("cuda_driver_version"), build.get("cuda_version")
        if driver_cuda and tf_cuda and int(driver_cuda.split(".")[0]) < int(tf_cuda.split(".")[0]):
            recs.append(f"driver: it supports CUDA {driver_cuda} but TensorFlow needs CUDA {tf_cuda}: update the "
                        "NVIDIA driver")
        per_gpu = (cpu.get("usable_cores") or 0) / len(gpus)
        if per_gpu and per_gpu < FEW_CORES_PER_GPU:
            recs.append(f"CPU: {cpu.get('usable_cores')} usable cores for {len(gpus)} GPUs; image decoding and "
                        "augmentation share them, so check the run report's input-bound line, and use --cache or "
                        "store images at training size if it says input-bound")
    else:
        reasons = report.get("gpu_reason") or no_gpu_reasons(report)
        recs.append("no GPU: " + "; ".join(reasons))
        if flags.get("avx512_bf16") or flags.get("amx_bf16"):
            which = " and ".join(f for f in ("avx512_bf16", "amx_bf16") if flags.get(f))
            recs.append(f"precision: --precision=mixed_bfloat16 (this CPU has {which}, so oneDNN computes "
                        "bfloat16 natively; confirm the gain with python -m tfgpu.benchmark "
                        "--precision=float32,mixed_bfloat16)")
        else:
            recs.append("precision: --precision=float32 (this CPU has no AVX512_BF16/AMX, so bfloat16 would be "
                        "emulated; mixed precision pays off on GPUs with tensor cores)")
        recs.append("multi-replica testing: --cpu_logical_devices=2 --distribution_strategy=mirrored runs the "
                    "multi-GPU code path on this CPU")
    xla = report.get("xla") or {}
    if xla.get("cpu_jit_compile"):
        recs.append("XLA: compiles here; try --jit_compile and keep it if python -m tfgpu.benchmark "
                    "--jit_compile=false,true shows a gain for your model")
    else:
        recs.append(f"XLA: failed to compile a tiny function ({xla.get('error') or 'unknown error'}); leave "
                    "--jit_compile off")
    disk = report.get("disk") or {}
    if disk.get("free_bytes") is not None and disk["free_bytes"] < LOW_DISK_BYTES:
        recs.append(f"disk: only {_bytes(disk['free_bytes'])} free at {disk.get('path')}; checkpoints "
                    "(--keep_checkpoints), summaries and the export all go to --model_dir")
    memory = report.get("memory") or {}
    if memory.get("total_bytes"):
        recs.append(f"--cache: holds the encoded train records in host memory ({_bytes(memory['total_bytes'])} "
                    f"here, {_bytes(memory.get('available_bytes'))} available); use it when the converted "
                    "dataset (du -sh DATA_DIR) fits with room to spare")
    usable, logical = cpu.get("usable_cores"), cpu.get("logical_cores")
    if usable and logical and usable < logical:
        recs.append(f"CPU: this process may use {usable} of {logical} cores (affinity or cgroup limit); "
                    "tf.data sizes its thread pool to the usable ones")
    return recs


def _numa_advice(gpus: list) -> list:
    known = [g for g in gpus if g.get("numa_node") is not None and g["numa_node"] >= 0]
    if not known:
        return ["NUMA: the GPUs' NUMA node is not reported (/sys/bus/pci/devices/<bus id>/numa_node is -1 or "
                "missing), so there is nothing to bind"]
    nodes = sorted({g["numa_node"] for g in known})
    if len(nodes) == 1:
        node = nodes[0]
        return [f"NUMA: every GPU is on node {node}; run numactl --cpunodebind={node} --membind={node} "
                "python -m tfgpu.train ... so input threads and pinned host buffers stay next to the GPUs"]
    out = [f"NUMA: the GPUs span nodes {', '.join(map(str, nodes))}. One process driving all of them should stay "
           "unbound; a worker that drives some of them (one task per GPU or per node, docs/multi-node.md) belongs "
           "on their node:"]
    for g in known:
        cpus = f", CPUs {g['numa_cpus']}" if g.get("numa_cpus") else ""
        out.append(f"  GPU {g['index']} ({g.get('pci_bus_id') or '?'}): node {g['numa_node']}{cpus} -> numactl "
                   f"--cpunodebind={g['numa_node']} --membind={g['numa_node']}")
    per_node = [f"CUDA_VISIBLE_DEVICES={','.join(str(g['index']) for g in known if g['numa_node'] == n)} "
                f"numactl --cpunodebind={n} --membind={n} python -m tfgpu.train ..." for n in nodes]
    out.append("  one worker per node: " + " ; ".join(per_node))
    return out


def format_report(report: dict) -> str:
    """The report as a few readable lines followed by the recommendations."""
    b, cpu, flags = report["build"], report["cpu"], report["cpu"]["flags"]
    lines = [f"tfgpu doctor ({report['time']})",
             f"  python {report['python']}, tensorflow {report['tensorflow']}, keras {report['keras']}, "
             f"{report['platform']}",
             f"  build: CUDA {'yes' if b['is_cuda_build'] else 'no'}"
             + (f" (CUDA {b['cuda_version']}, cuDNN {b['cudnn_version']}, kernels for "
                f"{', '.join(b['cuda_compute_capabilities'])})" if b["is_cuda_build"] else "")]
    for g in report["gpus"]:
        kinds = "+".join(k for k, v in (("fp16", g["fp16_tensor_cores"]), ("bf16", g["bf16_tensor_cores"])) if v)
        lines.append(f"  GPU {g['index']}: {g['name']}, compute capability {g['compute_capability']} "
                     f"({g['generation']}), {_bytes(g['memory_bytes'])} usable by TF, tensor cores: "
                     f"{kinds or 'none'}, bus {g.get('pci_bus_id') or '?'}, NUMA node "
                     f"{g['numa_node'] if g.get('numa_node') is not None else 'unknown'}")
    if not report["gpus"]:
        first = (report.get("gpu_reason") or no_gpu_reasons(report))[0].split(":")[0]
        lines.append(f"  GPU: none ({first}; details in the first recommendation)")
    nccl, xla = report["nccl"], report["xla"]
    lines.append(f"  NCCL: {'available ' + (nccl['version'] or '') if nccl['available'] else 'not available'}"
                 f" ({nccl['detail']})")
    lines.append(f"  XLA: {'compiles and runs on CPU' if xla['cpu_jit_compile'] else 'FAILED: ' + str(xla['error'])}"
                 f" ({xla['seconds']:.2f} s)")
    lines.append(f"  CPU: {cpu['model'] or 'unknown'}, {cpu['usable_cores']} usable of {cpu['logical_cores']} "
                 f"logical cores, NUMA nodes {len(cpu['numa_nodes']) or 1}; "
                 + " ".join(f"{f.upper()}={'yes' if v else 'no'}" for f, v in flags.items()))
    mem, disk = report["memory"], report["disk"]
    lines.append(f"  memory: {_bytes(mem['total_bytes'])} total, {_bytes(mem['available_bytes'])} available")
    lines.append(f"  disk: {_bytes(disk['free_bytes'])} free of {_bytes(disk['total_bytes'])} at {disk['path']}")
    lines.append("Recommendations:")
    lines += [f"  - {r}" if not r.startswith("  ") else f"  {r}" for r in report["recommendations"]]
    return "\n".join(lines)


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
    cpu = parse_cpuinfo(_read("/proc/cpuinfo") or "")
    cpu.update({"model": cpu["model"] or platform.processor(), "logical_cores": os.cpu_count(),
                "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
                "numa_nodes": _numa_nodes()})
    report["cpu"] = cpu
    vm = psutil.virtual_memory()
    report["memory"] = {"total_bytes": vm.total, "available_bytes": vm.available}
    report["disk"] = _disk(model_dir or os.getcwd())
    if not gpus:
        report["gpu_reason"] = no_gpu_reasons(report)
    return report


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = cli.ArgumentParser(prog="python -m tfgpu.doctor", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model_dir", default="", help="Where runs will write; its free disk is reported "
                        "(default: the current directory).")
    parser.add_argument("--output_json", default="", help="Also write the report as JSON here.")
    if cli.wants_help(argv):
        print(parser.format_help())
        return 0
    try:
        opts = parser.parse_args(argv)
        if opts.model_dir and os.path.exists(opts.model_dir) and not os.path.isdir(opts.model_dir):
            raise ConfigError("model_dir", f"{opts.model_dir!r} is a file, not a directory")
        if opts.output_json:
            directory = os.path.dirname(os.path.abspath(opts.output_json))
            if not os.path.isdir(directory) or not os.access(directory, os.W_OK):
                raise ConfigError("output_json", f"directory {directory!r} does not exist or is not writable")
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    # TensorFlow's reasons for a missing GPU are INFO lines; they are captured, not shown.
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "0"
    report = collect(opts.model_dir)
    report["recommendations"] = recommend(report)
    print(format_report(report), flush=True)
    if opts.output_json:
        from tfgpu.runtime.fileio import atomic_write_bytes

        atomic_write_bytes(opts.output_json, (json.dumps(report, indent=2) + "\n").encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
