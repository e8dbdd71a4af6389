"""tfgpu.runtime.cluster: TF_CONFIG and Slurm environments → one cluster description and a ClusterResolver."""
import json
import os
import re
import socket
import stat
import subprocess
import sys

import hypothesis
import hypothesis.strategies as st
import portpicker
import pytest

from tests.conftest import REPO, read_metrics
from tfgpu.runtime import cluster, slurm
from tfgpu.config import ConfigError

# The environment `srun` gave task 1 of a 2-node, 1-task-per-node step (sbatch --nodes=2 --ntasks-per-node=1),
# trimmed to the SLURM_* variables plus the ones Slurm exports alongside them.
RECORDED_SRUN_TASK1 = {
    "SLURM_CLUSTER_NAME": "hpc",
    "SLURM_CPUS_ON_NODE": "32",
    "SLURM_GTIDS": "1",
    "SLURM_JOBID": "734215",
    "SLURM_JOB_ID": "734215",
    "SLURM_JOB_NAME": "tfgpu-train",
    "SLURM_JOB_NODELIST": "node[01-02]",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_LAUNCH_NODE_IPADDR": "10.1.0.11",
    "SLURM_LOCALID": "0",
    "SLURM_NNODES": "2",
    "SLURM_NODEID": "1",
    "SLURM_NODELIST": "node[01-02]",
    "SLURM_NPROCS": "2",
    "SLURM_NTASKS": "2",
    "SLURM_NTASKS_PER_NODE": "1",
    "SLURM_PRIO_PROCESS": "0",
    "SLURM_PROCID": "1",
    "SLURM_STEPID": "0",
    "SLURM_STEP_ID": "0",
    "SLURM_STEP_LAUNCHER_PORT": "40137",
    "SLURM_STEP_NODELIST": "node[01-02]",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
    "SLURM_SUBMIT_DIR": "/home/ana/tfgpu",
    "SLURM_SUBMIT_HOST": "login1",
    "SLURM_TASKS_PER_NODE": "1(x2)",
    "SLURM_TASK_PID": "201877",
    "SLURM_TOPOLOGY_ADDR": "node02",
    "SLURMD_NODENAME": "node02",
    "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
}


def _tf_config(cluster_spec, task_type="worker", index=0):
    return {"TF_CONFIG": json.dumps({"cluster": cluster_spec, "task": {"type": task_type, "index": index}})}


TWO_WORKERS = {"worker": ["localhost:2222", "localhost:2223"]}


def test_no_cluster_means_single_worker():
    assert cluster.resolve_cluster("auto", {}) is None
    assert cluster.resolve_cluster("tf_config", {}) is None
    assert cluster.resolve_cluster("auto", _tf_config({"worker": ["localhost:2222"]})) is None
    assert cluster.is_chief(None)


def test_workers_only_tf_config_makes_worker_0_the_chief():
    desc = cluster.resolve_cluster("auto", _tf_config(TWO_WORKERS, index=1))
    assert desc == {"cluster_spec": TWO_WORKERS, "task_type": "worker", "task_id": 1, "num_workers": 2,
                    "worker_index": 1, "is_chief": False, "rpc_layer": "grpc", "source": "tf_config"}
    assert cluster.resolve_cluster("tf_config", _tf_config(TWO_WORKERS, index=0))["is_chief"]


def test_chief_plus_workers():
    spec = {"chief": ["c:2222"], "worker": ["w0:2222", "w1:2222"], "evaluator": ["e:2222"]}
    chief = cluster.resolve_cluster("auto", _tf_config(spec, "chief", 0))
    worker0 = cluster.resolve_cluster("auto", _tf_config(spec, "worker", 0))
    assert chief["is_chief"] and not worker0["is_chief"]
    assert chief["num_workers"] == worker0["num_workers"] == 3  # the evaluator trains nothing
    assert (chief["worker_index"], worker0["worker_index"]) == (0, 1)


