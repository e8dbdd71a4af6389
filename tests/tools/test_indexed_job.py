"""tools/k8s/indexed_job.py: the Indexed Job, headless Service and ConfigMap fit the Kubernetes API schemas, and the
TF_CONFIG each pod computes from its completion index names every worker by the hostname Kubernetes gives it.

The tool's ``main`` runs in this process; one test runs the pod's entrypoint as the container would."""
import contextlib
import importlib.util
import io
import json
import os
import re
import subprocess
import sys

import kubernetes_validate
import pytest
import yaml
from hypothesis import given, settings, strategies as st

from tests.conftest import REPO
from tests.tools import k8s_schema
from tfgpu.runtime import cluster

TOOLS = os.path.join(REPO, "tools", "k8s")
QUICKSTART = os.path.join(REPO, "configs", "quickstart.flags")


def _load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(TOOLS, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


indexed_job_tool = _load("indexed_job")


def _render(*args):
    """(exit code, stdout, stderr) of ``tools/k8s/indexed_job.py ARGS``, run in this process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = indexed_job_tool.main(list(args))
    return code, out.getvalue(), err.getvalue()


def _manifests(*args):
    code, out, err = _render(f"--flagfile={QUICKSTART}", "--image=registry.example/tfgpu:0.1", *args)
    assert code == 0, err
    config_map, service, job = yaml.safe_load_all(out)
    return config_map, service, job


def pod_tf_config(job, index):
    """TF_CONFIG as pod ``index`` of ``job`` computes it: the container's env plus the JOB_COMPLETION_INDEX that
    Kubernetes sets, through tfgpu.runtime.cluster (what ``python -m tfgpu.runtime.cluster`` prints)."""
    (container,) = job["spec"]["template"]["spec"]["containers"]
    environ = {e["name"]: e["value"] for e in container["env"]}
    environ["JOB_COMPLETION_INDEX"] = str(index)
    return cluster.indexed_job_tf_config(environ)


def kubernetes_hostname(job, service, index):
    """The DNS name Kubernetes gives pod ``index`` of an Indexed Job: hostname <job>-<index>, and with the pod's
    subdomain set to a headless Service in the same namespace, <hostname>.<subdomain> (resolved via the search
    path <namespace>.svc.cluster.local)."""
    pod = job["spec"]["template"]
    assert service["spec"]["clusterIP"] == "None"  # headless: per-pod DNS records
    assert pod["spec"]["subdomain"] == service["metadata"]["name"]
    assert service["metadata"].get("namespace") == job["metadata"].get("namespace")
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()  # the Service selects the pods
    return f"{job['metadata']['name']}-{index}.{pod['spec']['subdomain']}"


@pytest.mark.parametrize("args", [
    ["--workers=4", "--gpus=8", "--pvc=tfgpu-shared", "--namespace=ml", "--cpu=16", "--memory=64Gi"],
    ["--workers=2", "--model_dir=gs://bucket/run", "--restart_policy=OnFailure"],
    ["--workers=1", "--pvc=c", "--restart_policy=Never", "--", "--train_steps=7"],
    ["--workers=3", "--pvc=c", "--worker_timeout_s=120", "--startup_timeout_s=300"],
])
def test_every_manifest_fits_the_kubernetes_schemas(args):
    for manifest in _manifests(*args):
        k8s_schema.validate(manifest)


def test_the_schema_check_catches_a_malformed_job():
    """The check is live: a field of the wrong type, and one Kubernetes does not know, are refused."""
    _, _, job = _manifests("--workers=2", "--pvc=c")
    job["spec"]["completions"] = "2"
    with pytest.raises(kubernetes_validate.ValidationError, match="not of type"):
        k8s_schema.validate(job)
    job["spec"]["completions"] = 2
    job["spec"]["template"]["spec"]["containers"][0]["gpus"] = 8
    with pytest.raises(kubernetes_validate.ValidationError, match="'gpus' was unexpected"):
        k8s_schema.validate(job)


def test_job_runs_every_worker_at_once_with_the_train_flags():
    config_map, service, job = _manifests("--workers=4", "--gpus=8", "--pvc=tfgpu-shared", "--namespace=ml",
                                          "--", "--train_steps=100")
    assert (job["apiVersion"], job["kind"], service["kind"]) == ("batch/v1", "Job", "Service")
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"] == 4
    assert service["spec"]["publishNotReadyAddresses"] is True  # peers resolve while still starting
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 8
    # The same train arguments as the TFJob's container, whose test parses them as train flags.
    assert container["args"] == ["--flagfile=/etc/tfgpu/train.flags", "--cluster=tf_config",
                                 "--model_dir=/mnt/tfgpu/tfgpu-quickstart", "--train_steps=100"]
    assert container["command"][-1] == "tfgpu.train" and "exec python -m tfgpu.train" in container["command"][2]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["model-dir"]["persistentVolumeClaim"] == {"claimName": "tfgpu-shared"}
    assert volumes["flags"]["configMap"]["name"] == config_map["metadata"]["name"]
    assert "--model=resnet20" in config_map["data"]["train.flags"].splitlines()
    assert {m["metadata"]["namespace"] for m in (config_map, service, job)} == {"ml"}


def test_exit_code_policy_fails_at_once_on_the_codes_the_docs_say_not_to_retry():
    _, _, job = _manifests("--workers=3", "--pvc=c")
    spec = job["spec"]
    assert spec["template"]["spec"]["restartPolicy"] == "Never"  # podFailurePolicy requires it
    assert spec["backoffLimit"] == 5 * 3  # one lost worker fails all three
    fail, ignore = spec["podFailurePolicy"]["rules"]
    with open(os.path.join(REPO, "docs", "multi-node.md")) as f:
        no_retry = [int(m.group(1)) for m in re.finditer(r"^\| (\d+) \|[^|]*\| no\b", f.read(), re.M)]
    assert fail["action"] == "FailJob" and fail["onExitCodes"]["values"] == no_retry == [1, 2, 3]
    assert fail["onExitCodes"]["containerName"] == "tensorflow"
    assert ignore == {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    _, _, never = _manifests("--workers=3", "--pvc=c", "--restart_policy=Never")
    assert never["spec"]["backoffLimit"] == 0 and "podFailurePolicy" not in never["spec"]


@settings(max_examples=25, deadline=None)
@given(workers=st.integers(1, 12), name=st.from_regex(r"[a-z]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True),
       namespace=st.sampled_from(["", "ml"]))
def test_each_pod_computes_tf_config_from_its_completion_index(workers, name, namespace):
    """For pods 0..N-1: the same worker list, the stable hostnames Kubernetes gives the pods, task.index = the
    completion index; tfgpu reads it as worker i of N with worker 0 the chief (one worker trains alone)."""
    _, service, job = _manifests(f"--workers={workers}", "--pvc=c", f"--name={name}",
                                 *([f"--namespace={namespace}"] if namespace else []))
    port = job["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"]
    hosts = [f"{kubernetes_hostname(job, service, i)}:{port}" for i in range(workers)]
    for index in range(workers):
        tf_config = json.loads(pod_tf_config(job, index))
        assert tf_config == {"cluster": {"worker": hosts}, "task": {"type": "worker", "index": index}}
        desc = cluster.resolve_cluster("tf_config", {"TF_CONFIG": json.dumps(tf_config)})
        if workers == 1:
            assert desc is None
        else:
            assert (desc["task_id"], desc["num_workers"], desc["is_chief"]) == (index, workers, index == 0)


@pytest.mark.parametrize("change, message", [
    ({"JOB_COMPLETION_INDEX": None}, "JOB_COMPLETION_INDEX is not set"),
    ({"JOB_COMPLETION_INDEX": "3"}, "JOB_COMPLETION_INDEX=3 is out of range for TFGPU_K8S_WORKERS=3"),
    ({"JOB_COMPLETION_INDEX": "-1"}, "JOB_COMPLETION_INDEX='-1' is not a number"),
    ({"TFGPU_K8S_WORKERS": "two"}, "TFGPU_K8S_WORKERS='two' is not a number"),
    ({"TFGPU_K8S_SERVICE": "Bad_Name"}, "TFGPU_K8S_SERVICE='Bad_Name' is not a DNS label"),
    ({"TFGPU_K8S_PORT": "70000"}, "TFGPU_K8S_PORT=70000 a port"),
])
def test_a_wrong_pod_environment_is_one_clear_error(change, message):
    environ = {"TFGPU_K8S_JOB": "run", "TFGPU_K8S_SERVICE": "run", "TFGPU_K8S_WORKERS": "3",
               "JOB_COMPLETION_INDEX": "1"}
    environ.update(change)
    environ = {k: v for k, v in environ.items() if v is not None}
    with pytest.raises(ValueError, match=re.escape(message)):
        cluster.indexed_job_tf_config(environ)


def _run_entrypoint(container, tmp_path, index):
    """The container's command and args under sh, as the kubelet starts them, with a ``python`` first on PATH
    that runs tfgpu.runtime.cluster for real and, in place of tfgpu.train, prints TF_CONFIG and its arguments."""
    shim = tmp_path / "python"
    shim.write_text(f'#!/bin/sh\nif [ "$2" = tfgpu.train ]; then shift 2; printf "%s\\n" "$TF_CONFIG" "$@"; exit 0; fi\n'
                    f'exec {sys.executable} "$@"\n')
    shim.chmod(0o755)
    env = {e["name"]: e["value"] for e in container["env"]}
    env.update(PATH=f"{tmp_path}:{os.environ['PATH']}", PYTHONPATH=REPO)
    if index is not None:
        env["JOB_COMPLETION_INDEX"] = str(index)
    return subprocess.run(container["command"] + container["args"], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=60)


def test_entrypoint_exports_tf_config_then_runs_train(tmp_path):
    _, service, job = _manifests("--workers=3", "--pvc=c", "--name=r50", "--", "--train_steps=7")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    proc = _run_entrypoint(container, tmp_path, index=2)
    assert proc.returncode == 0, proc.stderr
    tf_config, *train_args = proc.stdout.splitlines()
    assert json.loads(tf_config) == json.loads(pod_tf_config(job, 2))
    assert json.loads(tf_config)["cluster"]["worker"][2] == "r50-2.r50:2222"
    assert train_args == container["args"]
    proc = _run_entrypoint(container, tmp_path, index=None)  # not in an Indexed Job: train never starts
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr == "error: JOB_COMPLETION_INDEX is not set: run this in a pod of the Indexed Job rendered " \
                          "by tools/k8s\n"


@pytest.mark.parametrize("args, message", [
    (["--workers=0", "--pvc=c"], "--workers must be at least 1"),
    (["--workers=2"], "--model_dir must be on storage every worker sees"),
    (["--workers=2", "--pvc=c", "--backoff_limit=-1"], "--backoff_limit must be >= 0"),
    (["--workers=2", "--pvc=c", "--name=Bad_Name"], "--name 'Bad_Name' must be a DNS label"),
    (["--workers=2", "--pvc=c", "--", "--cluster=slurm"], "--cluster is set by indexed_job.py"),
    (["--workers=2", "--pvc=c", "--restart_policy=Always"], "argument --restart_policy: invalid choice: 'Always'"),
    (["--pvc=c"], "the following arguments are required: --workers"),
])
def test_bad_flags_are_one_line_errors(args, message):
    code, out, err = _render(f"--flagfile={QUICKSTART}", "--image=i", *args)
    assert code == 1 and out == "" and err.startswith("error: ") and message in err, err
    assert err.count("\n") == 1


def test_the_heartbeat_probes_fail_a_worker_that_stopped_making_progress_and_only_it(tmp_path):
    """--worker_timeout_s is tfgpu.launch's limit as a livenessProbe: the probes' own shell commands, run against
    heartbeat files the trainer's writer wrote, pass a worker that trains or is done and fail a silent one."""
    from tfgpu.runtime import heartbeat

    _, _, job = _manifests("--workers=3", "--pvc=c", "--worker_timeout_s=30", "--startup_timeout_s=300")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert {"name": "TFGPU_HEARTBEAT_FILE", "value": "/tmp/tfgpu-heartbeat.json"} in container["env"]
    assert container["startupProbe"]["periodSeconds"] * container["startupProbe"]["failureThreshold"] == 300
    assert container["livenessProbe"]["failureThreshold"] == 1
    path = tmp_path / "heartbeat.json"

    def passes(probe):
        command = container[probe]["exec"]["command"][-1].replace("/tmp/tfgpu-heartbeat.json", str(path))
        return subprocess.run(["sh", "-c", command], stderr=subprocess.DEVNULL).returncode == 0

    assert not passes("startupProbe")  # no heartbeat yet
    heartbeat.beat("restored", 0, environ={heartbeat.ENV: str(path)})
    assert not passes("startupProbe") and passes("livenessProbe")  # restored: the first loop still to come
    heartbeat.beat("training", 10, environ={heartbeat.ENV: str(path)})
    assert passes("startupProbe") and passes("livenessProbe")
    os.utime(path, (os.path.getmtime(path) - 31,) * 2)  # 31 s without a loop
    assert not passes("livenessProbe")
    heartbeat.beat("done", 450, environ={heartbeat.ENV: str(path)})
    os.utime(path, (os.path.getmtime(path) - 600,) * 2)  # the chief exporting for 10 minutes
    assert passes("livenessProbe")
    _, _, plain = _manifests("--workers=3", "--pvc=c")
    (container,) = plain["spec"]["template"]["spec"]["containers"]
    assert "livenessProbe" not in container and "TFGPU_HEARTBEAT_FILE" not in str(container)
