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

TFJob belongs to the Kubeflow Training Operator v1, which Kubeflow Trainer v2 replaces; indexed_job.py (core
Kubernetes, no operator) and jobset.py render the same run for clusters without it.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import k8s_common  # noqa: E402
from k8s_common import RenderError  # noqa: E402,F401  (tests and callers catch it from here)

RESTART_POLICIES = ("OnFailure", "ExitCode", "Always", "Never")


def _parser():
    return k8s_common.parser("tools/k8s/tfjob.py", __doc__.split("\n\n")[0], RESTART_POLICIES, "OnFailure",
                             "Pod restart policy.")


def render(args, extra_train_flags=()) -> list:
    """The ConfigMap and TFJob manifests (dicts) for ``args``; raises RenderError naming a bad flag."""
    name, model_dir = k8s_common.check(args, extra_train_flags, "tfjob.py")
    container = k8s_common.container(args, model_dir, extra_train_flags)
    tfjob = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": k8s_common.metadata(name, args.namespace),
        "spec": {
            "runPolicy": {"backoffLimit": args.backoff_limit, "cleanPodPolicy": "Running"},
            "tfReplicaSpecs": {
                "Worker": {
                    "replicas": args.workers,
                    "restartPolicy": args.restart_policy,
                    "template": {"spec": {"containers": [container], "volumes": k8s_common.volumes(args, name)}},
                },
            },
        },
    }
    return [k8s_common.config_map(args, name), tfjob]


def main(argv=None) -> int:
    return k8s_common.main(_parser(), render, argv)


if __name__ == "__main__":
    sys.exit(main())
