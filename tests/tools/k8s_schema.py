"""Offline checks of rendered Kubernetes manifests against the OpenAPI schemas of Kubernetes releases, as bundled
by the ``kubernetes-validate`` package (no cluster, no network).

Strict mode: a field the schema does not know is an error, as ``kubectl apply --validate=strict`` would make it.
CRD kinds (TFJob, JobSet) have no schema there; their pod or Job templates are checked as a core Pod or batch/v1
Job instead."""
import copy

import kubernetes_validate

# 1.31: the first release where a Job's podFailurePolicy is stable; and the newest release the package knows.
VERSIONS = ("1.31", kubernetes_validate.latest_version())


def validate(manifest: dict):
    """Raises kubernetes_validate.ValidationError (naming the field) unless ``manifest`` fits every VERSIONS."""
    for version in VERSIONS:
        kubernetes_validate.validate(manifest, version, strict=True)


def as_job(name: str, job_template: dict) -> dict:
    """A batch/v1 Job built from a JobTemplateSpec (a JobSet's replicated Job), to validate its spec."""
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, **copy.deepcopy(job_template.get("metadata", {}))},
            "spec": copy.deepcopy(job_template["spec"])}


def as_pod(name: str, pod_template: dict) -> dict:
    """A core Pod built from a PodTemplateSpec (a TFJob replica's template), to validate its spec."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, **copy.deepcopy(pod_template.get("metadata", {}))},
            "spec": copy.deepcopy(pod_template["spec"])}