@pytest.mark.parametrize("raw, message", [
    ("{not json", "TF_CONFIG is not valid JSON"),
    ("[1, 2]", "must be a JSON object"),
    (json.dumps({"cluster": TWO_WORKERS}), "needs 'task'"),
    (json.dumps({"cluster": TWO_WORKERS, "task": {"type": "worker", "index": 2}}),
     "task index 2 is out of range: cluster has 2 worker task(s), valid indices 0..1"),
    (json.dumps({"cluster": TWO_WORKERS, "task": {"type": "worker", "index": -1}}), "out of range"),
    (json.dumps({"cluster": TWO_WORKERS, "task": {"type": "chief", "index": 0}}), "task type 'chief' is not in"),
    (json.dumps({"cluster": {"worker": ["localhost", "localhost:1"]}, "task": {"type": "worker", "index": 0}}),
     "'localhost' is not 'host:port'"),
    (json.dumps({"cluster": {"worker": "a:1,b:2"}, "task": {"type": "worker", "index": 0}}),
     "lists of 'host:port' strings"),
    (json.dumps({"cluster": {"worker": ["a:1"], "ps": ["p:1"]}, "task": {"type": "worker", "index": 0}}),
     "parameter-server clusters are not supported"),
    (json.dumps({"cluster": {"worker": ["a:1", "a:1"]}, "task": {"type": "worker", "index": 0}}),
     "gives address a:1 to both worker 0 and worker 1"),
    (json.dumps({"cluster": {"chief": ["a:1"], "worker": ["a:1"]}, "task": {"type": "worker", "index": 0}}),
     "gives address a:1 to both chief 0 and worker 0"),
    (json.dumps({"cluster": {"master": ["a:1"], "worker": ["b:1"]}, "task": {"type": "worker", "index": 0}}),
     "task type 'master'; tfgpu knows chief, worker, evaluator, ps"),
    (json.dumps({"cluster": {"worker": ["a:1", "b:1"], "evaluator": ["e:1"]}, "task": {"type": "evaluator",
                                                                                      "index": 0}}),
     "this process the evaluator task 0: tfgpu.train runs chief and worker tasks only"),
    (json.dumps({"cluster": TWO_WORKERS, "task": {"type": ["worker"], "index": 0}}), "task type ['worker'] is not"),
    (json.dumps({"cluster": TWO_WORKERS, "task": {"type": "worker", "index": True}}), "out of range"),
    (json.dumps({"cluster": TWO_WORKERS, "task": {"type": "worker", "index": 0}, "rpc_layer": 1}),
     "'rpc_layer' must be a string"),
    # A one-task cluster trains alone, but only if it describes this process.
    (json.dumps({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 1}}), "out of range"),
])
def test_malformed_tf_config_is_a_clear_error(raw, message):
    for source in ("auto", "tf_config"):
        with pytest.raises(ValueError) as e:
            cluster.resolve_cluster(source, {"TF_CONFIG": raw})
        assert message in str(e.value)
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("strategy", ["mirrored", "one_device"])
def test_single_worker_strategy_in_a_cluster_of_several_is_refused(strategy):
    with pytest.raises(ConfigError) as e:
        cluster.resolve_for_run("auto", strategy, _tf_config(TWO_WORKERS, index=1))
    assert str(e.value) == (
        f"--distribution_strategy: {strategy} trains this process on its own, but TF_CONFIG describes 2 workers "
        "(this is worker 1): they would train 2 independent models into one --model_dir; pass "
        "--distribution_strategy=multi_worker_mirrored (or auto), or unset TF_CONFIG to train one worker alone")
    with pytest.raises(ConfigError, match=r"but Slurm \(SLURM_STEP_NUM_TASKS=2\) describes 2 workers .*srun "
                                          r"--ntasks=1"):
        cluster.resolve_for_run("auto", strategy, RECORDED_SRUN_TASK1)
    for fine in ("auto", "multi_worker_mirrored"):
        assert cluster.resolve_for_run("auto", fine, RECORDED_SRUN_TASK1)["num_workers"] == 2
    assert cluster.resolve_for_run("auto", strategy, {}) is None  # alone: any strategy
    # A chief plus an evaluator is one training worker: mirrored on the chief is fine.
    spec = {"chief": ["c:1"], "evaluator": ["e:1"]}
    assert cluster.resolve_for_run("auto", strategy, _tf_config(spec, "chief", 0))["num_workers"] == 1


def test_a_source_that_says_alone_while_the_other_starts_several_copies_is_refused():
    with pytest.raises(ConfigError, match=r"^--cluster: --cluster=tf_config trains this process alone, but Slurm "
                                          r"\(SLURM_STEP_NUM_TASKS=2\) starts it as worker 1 of 2 workers.*pass "
                                          r"--cluster=slurm \(or auto\)"):
        cluster.resolve_for_run("tf_config", "auto", RECORDED_SRUN_TASK1)
    one_task_job = {"SLURM_JOB_ID": "7", "SLURM_NTASKS": "1", **_tf_config(TWO_WORKERS, index=0)}
    with pytest.raises(ConfigError, match="--cluster=slurm trains this process alone, but TF_CONFIG starts it as "
                                          "worker 0 of 2 workers"):
        cluster.resolve_for_run("slurm", "auto", one_task_job)
    # The batch script of a multi-task job is one process, not several: --cluster=tf_config lets it train alone.
    batch_script = {k: v for k, v in RECORDED_SRUN_TASK1.items() if not k.startswith(("SLURM_STEP", "SLURM_STEPID"))}
    assert cluster.resolve_for_run("tf_config", "auto", batch_script) is None


