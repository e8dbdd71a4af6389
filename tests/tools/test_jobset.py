"""tools/k8s/jobset.py: the JobSet's Job template fits the batch/v1 Job schema, the JobSet uses only fields of the
jobset.x-k8s.io/v1alpha2 API, and each pod's TF_CONFIG names the hostnames the JobSet controller gives the pods.

No package ships the JobSet CRD's schema, so its replicated Job is validated as a batch/v1 Job (k8s_schema.as_job)
and the JobSet's own fields are checked against the API reference's field lists below."""
import contextlib
import io
import json

import pytest
import yaml
from hypothesis import given, settings, strategies as st

from tests.tools import k8s_schema
from tests.tools.test_indexed_job import QUICKSTART, _load, pod_tf_config
from tfgpu.runtime import cluster

jobset_tool = _load("jobset")

# Fields of jobset.x-k8s.io/v1alpha2 (kubernetes-sigs/jobset API reference): JobSetSpec, Network, FailurePolicy,
# FailurePolicyRule, ReplicatedJob.
JOBSET_SPEC = {"replicatedJobs", "network", "successPolicy", "failurePolicy", "startupPolicy", "suspend", "coordinator",
               "managedBy", "ttlSecondsAfterFinished"}
NETWORK = {"enableDNSHostnames", "subdomain", "publishNotReadyAddresses"}
FAILURE_POLICY = {"maxRestarts", "restartStrategy", "rules"}
FAILURE_RULE = {"name", "action", "onJobFailureReasons", "targetReplicatedJobs"}
FAILURE_ACTIONS = {"FailJobSet", "RestartJobSet", "RestartJobSetAndIgnoreMaxRestarts"}
JOB_FAILURE_REASONS = {"BackoffLimitExceeded", "DeadlineExceeded", "PodFailurePolicy", "MaxFailedIndexesExceeded"}
REPLICATED_JOB = {"name", "groupName", "template", "replicas", "dependsOn"}


def _manifests(*args):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = jobset_tool.main([f"--flagfile={QUICKSTART}", "--image=registry.example/tfgpu:0.1", *args])
    assert code == 0, err.getvalue()
    config_map, jobset = yaml.safe_load_all(out.getvalue())
    return config_map, jobset


def _child_jobs(jobset):
    """The Jobs the JobSet controller creates, named <jobset>-<replicated job>-<job index>, as batch/v1 Jobs."""
    return [k8s_schema.as_job(f"{jobset['metadata']['name']}-{rjob['name']}-{i}", rjob["template"])
            for rjob in jobset["spec"]["replicatedJobs"] for i in range(rjob["replicas"])]


def _check_jobset_fields(jobset):
    assert (jobset["apiVersion"], jobset["kind"]) == ("jobset.x-k8s.io/v1alpha2", "JobSet")
    spec = jobset["spec"]
    assert set(spec) <= JOBSET_SPEC and set(spec["network"]) <= NETWORK
    assert set(spec["failurePolicy"]) <= FAILURE_POLICY
    for rule in spec["failurePolicy"].get("rules", []):
        assert set(rule) <= FAILURE_RULE and rule["action"] in FAILURE_ACTIONS
        assert set(rule["onJobFailureReasons"]) <= JOB_FAILURE_REASONS
    for rjob in spec["replicatedJobs"]:
        assert set(rjob) <= REPLICATED_JOB and isinstance(rjob["replicas"], int)


@pytest.mark.parametrize("args", [
    ["--workers=4", "--gpus=8", "--pvc=tfgpu-shared", "--namespace=ml", "--cpu=16", "--memory=64Gi"],
    ["--workers=2", "--model_dir=gs://bucket/run", "--restart_policy=OnFailure"],
    ["--workers=1", "--pvc=c", "--restart_policy=Never", "--", "--train_steps=7"],
])
def test_manifests_fit_the_schemas(args):
    config_map, jobset = _manifests(*args)
    k8s_schema.validate(config_map)
    _check_jobset_fields(jobset)
    (job,) = _child_jobs(jobset)
    k8s_schema.validate(job)


def test_failure_policy_restarts_all_workers_together():
    _, jobset = _manifests("--workers=4", "--pvc=c", "--backoff_limit=3")
    (job,) = _child_jobs(jobset)
    assert job["spec"]["backoffLimit"] == 0  # any pod failure fails the Job, and the JobSet recreates it whole
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    policy = jobset["spec"]["failurePolicy"]
    assert policy == {"maxRestarts": 3, "rules": [{"name": "PermanentExitCode", "action": "FailJobSet",
                                                   "onJobFailureReasons": ["PodFailurePolicy"]}]}
    # The Job fails with reason PodFailurePolicy only through its FailJob rule on exit codes 1-3.
    assert job["spec"]["podFailurePolicy"]["rules"][0]["onExitCodes"]["values"] == [1, 2, 3]
    _, on_failure = _manifests("--workers=4", "--pvc=c", "--restart_policy=OnFailure")
    assert on_failure["spec"]["failurePolicy"] == {"maxRestarts": 5}
    assert "podFailurePolicy" not in _child_jobs(on_failure)[0]["spec"]
    _, never = _manifests("--workers=4", "--pvc=c", "--restart_policy=Never")
    assert never["spec"]["failurePolicy"] == {"maxRestarts": 0}


@settings(max_examples=15, deadline=None)
@given(workers=st.integers(1, 10), name=st.from_regex(r"[a-z]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True))
def test_each_pod_computes_tf_config_from_its_completion_index(workers, name):
    """Pod i of the child Job is <child>-<i>.<subdomain> (the JobSet controller's headless Service, named by
    network.subdomain); every pod lists those, in order, and is worker i."""
    _, jobset = _manifests(f"--workers={workers}", "--pvc=c", f"--name={name}")
    (job,) = _child_jobs(jobset)
    network = jobset["spec"]["network"]
    assert network["enableDNSHostnames"] is True and network["publishNotReadyAddresses"] is True
    subdomain = network.get("subdomain", name)
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == workers
    hosts = [f"{job['metadata']['name']}-{i}.{subdomain}:2222" for i in range(workers)]
    assert all(len(h.split(".")[0]) <= 63 for h in hosts)  # a hostname is one DNS label
    for index in range(workers):
        tf_config = json.loads(pod_tf_config(job, index))
        assert tf_config == {"cluster": {"worker": hosts}, "task": {"type": "worker", "index": index}}
        desc = cluster.resolve_cluster("tf_config", {"TF_CONFIG": json.dumps(tf_config)})
        assert desc is None if workers == 1 else (desc["task_id"], desc["is_chief"]) == (index, index == 0)


def test_longest_name_keeps_hostnames_dns_labels():
    _, jobset = _manifests("--workers=2", "--pvc=c", "--name=" + "a" * 40)
    (job,) = _child_jobs(jobset)
    assert len(f"{job['metadata']['name']}-9999") <= 63
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = jobset_tool.main([f"--flagfile={QUICKSTART}", "--image=i", "--workers=2", "--pvc=c",
                                 "--name=" + "a" * 41])
    assert code == 1 and "at most 40 characters" in err.getvalue() and err.getvalue().count("\n") == 1
