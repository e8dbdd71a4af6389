"""Renders an Indexed Job and a headless Service that run ``python -m tfgpu.train`` on N workers with G GPUs each.

    python tools/k8s/indexed_job.py --flagfile=configs/imagenet_resnet50.flags --image=REGISTRY/tfgpu:0.1 \\
        --workers=4 --gpus=8 --pvc=tfgpu-shared [--model_dir=/mnt/tfgpu/runs/r50] > job.yaml
    kubectl apply -f job.yaml

Core Kubernetes only (batch/v1 Job, ``completionMode: Indexed``; no operator, no CRD). Writes three YAML documents:
the flagfile ConfigMap, a headless Service named like the Job, and the Job. Pod i gets the stable hostname
``<job>-<i>.<service>`` and Kubernetes sets JOB_COMPLETION_INDEX=i in it; the container's entrypoint runs
``python -m tfgpu.runtime.cluster``, which builds TF_CONFIG from that index and the TFGPU_K8S_* variables set here
(every worker as ``<job>-<i>.<service>:2222``, this pod as worker i, worker 0 the chief), exports it, and execs
``tfgpu.train --cluster=tf_config``. ``model_dir`` must be on storage every worker sees (a ReadWriteMany PVC, or
gs://): a restarted pod resumes from its checkpoints.

``--restart_policy=ExitCode`` (default) replaces failed pods except on exit codes 1-3 (bad config, non-finite
steps, a kernel failure: the Job fails at once), and does not count evictions and preemptions against the
backoff limit; ``OnFailure`` restarts any failed container in place; ``Never`` fails the Job on the first failure.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import k8s_common  # noqa: E402
from k8s_common import RenderError  # noqa: E402,F401  (tests and callers catch it from here)

RESTART_POLICIES = ("ExitCode", "OnFailure", "Never")
# The pod's entrypoint: compute TF_CONFIG from the completion index, then become tfgpu.train with the container's
# args ("$@"; sh takes the word after the script as $0). A bad environment exits 1 before TensorFlow loads.
ENTRYPOINT = ("/bin/sh", "-c", 'TF_CONFIG="$(python -m tfgpu.runtime.cluster)" && export TF_CONFIG && '
              'exec python -m tfgpu.train "$@"', "tfgpu.train")


def _parser():
    return k8s_common.parser(
        "tools/k8s/indexed_job.py", __doc__.split("\n\n")[0], RESTART_POLICIES, "ExitCode",
        "ExitCode: replace failed pods unless the exit code is 1-3; OnFailure: restart any failed container; "
        "Never: fail the Job on the first failure.", name_limit=50)


def tf_config_env(job: str, service: str, workers: int) -> dict:
    """What ``tfgpu.runtime.cluster.indexed_job_tf_config`` reads, besides the JOB_COMPLETION_INDEX Kubernetes sets."""
    return {"TFGPU_K8S_JOB": job, "TFGPU_K8S_SERVICE": service, "TFGPU_K8S_WORKERS": str(workers),
            "TFGPU_K8S_PORT": str(k8s_common.PORT)}


def pod_failure_policy() -> dict:
    """Fail at once on the exit codes a rerun would meet again; do not count evictions, preemptions and drains."""
    return {"rules": [
        {"action": "FailJob", "onExitCodes": {"containerName": k8s_common.CONTAINER, "operator": "In",
                                              "values": list(k8s_common.PERMANENT_EXIT_CODES)}},
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
    ]}


def indexed_job_spec(args, name, model_dir, extra_train_flags, job, service, backoff_limit, restart_policy):
    """A batch/v1 JobSpec of ``args.workers`` indexed pods, all running at once, reachable as ``<job>-<i>.<service>``.

    ``job`` is the name the Job will have (for a JobSet's child, ``<jobset>-<replicated job>-0``)."""
    container = k8s_common.container(args, model_dir, extra_train_flags, command=ENTRYPOINT,
                                     env=tf_config_env(job, service, args.workers))
    spec = {
        "completionMode": "Indexed",
        "completions": args.workers,
        "parallelism": args.workers,  # MultiWorkerMirroredStrategy needs every worker up at once
        "backoffLimit": backoff_limit,
        "template": {
            "metadata": {"labels": {"app.kubernetes.io/name": "tfgpu", "tfgpu/job": name}},
            "spec": {
                "subdomain": service,  # the pod's DNS name becomes <hostname>.<service>.<namespace>.svc
                "restartPolicy": "OnFailure" if restart_policy == "OnFailure" else "Never",
                "containers": [container],
                "volumes": k8s_common.volumes(args, name),
            },
        },
    }
    if restart_policy == "ExitCode":
        spec["podFailurePolicy"] = pod_failure_policy()  # needs restartPolicy: Never
    return spec


def render(args, extra_train_flags=()) -> list:
    """The ConfigMap, headless Service and Indexed Job manifests (dicts); raises RenderError naming a bad flag."""
    name, model_dir = k8s_common.check(args, extra_train_flags, "indexed_job.py")
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": k8s_common.metadata(name, args.namespace),
        "spec": {
            "clusterIP": "None",  # headless: DNS names the pods themselves, no virtual IP
            "selector": {"tfgpu/job": name},
            # Workers look each other up while starting, before any of them is Ready.
            "publishNotReadyAddresses": True,
            "ports": [{"name": "tfjob-port", "port": k8s_common.PORT}],
        },
    }
    # One lost worker makes every other worker exit 129, so one incident costs up to --workers pod failures.
    backoff_limit = 0 if args.restart_policy == "Never" else args.backoff_limit * args.workers
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": k8s_common.metadata(name, args.namespace),
        "spec": indexed_job_spec(args, name, model_dir, extra_train_flags, job=name, service=name,
                                 backoff_limit=backoff_limit, restart_policy=args.restart_policy),
    }
    return [k8s_common.config_map(args, name), service, job]


def main(argv=None) -> int:
    return k8s_common.main(_parser(), render, argv)


if __name__ == "__main__":
    sys.exit(main())