def test_inconsistent_cluster_errors_name_the_flag():
    with pytest.raises(ConfigError, match="^--cluster: TF_CONFIG is not valid JSON"):
        cluster.resolve_for_run("auto", "auto", {"TF_CONFIG": "{"})


def test_unknown_source():
    with pytest.raises(ValueError, match="one of auto, tf_config, slurm"):
        cluster.resolve_cluster("kubernetes", {})


def test_recorded_slurm_step():
    desc = cluster.resolve_cluster("slurm", RECORDED_SRUN_TASK1)
    port = slurm.slurm_port_base(RECORDED_SRUN_TASK1)
    assert desc["cluster_spec"] == {"worker": [f"node01:{port}", f"node02:{port}"]}
    assert (desc["task_type"], desc["task_id"], desc["num_workers"], desc["is_chief"]) == ("worker", 1, 2, False)
    assert desc["source"] == "slurm"
    assert cluster.resolve_cluster("auto", RECORDED_SRUN_TASK1) == desc  # auto finds Slurm without TF_CONFIG
    chief_env = {**RECORDED_SRUN_TASK1, "SLURM_PROCID": "0", "SLURMD_NODENAME": "node01", "SLURM_NODEID": "0"}
    assert cluster.resolve_cluster("auto", chief_env)["is_chief"]


def test_tf_config_wins_over_slurm_in_auto():
    env = {**RECORDED_SRUN_TASK1, **_tf_config(TWO_WORKERS, index=0)}
    assert cluster.resolve_cluster("auto", env)["source"] == "tf_config"
    assert cluster.resolve_cluster("slurm", env)["source"] == "slurm"


def test_slurm_one_task_per_gpu_gives_consecutive_ports_per_node():
    env = {**RECORDED_SRUN_TASK1, "SLURM_NTASKS": "8", "SLURM_STEP_NUM_TASKS": "8", "SLURM_PROCID": "5", "SLURM_LOCALID": "1",
           "SLURM_STEP_TASKS_PER_NODE": "4(x2)", "SLURM_TASKS_PER_NODE": "4(x2)", "TFGPU_SLURM_PORT_BASE": "23000"}
    desc = cluster.resolve_cluster("slurm", env)
    assert desc["cluster_spec"]["worker"] == [f"node0{n}:{23000 + i}" for n in (1, 2) for i in range(4)]
    assert desc["task_id"] == 5 and desc["num_workers"] == 8


def test_slurm_matches_tensorflows_own_resolver(monkeypatch):
    import tensorflow as tf

    for name, value in RECORDED_SRUN_TASK1.items():
        monkeypatch.setenv(name, value)
    port = slurm.slurm_port_base(RECORDED_SRUN_TASK1)
    theirs = tf.distribute.cluster_resolver.SlurmClusterResolver(
        port_base=port, gpus_per_node=8, gpus_per_task=8, auto_set_gpu=False)
    ours = cluster.make_cluster_resolver(cluster.resolve_cluster("slurm"))
    assert ours.cluster_spec().as_dict() == theirs.cluster_spec().as_dict()
    assert (ours.task_type, ours.task_id) == theirs.get_task_info()


