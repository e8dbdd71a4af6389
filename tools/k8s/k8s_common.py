"""What every tools/k8s renderer shares: the flags, their checks, the flagfile ConfigMap, the training container
and its volumes, and the YAML output. Each renderer (tfjob.py, indexed_job.py, jobset.py) wraps the container in
its own workload object."""
import argparse
import os
import re
import sys

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

from tfgpu.runtime import fileio  # noqa: E402
from tfgpu.train import expand_flagfiles  # noqa: E402

CONTAINER = "tensorflow"  # the TFJob operator injects TF_CONFIG only into the container with this name
PORT = 2222  # the TFJob operator's default port; the other renderers use it too
FLAGS_DIR = "/etc/tfgpu"
# Exit codes that a rerun would meet again (docs/multi-node.md, "Exit codes"): bad config, non-finite steps, a
# kernel failure. 129 (lost peer) and 143 (preemption save) resume from the checkpoints.
PERMANENT_EXIT_CODES = (1, 2, 3)


class RenderError(ValueError):
    """A bad flag; the message names it."""


class _ArgumentParser(argparse.ArgumentParser):
    """argparse that raises RenderError (one line, exit 1) instead of printing usage and exiting 2."""

    def error(self, message):
        raise RenderError(message)


def parser(prog: str, description: str, restart_policies, default_restart_policy, restart_help: str,
           name_limit: int = 50):
    p = _ArgumentParser(prog=prog, description=description)
    p.add_argument("--flagfile", required=True, help="tfgpu.train flagfile to run (inlined into a ConfigMap).")
    p.add_argument("--image", required=True, help="Container image with tfgpu installed.")
    p.add_argument("--workers", type=int, required=True, help="Worker replicas (worker 0 is the chief).")
    p.add_argument("--gpus", type=int, default=0, help="nvidia.com/gpu per worker; 0 = CPU only.")
    p.add_argument("--pvc", default="", help="ReadWriteMany PersistentVolumeClaim that holds model_dir.")
    p.add_argument("--mount_path", default="/mnt/tfgpu", help="Where the PVC is mounted in every worker.")
    p.add_argument("--model_dir", default="", help="model_dir inside the container: under --mount_path, or a "
                   "gs:// path; default <mount_path>/<name>.")
    p.add_argument("--name", default="", help=f"Job name (DNS label, at most {name_limit} characters); default "
                   "tfgpu-<flagfile name>.")
    p.add_argument("--namespace", default="", help="Kubernetes namespace; default: kubectl's current one.")
    p.add_argument("--restart_policy", default=default_restart_policy, choices=restart_policies, help=restart_help)
    p.add_argument("--backoff_limit", type=int, default=5, help="Restarts before the whole job is marked failed.")
    p.add_argument("--cpu", default="", help="CPU request per worker, e.g. 16 (default: none).")
    p.add_argument("--memory", default="", help="Memory request/limit per worker, e.g. 64Gi (default: none).")
    p.add_argument("--shm_size", default="16Gi", help="Size of /dev/shm (NCCL and tf.data need more than "
                   "Docker's 64M default).")
    p.add_argument("--worker_timeout_s", type=int, default=0,
                   help="As tfgpu.launch's: a worker whose heartbeat (replaced after every loop) is older than this "
                        "is hung, and a livenessProbe has the kubelet kill it (the restart policy then restarts "
                        "it); 0 = no probe.")
    p.add_argument("--startup_timeout_s", type=int, default=600,
                   help="With --worker_timeout_s: how long a worker may take to finish its first loop (a "
                        "startupProbe) before it counts as hung.")
    p.add_argument("--output", default="", help="Write the YAML here instead of stdout.")
    p.set_defaults(name_limit=name_limit)
    return p


def _dns_label(text: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")


def check(args, extra_train_flags, tool: str):
    """(name, model_dir) for ``args``; raises RenderError naming a bad flag."""
    if args.workers < 1:
        raise RenderError(f"--workers must be at least 1, got {args.workers}")
    if args.gpus < 0:
        raise RenderError(f"--gpus must be >= 0, got {args.gpus}")
    if args.backoff_limit < 0:
        raise RenderError(f"--backoff_limit must be >= 0, got {args.backoff_limit}")
    if args.worker_timeout_s < 0 or (args.worker_timeout_s and args.startup_timeout_s < PROBE_PERIOD_S):
        raise RenderError(f"--worker_timeout_s must be >= 0 and --startup_timeout_s at least {PROBE_PERIOD_S}, got "
                          f"{args.worker_timeout_s} and {args.startup_timeout_s}")
    if not os.path.isfile(args.flagfile):
        raise RenderError(f"--flagfile {args.flagfile!r} does not exist")
    limit = args.name_limit
    default = "tfgpu-" + _dns_label(os.path.splitext(os.path.basename(args.flagfile))[0])
    name = args.name or default[:limit].rstrip("-")
    if not re.fullmatch(rf"[a-z]([-a-z0-9]{{0,{limit - 2}}}[a-z0-9])?", name):
        raise RenderError(f"--name {name!r} must be a DNS label: lowercase letters, digits and '-', at most {limit} "
                          "characters, starting with a letter")
    model_dir = args.model_dir or (f"{args.mount_path.rstrip('/')}/{name}" if args.pvc else "")
    remote = re.match(r"^[a-z][a-z0-9+]*://", model_dir or "")
    if not model_dir:
        raise RenderError("--model_dir must be on storage every worker sees: pass --pvc=CLAIM (model_dir defaults "
                          "to <mount_path>/<name>) or a gs:// --model_dir")
    if not remote:
        if not args.pvc:
            raise RenderError(f"--model_dir {model_dir!r} is a local path but no --pvc is mounted: each pod "
                              "would write its own copy and lose it on restart")
        if not (model_dir + "/").startswith(args.mount_path.rstrip("/") + "/"):
            raise RenderError(f"--model_dir {model_dir!r} is not under --mount_path {args.mount_path!r}, where the "
                              f"PVC {args.pvc!r} is mounted")
    for flag in extra_train_flags:
        if flag.split("=")[0] in ("--model_dir", "--cluster", "--flagfile"):
            raise RenderError(f"{flag.split('=')[0]} is set by {tool}; pass it as a {tool} flag")
    return name, model_dir


def config_map(args, name):
    """The flagfile, nested flagfiles inlined, as a ConfigMap every worker mounts at FLAGS_DIR."""
    flag_lines = expand_flagfiles([f"--flagfile={args.flagfile}"])
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(f"{name}-flags", args.namespace),
        "data": {"train.flags": f"# From {args.flagfile}, nested flagfiles inlined.\n" + "\n".join(flag_lines)
                 + "\n"},
    }


