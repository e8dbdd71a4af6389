"""Advice from a host report (``tfgpu.runtime.host.collect``): a pure function of the JSON, so it can be checked
on recorded hosts; and the report as text."""
from tfgpu.runtime.host import GIB, gpu_capabilities, kernel_support, no_gpu_reasons

LOW_DISK_BYTES = 5 * GIB  # below this, say so: checkpoints, exports and summaries all land in model_dir
FEW_CORES_PER_GPU = 4  # below this, decoding/augmentation competes for cores; a prompt to check the report


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


def precision_for(cpu_flags: dict, gpus: list) -> tuple:
    """(precision, why) for a run on ``gpus`` (the doctor's GPU records; the oldest decides) or, with none, on a
    CPU with ``cpu_flags`` (``host.parse_cpuinfo``'s flags): on a CPU, bfloat16 only with AMX, the one CPU feature
    under which it was measured faster than float32. The doctor's advice and ``--precision=auto``."""
    if gpus:
        return _precision_for_gpus(gpus)
    if cpu_flags.get("amx_bf16"):
        return "mixed_bfloat16", "this CPU has amx_bf16, so oneDNN computes bfloat16 matrix work in its AMX tiles"
    if cpu_flags.get("avx512_bf16"):
        # Measured on a 2-vCPU Xeon with AVX512_BF16 and no AMX (docs/benchmarks.md): bfloat16 ran ResNet-20 at
        # 0.73-0.77x of float32's examples/s in both tfgpu and Keras fit, ResNet-50 at 0.81x; with AMX, ResNet-20
        # at 1.18x.
        return "float32", ("this CPU has avx512_bf16 but no AMX: bfloat16 ran at 0.73-0.81x of float32's speed on "
                           "such a CPU (ResNet-20 and ResNet-50, docs/benchmarks.md)")
    return "float32", "this CPU has no AVX512_BF16/AMX, so bfloat16 would be emulated"


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
        precision, why = precision_for(flags, gpus)
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
        precision, why = precision_for(flags, [])
        then = ("confirm the gain with python -m tfgpu.benchmark --precision=float32,mixed_bfloat16"
                if precision == "mixed_bfloat16" else "mixed precision pays off on GPUs with tensor cores")
        recs.append(f"precision: --precision={precision} ({why}; {then})")
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
        recs.append(f"--cache: holds the train split in host memory, decoded where --augment allows "
                    f"({_bytes(memory['total_bytes'])} here, {_bytes(memory.get('available_bytes'))} available); "
                    "use it when the decoded images (examples x height x width x channels bytes) fit with room to "
                    "spare (up to 256 MiB a pipeline holds them without it)")
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
           "unbound; a worker that drives some of them (one task per GPU or per node, docs/slurm.md) belongs "
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
