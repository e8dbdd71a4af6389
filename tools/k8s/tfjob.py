"""Renders a Kubeflow TFJob that runs ``python -m tfgpu.train`` on N workers with G GPUs each.

    python tools/k8s/tfjob.py --flagfile=configs/imagenet_resnet50.flags --image=REGISTRY/tfgpu:0.1 \\
        --workers=4 --gpus=8 --pvc=tfgpu-shared [--model_dir=/mnt/tfgpu/runs/r50] > job.yaml
    kubectl apply -f job.yaml

Writes two YAML documents: a ConfigMap holding the flagfile (nested flagfiles inlined) and
the TFJob. The training operator (kubeflow/training-operator) injects TF_CONFIG into the
container named ``tensorflow`` of every replica; tfgpu reads it (``--cluster=tf_config``), and
worker 0 is the chief that alone writes ``model_dir``. ``model_dir`` must be on storage every
worker sees (a ReadWriteMany PVC, or gs://): a restarted pod resumes from its checkpoints.
``--restart_policy=OnFailure`` restarts failed pods; ``ExitCode`` restarts only exit codes
128-255 (143 after a preemption save, 129 after a lost peer) and gives up on 1 (bad config).
"""
import argparse
import os
import re
import sys

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

from tfgpu.runtime import fileio  # noqa: E402
from tfgpu.train import expand_flagfiles  # noqa: E402

CONTAINER = "tensorflow"  # the operator injects TF_CONFIG only into the container with this name
PORT = 2222  # the operator's default TFJob port, named tfjob-port
FLAGS_DIR = "/etc/tfgpu"
RESTART_POLICIES = ("OnFailure", "ExitCode", "Always", "Never")


class RenderError(ValueError):
    """A bad flag; the message names it."""


def _parser():
    p = argparse.ArgumentParser(prog="tools/k8s/tfjob.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--flagfile", required=True, help="tfgpu.train flagfile to run (inlined into a ConfigMap).")
    p.add_argument("--image", required=True, help="Container image with tfgpu installed.")
    p.add_argument("--workers", type=int, required=True, help="Worker replicas (worker 0 is the chief).")
    p.add_argument("--gpus", type=int, default=0, help="nvidia.com/gpu per worker; 0 = CPU only.")
    p.add_argument("--pvc", default="", help="ReadWriteMany PersistentVolumeClaim that holds model_dir.")
    p.add_argument("--mount_path", default="/mnt/tfgpu", help="Where the PVC is mounted in every worker.")
    p.add_argument("--model_dir", default="", help="model_dir inside the container: under --mount_path, or a "
                   "gs:// path; default <mount_path>/<name>.")
    p.add_argument("--name", default="", help="TFJob name (DNS label); default tfgpu-<flagfile name>.")
    p.add_argument("--namespace", default="", help="Kubernetes namespace; default: kubectl's current one.")
    p.add_argument("--restart_policy", default="OnFailure", choices=RESTART_POLICIES, help="Pod restart policy.")
    p.add_argument("--backoff_limit", type=int, default=5, help="Restarts before the whole job is marked failed.")
    p.add_argument("--cpu", default="", help="CPU request per worker, e.g. 16 (default: none).")
    p.add_argument("--memory", default="", help="Memory request/limit per worker, e.g. 64Gi (default: none).")
    p.add_argument("--shm_size", default="16Gi", help="Size of /dev/shm (NCCL and tf.data need more than "
                   "Docker's 64M default).")
    p.add_argument("--output", default="", help="Write the YAML here instead of stdout.")
    return p


def _dns_label(text: str) -> str:
    label = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return label[:50].rstrip("-")


def render(args, extra_train_flags=()) -> list:
    """The ConfigMap and TFJob manifests (dicts) for ``args``; raises RenderError naming a bad flag."""
    if args.workers < 1:
        raise RenderError(f"--workers must be at least 1, got {args.workers}")
    if args.gpus < 0:
        raise RenderError(f"--gpus must be >= 0, got {args.gpus}")
    if not os.path.isfile(args.flagfile):
        raise RenderError(f"--flagfile {args.flagfile!r} does not exist")
    name = args.name or "tfgpu-" + _dns_label(os.path.splitext(os.path.basename(args.flagfile))[0])
    if not re.fullmatch(r"[a-z]([-a-z0-9]{0,48}[a-z0-9])?", name):
        raise RenderError(f"--name {name!r} must be a DNS label: lowercase letters, digits and '-', at most 50 "
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
            raise RenderError(f"{flag.split('=')[0]} is set by tfjob.py; pass it as a tfjob.py flag")

    flag_lines = expand_flagfiles([f"--flagfile={args.flagfile}"])
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(f"{name}-flags", args.namespace),
        "data": {"train.flags": f"# From {args.flagfile}, nested flagfiles inlined.\n" + "\n".join(flag_lines)
                 + "\n"},
    }
    container = {
        "name": CONTAINER,
        "image": args.image,
        "command": ["python", "-m", "tfgpu.train"],
        "args": [f"--flagfile={FLAGS_DIR}/train.flags", "--cluster=tf_config", f"--model_dir={model_dir}",
                 *extra_train_flags],
        "ports": [{"name": "tfjob-port", "containerPort": PORT}],
        "volumeMounts": [{"name": "flags", "mountPath": FLAGS_DIR, "readOnly": True},
                         {"name": "dshm", "mountPath": "/dev/shm"}],
    }
    resources = {}
    if args.gpus:
        resources["limits"] = {"nvidia.com/gpu": args.gpus}
    if args.cpu:
        resources.setdefault("requests", {})["cpu"] = args.cpu
    if args.memory:
        resources.setdefault("requests", {})["memory"] = args.memory
        resources.setdefault("limits", {})["memory"] = args.memory
    if resources:
        container["resources"] = resources
    volumes = [{"name": "flags", "configMap": {"name": f"{name}-flags"}},
               {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": args.shm_size}}]
    if args.pvc:
        container["volumeMounts"].append({"name": "model-dir", "mountPath": args.mount_path})
        volumes.append({"name": "model-dir", "persistentVolumeClaim": {"claimName": args.pvc}})
    tfjob = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": _metadata(name, args.namespace),
        "spec": {
            "runPolicy": {"backoffLimit": args.backoff_limit, "cleanPodPolicy": "Running"},
            "tfReplicaSpecs": {
                "Worker": {
                    "replicas": args.workers,
                    "restartPolicy": args.restart_policy,
                    "template": {"spec": {"containers": [container], "volumes": volumes}},
                },
            },
        },
    }
    return [config_map, tfjob]


def _metadata(name, namespace):
    meta = {"name": name, "labels": {"app.kubernetes.io/name": "tfgpu"}}
    if namespace:
        meta["namespace"] = namespace
    return meta


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the flagfile) as literal blocks, so the manifest reads like the file."""


_Dumper.add_representer(str, lambda dumper, text: dumper.represent_scalar(
    "tag:yaml.org,2002:str", text, style="|" if "\n" in text else None))


def to_yaml(manifests) -> str:
    return yaml.dump_all(manifests, Dumper=_Dumper, sort_keys=False)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    ours, extra = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    args = _parser().parse_args(ours)
    try:
        text = to_yaml(render(args, extra))
    except (RenderError, ValueError) as e:  # tfgpu.config.ConfigError is a ValueError: bad nested flagfile
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.output:
        fileio.atomic_write_bytes(args.output, text.encode())
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