def train_args(model_dir, extra_train_flags):
    return [f"--flagfile={FLAGS_DIR}/train.flags", "--cluster=tf_config", f"--model_dir={model_dir}",
            *extra_train_flags]


# The heartbeat the trainer replaces after every loop (tfgpu/runtime/heartbeat.py), and the probes that read it.
HEARTBEAT_FILE = "/tmp/tfgpu-heartbeat.json"
PROBE_PERIOD_S = 10


def heartbeat_probes(worker_timeout_s: int, startup_timeout_s: int) -> dict:
    """A startupProbe that passes once the worker finished a loop, and a livenessProbe that fails when its
    heartbeat is older than ``worker_timeout_s`` while it trains (after ``done`` the export needs no peer)."""
    trained = f"grep -qE '\"phase\": \"(training|done)\"' {HEARTBEAT_FILE}"
    fresh = (f"grep -q '\"phase\": \"done\"' {HEARTBEAT_FILE} || "
             f"test $(( $(date +%s) - $(stat -c %Y {HEARTBEAT_FILE}) )) -lt {worker_timeout_s}")
    period = min(PROBE_PERIOD_S, worker_timeout_s)
    return {
        "startupProbe": {"exec": {"command": ["sh", "-c", trained]}, "periodSeconds": PROBE_PERIOD_S,
                         "failureThreshold": -(-startup_timeout_s // PROBE_PERIOD_S)},
        "livenessProbe": {"exec": {"command": ["sh", "-c", fresh]}, "periodSeconds": period,
                          "failureThreshold": 1, "timeoutSeconds": 5},
    }


def container(args, model_dir, extra_train_flags, command=("python", "-m", "tfgpu.train"), env=None):
    """The training container: ``command`` with the train flags as its args, GPUs, mounts and the port; with
    --worker_timeout_s, the heartbeat file and the probes that read it."""
    spec = {
        "name": CONTAINER,
        "image": args.image,
        "command": list(command),
        "args": train_args(model_dir, extra_train_flags),
    }
    env = dict(env or {})
    if getattr(args, "worker_timeout_s", 0):
        env["TFGPU_HEARTBEAT_FILE"] = HEARTBEAT_FILE
        spec.update(heartbeat_probes(args.worker_timeout_s, args.startup_timeout_s))
    if env:
        spec["env"] = [{"name": k, "value": v} for k, v in env.items()]
    spec["ports"] = [{"name": "tfjob-port", "containerPort": PORT}]
    spec["volumeMounts"] = [{"name": "flags", "mountPath": FLAGS_DIR, "readOnly": True},
                            {"name": "dshm", "mountPath": "/dev/shm"}]
    resources = {}
    if args.gpus:
        resources["limits"] = {"nvidia.com/gpu": args.gpus}
    if args.cpu:
        resources.setdefault("requests", {})["cpu"] = args.cpu
    if args.memory:
        resources.setdefault("requests", {})["memory"] = args.memory
        resources.setdefault("limits", {})["memory"] = args.memory
    if resources:
        spec["resources"] = resources
    if args.pvc:
        spec["volumeMounts"].append({"name": "model-dir", "mountPath": args.mount_path})
    return spec


def volumes(args, name):
    spec = [{"name": "flags", "configMap": {"name": f"{name}-flags"}},
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": args.shm_size}}]
    if args.pvc:
        spec.append({"name": "model-dir", "persistentVolumeClaim": {"claimName": args.pvc}})
    return spec


def metadata(name, namespace, labels=None):
    meta = {"name": name, "labels": {"app.kubernetes.io/name": "tfgpu", **(labels or {})}}
    if namespace:
        meta["namespace"] = namespace
    return meta


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the flagfile) as literal blocks, so the manifest reads like the file."""


_Dumper.add_representer(str, lambda dumper, text: dumper.represent_scalar(
    "tag:yaml.org,2002:str", text, style="|" if "\n" in text else None))


def to_yaml(manifests) -> str:
    return yaml.dump_all(manifests, Dumper=_Dumper, sort_keys=False)


def main(arg_parser, render, argv=None) -> int:
    """Parse ``argv`` (the train flags after ``--``), render, write YAML; a bad flag is one line and exit 1."""
    argv = sys.argv[1:] if argv is None else list(argv)
    ours, extra = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    try:
        args = arg_parser.parse_args(ours)
        text = to_yaml(render(args, extra))
    except (RenderError, ValueError) as e:  # tfgpu.config.ConfigError is a ValueError: bad nested flagfile
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.output:
        fileio.atomic_write_bytes(args.output, text.encode())
    else:
        sys.stdout.write(text)
    return 0