def test_slurm_errors():
    with pytest.raises(ValueError, match="SLURM_JOB_ID is not set"):
        cluster.resolve_cluster("slurm", {})
    batch_script = {k: v for k, v in RECORDED_SRUN_TASK1.items() if not k.startswith(("SLURM_STEP", "SLURM_STEPID"))}
    with pytest.raises(ValueError, match="not in an srun step: start training with `srun"):
        cluster.resolve_cluster("auto", batch_script)
    with pytest.raises(ValueError, match="SLURM_PROCID is not set"):
        cluster.resolve_cluster("slurm", {k: v for k, v in RECORDED_SRUN_TASK1.items() if k != "SLURM_PROCID"})
    with pytest.raises(ValueError, match="--distribution=block"):
        cluster.resolve_cluster("slurm", {**RECORDED_SRUN_TASK1, "SLURMD_NODENAME": "node01"})
    with pytest.raises(ValueError, match="add up to 4, not the 2 tasks"):
        cluster.resolve_cluster("slurm", {**RECORDED_SRUN_TASK1, "SLURM_STEP_TASKS_PER_NODE": "2(x2)"})
    with pytest.raises(ValueError, match="malformed"):
        cluster.resolve_cluster("slurm", {**RECORDED_SRUN_TASK1, "SLURM_STEP_NODELIST": "node[01-"})
    disagreeing = [
        ({"SLURM_PROCID": "one"}, "SLURM_PROCID='one' is not a number"),
        ({"SLURM_STEP_NUM_TASKS": "2x"}, "SLURM_STEP_NUM_TASKS='2x' is not a number"),
        ({"SLURM_LOCALID": "1"}, "SLURM_LOCALID=1 but block distribution makes task 1 the task 0 of node02"),
        ({"SLURM_STEP_NODELIST": "node[01,01]"}, "names node01 more than once"),
        ({"SLURM_STEP_NUM_NODES": "3"}, "SLURM_STEP_NUM_NODES=3 disagrees with SLURM_STEP_NODELIST=node[01-02]"),
        ({"SLURM_PROCID": "2"}, "SLURM_PROCID=2 is out of range for 2 tasks"),
    ]
    for change, message in disagreeing:
        with pytest.raises(ValueError, match=re.escape(message)):
            cluster.resolve_cluster("slurm", {**RECORDED_SRUN_TASK1, **change})
    # A single-task Slurm job trains alone.
    assert cluster.resolve_cluster("slurm", {"SLURM_JOB_ID": "1", "SLURM_NTASKS": "1"}) is None


_JSON = st.recursive(st.none() | st.booleans() | st.integers(-3, 3) | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                                 max_size=3), max_leaves=8)
_ADDRESS = st.sampled_from(["a:1", "b:2", "c:3", "a:1 ", "a", ""])
_TYPE = st.sampled_from(["chief", "worker", "evaluator", "ps", "master"])
_NEAR_VALID = st.fixed_dictionaries({
    "cluster": st.dictionaries(_TYPE, st.lists(_ADDRESS, max_size=3), max_size=3),
    "task": st.fixed_dictionaries({"type": _TYPE | _JSON, "index": st.integers(-1, 3) | _JSON})})


@hypothesis.settings(max_examples=100, deadline=None)
@hypothesis.given(tf_config=_NEAR_VALID | _JSON)
def test_any_tf_config_is_a_consistent_cluster_or_a_one_line_error(tf_config):
    """Whatever TF_CONFIG holds, tfgpu either trains alone, trains as a task the cluster really has at an address
    of its own, or stops with one line: never a traceback, never a process outside its cluster."""
    try:
        desc = cluster.resolve_cluster("auto", {"TF_CONFIG": json.dumps(tf_config)})
    except ValueError as e:
        assert "\n" not in str(e) and str(e).startswith("TF_CONFIG")
        return
    if desc is None:
        return
    spec = desc["cluster_spec"]
    addresses = [a for tasks in spec.values() for a in tasks]
    assert len(addresses) == len(set(addresses))
    assert desc["task_type"] in ("chief", "worker") and 0 <= desc["task_id"] < len(spec[desc["task_type"]])
    assert desc["num_workers"] == len(spec.get("chief", [])) + len(spec.get("worker", [])) >= 1
    assert 0 <= desc["worker_index"] < desc["num_workers"]


@hypothesis.settings(max_examples=100, deadline=None)
@hypothesis.given(per_node=st.lists(st.integers(0, 3), min_size=1, max_size=4), rank=st.integers(-1, 12),
                  local=st.integers(-1, 4), node=st.integers(0, 4))
