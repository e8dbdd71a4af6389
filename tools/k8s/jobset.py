"""Renders a JobSet (jobset.x-k8s.io/v1alpha2) that runs ``python -m tfgpu.train`` on N workers with G GPUs each.

    python tools/k8s/jobset.py --flagfile=configs/imagenet_resnet50.flags --image=REGISTRY/tfgpu:0.1 \\
        --workers=4 --gpus=8 --pvc=tfgpu-shared [--model_dir=/mnt/tfgpu/runs/r50] > jobset.yaml
    kubectl apply -f jobset.yaml

Needs the JobSet controller (kubernetes-sigs/jobset, v0.6 or later for failure-policy rules) in the cluster.
Writes the flagfile ConfigMap and a JobSet with one replicated Job, ``worker``: the same Indexed Job as
indexed_job.py renders, so the child Job is ``<name>-worker-0``, pod i is ``<name>-worker-0-<i>.<name>`` behind
the headless Service the JobSet controller creates, and its entrypoint builds TF_CONFIG from JOB_COMPLETION_INDEX.
Over a plain Indexed Job, a JobSet restarts all workers together: any pod failure fails the child Job, and the
JobSet recreates it, up to ``--backoff_limit`` times; every worker then resumes from the last checkpoint.

``--restart_policy=ExitCode`` (default) restarts on any failure except exit codes 1-3 (bad config, non-finite
steps, a kernel failure), which fail the JobSet at once; ``OnFailure`` restarts on any failure; ``Never`` does not
restart. This is ``tfgpu.launch --max_restarts=--backoff_limit`` for pods; ``--worker_timeout_s`` adds the
launcher's hang rule as a livenessProbe on the trainer's heartbeat. The group always comes back with --workers
pods (there is no --min_workers: pods that cannot be scheduled wait); render again with fewer --workers to shrink.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import indexed_job  # noqa: E402
import k8s_common  # noqa: E402
from k8s_common import RenderError  # noqa: E402,F401  (tests and callers catch it from here)

RESTART_POLICIES = ("ExitCode", "OnFailure", "Never")
REPLICATED_JOB = "worker"
# Pod hostnames are <name>-worker-0-<index>, and a hostname is at most 63 characters.
NAME_LIMIT = 40


def _parser():
    return k8s_common.parser(
        "tools/k8s/jobset.py", __doc__.split("\n\n")[0], RESTART_POLICIES, "ExitCode",
        "ExitCode: restart all workers unless the exit code is 1-3; OnFailure: restart on any failure; "
        "Never: no restart.", name_limit=NAME_LIMIT)


def render(args, extra_train_flags=()) -> list:
    """The ConfigMap and JobSet manifests (dicts) for ``args``; raises RenderError naming a bad flag."""
    name, model_dir = k8s_common.check(args, extra_train_flags, "jobset.py")
    # The JobSet controller names its Jobs <jobset>-<replicated job>-<job index>; there is one Job here.
    child = f"{name}-{REPLICATED_JOB}-0"
    job_spec = indexed_job.indexed_job_spec(
        args, name, model_dir, extra_train_flags, job=child, service=name, backoff_limit=0,
        restart_policy="ExitCode" if args.restart_policy == "ExitCode" else "Never")
    failure_policy = {"maxRestarts": 0 if args.restart_policy == "Never" else args.backoff_limit}
    if args.restart_policy == "ExitCode":
        # The child Job fails with reason PodFailurePolicy when its podFailurePolicy matched exit codes 1-3.
        failure_policy["rules"] = [{"name": "PermanentExitCode", "action": "FailJobSet",
                                    "onJobFailureReasons": ["PodFailurePolicy"]}]
    jobset = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": k8s_common.metadata(name, args.namespace),
        "spec": {
            # The controller creates the headless Service <subdomain> and publishes pods before they are Ready.
            "network": {"enableDNSHostnames": True, "subdomain": name, "publishNotReadyAddresses": True},
            "failurePolicy": failure_policy,
            "replicatedJobs": [{
                "name": REPLICATED_JOB,
                "replicas": 1,
                "template": {"metadata": {"labels": {"app.kubernetes.io/name": "tfgpu"}}, "spec": job_spec},
            }],
        },
    }
    return [k8s_common.config_map(args, name), jobset]


def main(argv=None) -> int:
    return k8s_common.main(_parser(), render, argv)


if __name__ == "__main__":
    sys.exit(main())
