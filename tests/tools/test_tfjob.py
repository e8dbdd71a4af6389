"""tools/k8s/tfjob.py: the TFJob manifest is valid YAML with the fields the training operator needs, and the
TF_CONFIG the operator injects from it is what tfgpu.runtime.cluster reads.

The tool's ``main`` runs in this process; one test runs it as the script users call."""
import contextlib
import importlib.util
import io
import json
import os
import subprocess
import sys

import pytest
import yaml

from tests.conftest import REPO
from tests.tools import k8s_schema
from tfgpu.runtime import cluster

TOOL = os.path.join(REPO, "tools", "k8s", "tfjob.py")
QUICKSTART = os.path.join(REPO, "configs", "quickstart.flags")

_spec = importlib.util.spec_from_file_location("tfjob", TOOL)
tfjob_tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tfjob_tool)


def _render(*args):
    """(exit code, stdout, stderr) of ``tools/k8s/tfjob.py ARGS``, run in this process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = tfjob_tool.main(list(args))
    return code, out.getvalue(), err.getvalue()


def _manifests(*args):
    code, out, err = _render(*args)
    assert code == 0, err
    config_map, tfjob = yaml.safe_load_all(out)
    return config_map, tfjob


def operator_tf_config(tfjob, replica_type, index, namespace="default"):
    """TF_CONFIG as kubeflow/training-operator writes it for one replica (genTFConfigJSONStr): every replica
    as <job>-<type>-<i>.<namespace>.svc:<tfjob-port>, types lowercased, plus "environment": "cloud"."""
    name = tfjob["metadata"]["name"]
    namespace = tfjob["metadata"].get("namespace", namespace)
    spec = {}
    for rtype, replica in tfjob["spec"]["tfReplicaSpecs"].items():
        container = next(c for c in replica["template"]["spec"]["containers"] if c["name"] == "tensorflow")
        port = next(p["containerPort"] for p in container["ports"] if p["name"] == "tfjob-port")
        spec[rtype.lower()] = [f"{name}-{rtype.lower()}-{i}.{namespace}.svc:{port}" for i in range(replica["replicas"])]
    return json.dumps({"cluster": spec, "task": {"type": replica_type.lower(), "index": index},
                       "environment": "cloud"})


def test_manifest_has_what_the_operator_and_tfgpu_need():
    config_map, tfjob = _manifests(f"--flagfile={QUICKSTART}", "--image=registry.example/tfgpu:0.1", "--workers=4",
                                   "--gpus=8", "--pvc=tfgpu-shared", "--namespace=ml", "--", "--train_steps=100")
    assert (tfjob["apiVersion"], tfjob["kind"]) == ("kubeflow.org/v1", "TFJob")
    assert tfjob["metadata"] == {"name": "tfgpu-quickstart", "labels": {"app.kubernetes.io/name": "tfgpu"},
                                 "namespace": "ml"}
    (replica_type, worker), = tfjob["spec"]["tfReplicaSpecs"].items()
    assert replica_type == "Worker" and worker["replicas"] == 4 and worker["restartPolicy"] == "OnFailure"
    pod = worker["template"]["spec"]
    (container,) = pod["containers"]
    assert container["name"] == "tensorflow"  # the only container the operator gives TF_CONFIG
    assert container["image"] == "registry.example/tfgpu:0.1"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert container["command"] == ["python", "-m", "tfgpu.train"]
    assert container["args"] == ["--flagfile=/etc/tfgpu/train.flags", "--cluster=tf_config",
                                 "--model_dir=/mnt/tfgpu/tfgpu-quickstart", "--train_steps=100"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts["model-dir"] == "/mnt/tfgpu"  # model_dir is on the shared claim
    assert volumes["model-dir"]["persistentVolumeClaim"] == {"claimName": "tfgpu-shared"}
    assert volumes["flags"]["configMap"]["name"] == config_map["metadata"]["name"] == "tfgpu-quickstart-flags"
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory" and mounts["dshm"] == "/dev/shm"
    assert config_map["metadata"]["namespace"] == "ml"
    assert "--model=resnet20" in config_map["data"]["train.flags"].splitlines()


def test_manifests_fit_the_kubernetes_schemas():
    """No package ships the TFJob CRD's schema: the ConfigMap is validated as it is, each replica's pod template
    as a core Pod (tests/tools/k8s_schema.py)."""
    config_map, tfjob = _manifests(f"--flagfile={QUICKSTART}", "--image=i", "--workers=4", "--gpus=8", "--pvc=c",
                                   "--namespace=ml", "--cpu=16", "--memory=64Gi")
    k8s_schema.validate(config_map)
    for replica_type, replica in tfjob["spec"]["tfReplicaSpecs"].items():
        k8s_schema.validate(k8s_schema.as_pod(f"{tfjob['metadata']['name']}-{replica_type.lower()}-0",
                                              replica["template"]))


def test_operator_tf_config_is_accepted_by_tfgpu_cluster():
    _, tfjob = _manifests(f"--flagfile={QUICKSTART}", "--image=i", "--workers=3", "--pvc=c", "--name=r50-run")
    descs = [cluster.resolve_cluster("auto", {"TF_CONFIG": operator_tf_config(tfjob, "Worker", i)}) for i in range(3)]
    assert [d["task_id"] for d in descs] == [0, 1, 2]
    assert [d["is_chief"] for d in descs] == [True, False, False]  # worker 0 writes model_dir
    assert descs[0]["num_workers"] == 3 and descs[0]["source"] == "tf_config"
    assert descs[2]["cluster_spec"]["worker"][2] == "r50-run-worker-2.default.svc:2222"
    one = cluster.resolve_cluster("tf_config", {"TF_CONFIG": operator_tf_config(
        _manifests(f"--flagfile={QUICKSTART}", "--image=i", "--workers=1", "--pvc=c")[1], "Worker", 0)})
    assert one is None  # a one-worker TFJob trains alone


def test_container_args_parse_as_train_flags(tmp_path):
    from tfgpu import train

    config_map, tfjob = _manifests(f"--flagfile={QUICKSTART}", "--image=i", "--workers=2", "--pvc=c",
                                   "--", "--train_steps=7")
    flags_path = tmp_path / "train.flags"
    flags_path.write_text(config_map["data"]["train.flags"])
    container = tfjob["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    args = [a.replace("/etc/tfgpu/train.flags", str(flags_path)) for a in container["args"]]
    config = train.parse(args)
    assert (config.model, config.cluster, config.train_steps) == ("resnet20", "tf_config", 7)
    assert config.model_dir == "/mnt/tfgpu/tfgpu-quickstart"


def test_cpu_only_and_remote_model_dir_from_the_script(tmp_path):
    """Run as users run it (``python tools/k8s/tfjob.py``), writing --output."""
    out = tmp_path / "job.yaml"
    proc = subprocess.run([sys.executable, TOOL, f"--flagfile={QUICKSTART}", "--image=i", "--workers=2",
                           "--model_dir=gs://bucket/run", "--restart_policy=ExitCode", f"--output={out}"],
                          cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout == "", proc.stderr
    _, tfjob = yaml.safe_load_all(out.read_text())
    worker = tfjob["spec"]["tfReplicaSpecs"]["Worker"]
    container = worker["template"]["spec"]["containers"][0]
    assert "resources" not in container and "--model_dir=gs://bucket/run" in container["args"]
    assert worker["restartPolicy"] == "ExitCode"
    assert "model-dir" not in {v["name"] for v in worker["template"]["spec"]["volumes"]}


@pytest.mark.parametrize("args, message", [
    (["--workers=0", "--pvc=c"], "--workers must be at least 1"),
    (["--workers=2"], "--model_dir must be on storage every worker sees"),
    (["--workers=2", "--model_dir=/data/run"], "is a local path but no --pvc is mounted"),
    (["--workers=2", "--pvc=c", "--model_dir=/data/run"], "is not under --mount_path '/mnt/tfgpu'"),
    (["--workers=2", "--pvc=c", "--name=Bad_Name"], "--name 'Bad_Name' must be a DNS label"),
    (["--workers=2", "--pvc=c", "--", "--model_dir=/x"], "--model_dir is set by tfjob.py"),
])
def test_bad_flags_are_one_line_errors(args, message):
    code, out, err = _render(f"--flagfile={QUICKSTART}", "--image=i", *args)
    assert code == 1 and out == "" and err.startswith("error: ") and message in err, err
    assert err.count("\n") == 1


def test_missing_flagfile():
    code, _, err = _render("--flagfile=/no/such.flags", "--image=i", "--workers=2", "--pvc=c")
    assert code == 1 and "--flagfile '/no/such.flags' does not exist" in err