def test_any_slurm_step_gives_each_task_its_own_address_or_a_one_line_error(per_node, rank, local, node):
    hosts = [f"n{i}" for i in range(len(per_node))]
    env = {**RECORDED_SRUN_TASK1, "SLURM_STEP_NODELIST": ",".join(hosts), "SLURM_STEP_NUM_NODES": str(len(hosts)),
           "SLURM_STEP_TASKS_PER_NODE": ",".join(map(str, per_node)), "SLURM_STEP_NUM_TASKS": str(sum(per_node)),
           "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(local), "SLURMD_NODENAME": f"n{node}"}
    try:
        desc = cluster.resolve_cluster("slurm", env)
    except ValueError as e:
        assert "\n" not in str(e)
        return
    if desc is None:
        assert sum(per_node) <= 1
        return
    addresses = desc["cluster_spec"]["worker"]
    assert len(addresses) == len(set(addresses)) == sum(per_node)
    mine = addresses[rank]
    assert mine.startswith(f"n{node}:")  # this task's address is on the node it runs on
    assert rank - sum(per_node[:node]) == local  # and is its local_rank-th task there


def test_tf_config_resolver_round_trip(monkeypatch):
    spec = {"chief": ["c:2222"], "worker": ["w0:2222"]}
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": spec, "task": {"type": "worker", "index": 0}}))
    desc = cluster.resolve_cluster("auto")
    resolver = cluster.make_cluster_resolver(desc)
    assert resolver.cluster_spec().as_dict() == spec
    assert (resolver.task_type, resolver.task_id) == ("worker", 0)
    assert "worker 0" in cluster.describe(desc) and "(chief)" not in cluster.describe(desc)


# Stands in for Slurm's srun on a machine without Slurm: starts SLURM_NTASKS copies of the command on this host
# with the variables a real srun step sets, prefixes output like --label, and stops the rest when one fails
# (--kill-on-bad-exit). Everything it runs (the sbatch template, tfgpu.train, tfgpu.runtime.cluster) is real.
FAKE_SRUN = r'''#!/usr/bin/env python3
import os, subprocess, sys, threading
args = sys.argv[1:]
while args and args[0].startswith("-"):
    args.pop(0)
n = int(os.environ["SLURM_NTASKS"])
procs = []
for rank in range(n):
    env = {**os.environ, "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank), "SLURM_STEP_ID": "0",
           "SLURM_STEPID": "0", "SLURM_STEP_NUM_TASKS": str(n), "SLURM_STEP_NODELIST": "localhost",
           "SLURM_STEP_TASKS_PER_NODE": str(n), "SLURMD_NODENAME": "localhost", "SLURM_NODEID": "0"}
    procs.append(subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
def copy(rank, proc):
    for line in proc.stdout:
        sys.stdout.write(f"{rank}: {line}")
threads = [threading.Thread(target=copy, args=(r, p)) for r, p in enumerate(procs)]
for t in threads:
    t.start()
codes = [p.wait(timeout=600) for p in procs]
for t in threads:
    t.join()
sys.exit(max(codes))
'''


def _two_free_consecutive_ports():
    while True:
        port = portpicker.pick_unused_port()
        with socket.socket() as s:
            try:
                s.bind(("", port + 1))
            except OSError:
                continue
        return port


# Stands in for the Python the template runs (TFGPU_PYTHON): instead of training, each task resolves its cluster
# with tfgpu.runtime.cluster exactly as `tfgpu.train --cluster=slurm` does first, prints what it got, and exits FAKE_EXIT.
FAKE_PYTHON = r'''#!{python}
import json, os, sys
sys.path.insert(0, {repo!r})
from tfgpu.runtime import cluster
desc = cluster.resolve_for_run("slurm", "auto")
print("TASK " + json.dumps({{"args": sys.argv[1:], "task_id": desc["task_id"], "chief": desc["is_chief"],
                            "workers": desc["cluster_spec"]["worker"]}}), flush=True)
sys.exit(int(os.environ.get("FAKE_EXIT", "0")))
'''


def _executable(path, text):
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


# Outside a job (no controller to ask) scontrol and sinfo fail at once, as on a host without Slurm; the host's own
# would wait about a minute per scontrol call, and 29 s per sinfo call, for a controller that is not running.
NO_CONTROLLER = "#!/bin/sh\necho 'slurm_load_jobs error: Unable to contact slurm controller' >&2\nexit 1\n"


def _no_controller(bin_dir) -> None:
    for command in ("scontrol", "sinfo"):
        _executable(bin_dir / command, NO_CONTROLLER)


def _sbatch(tmp_path, *args, env):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    _executable(bin_dir / "srun", FAKE_SRUN)
    _no_controller(bin_dir)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "SLURM_JOB_ID": "4242",
           "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "localhost", **env}
    return subprocess.run(["bash", os.path.join(REPO, "tools", "slurm", "train.sbatch"), *args], cwd=REPO, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)


def test_sbatch_template_starts_each_slurm_task_with_its_own_worker_address(tmp_path):
    """The template's command line and exit-code handling, and the cluster each srun task resolves; the training
    itself is replaced by FAKE_PYTHON (the slow test below trains for real)."""
    fake = _executable(tmp_path / "python", FAKE_PYTHON.format(python=sys.executable, repo=REPO))
    flags, model_dir = tmp_path / "tiny.flags", tmp_path / "run"
    flags.write_text("--dataset=digits\n")
    # FAKE_PYTHON is a script that imports tfgpu in a Slurm job of 2 tasks: without TFGPU_NO_JOB_STRATEGY, that
    # import would start TensorFlow and a MultiWorkerMirroredStrategy waiting for its peer in every fake task
    env = {"TFGPU_PYTHON": str(fake), "TFGPU_SLURM_PORT_BASE": "23456", "TFGPU_NO_JOB_STRATEGY": "1"}
    proc = _sbatch(tmp_path, str(flags), str(model_dir), "--eval_split=none", env=env)
    assert proc.returncode == 0 and "tfgpu: finished" in proc.stdout, proc.stdout[-4000:]
    tasks = {int(rank): json.loads(task) for rank, task in re.findall(r"^(\d): TASK (.*)$", proc.stdout, re.M)}
    assert sorted(tasks) == [0, 1], proc.stdout
    for rank, task in tasks.items():
        assert task["args"] == ["-m", "tfgpu.train", f"--flagfile={flags}", f"--model_dir={model_dir}",
                                "--cluster=slurm", "--eval_split=none"]
        assert task["workers"] == ["localhost:23456", "localhost:23457"]
        assert (task["task_id"], task["chief"]) == (rank, rank == 0)
    proc = _sbatch(tmp_path, str(flags), str(model_dir), env={**env, "FAKE_EXIT": "1"})
    assert proc.returncode == 1 and "tfgpu: configuration error (exit 1): not requeueing" in proc.stdout
    proc = _sbatch(tmp_path, str(flags), str(model_dir), env={**env, "FAKE_EXIT": "129", "TFGPU_MAX_REQUEUES": "0"})
    assert proc.returncode == 129 and "tfgpu: exit 129 after 0 requeues: giving up" in proc.stdout, proc.stdout


@pytest.mark.slow  # two TensorFlow workers; the template and its Slurm cluster run by default just above
def test_sbatch_template_trains_two_slurm_tasks(tmp_path, data_cache):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _executable(bin_dir / "srun", FAKE_SRUN)
    _no_controller(bin_dir)
    flags = tmp_path / "tiny.flags"
    flags.write_text("--dataset=digits\n--model=small_cnn\n--global_batch_size=64\n--train_steps=8\n"
                     "--steps_per_loop=4\n")
    model_dir = tmp_path / "run"
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "TFGPU_PYTHON": sys.executable,
           "SLURM_JOB_ID": "4242", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "localhost",
           "TFGPU_SLURM_PORT_BASE": str(_two_free_consecutive_ports()), "TFGPU_DATA_CACHE": data_cache,
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run(["bash", os.path.join(REPO, "tools", "slurm", "train.sbatch"), str(flags), str(model_dir),
                           "--eval_split=none"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "0: final: step=8" in proc.stdout and "1: final: step=8" in proc.stdout, proc.stdout[-4000:]
    assert "tfgpu: finished" in proc.stdout
    assert read_metrics(model_dir)["num_workers"] == 2


def test_sbatch_template_rejects_a_missing_flagfile(tmp_path):
    proc = subprocess.run(["bash", os.path.join(REPO, "tools", "slurm", "train.sbatch"), str(tmp_path / "no.flags"),
                           str(tmp_path / "run")], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=30)
    assert proc.returncode == 1 and "error: flagfile" in proc.stdout


def test_a_taken_port_is_refused_before_tensorflow_starts():
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = busy.getsockname()[1]
        env = {"TF_CONFIG": json.dumps({"cluster": {"worker": [f"localhost:{port}", "localhost:1"]},
                                        "task": {"type": "worker", "index": 0}})}
        with pytest.raises(ConfigError, match=f"cannot serve on localhost:{port}: port {port} is in use") as error:
            cluster.resolve_for_run("auto", "auto", env)
        assert error.value.flag == "cluster"
    free = portpicker.pick_unused_port()
    env["TF_CONFIG"] = json.dumps({"cluster": {"worker": [f"localhost:{port}", f"localhost:{free}"]},
                                   "task": {"type": "worker", "index": 1}})
    assert cluster.resolve_for_run("auto", "auto", env)["worker_index"] == 1  # only this worker's own port
