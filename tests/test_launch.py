"""tfgpu.launch: local multi-worker jobs start, fail fast, stop on signals, leave no process behind, and with
--max_restarts heal: a killed or hung worker's group is stopped and started again on the slots left.

Most tests launch a tiny worker module written to tmp_path (no TensorFlow, so they take about a second); its
``heal`` mode stands in for the trainer's checkpoints and heartbeat (tools/heal_trials.py runs the real one).
Two slow tests run TensorFlow workers: a bare MultiWorkerMirroredStrategy all-reduce and tfgpu.train end to end;
the default suite launches tfgpu.train on two workers in
tests/test_multi_worker.py::test_two_workers_through_the_launcher_match_mirrored_two_replicas.
"""
import json
import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.conftest import REPO, read_metrics
from tfgpu import launch
from tfgpu.runtime import launcher

# A worker that follows its TF_CONFIG and does what TINY_MODE says: "ok" prints and exits 0, "fail:I:CODE" makes
# worker I exit CODE after some output while the others wait, "stubborn" ignores SIGTERM, "save" exits 143 on
# SIGTERM like a tfgpu trainer that saved, "child" also starts a grandchild that sleeps.
TINY_WORKER = r'''
import json, os, re, signal, subprocess, sys, time


def heal(mode, index, workers):
    """A stand-in trainer: resumes from the newest 'checkpoint' (a state file naming ckpt-STEP, written by worker 0
    every 5 steps), beats after every step, trains to 30. In the first group worker VICTIM kills (kill) or stops
    (stop) itself at step AT; its peers then exit 129 (kill: a lost peer) or block (stop: a collective that waits)."""
    from tfgpu.runtime import heartbeat
    from tfgpu.runtime import run_dir
    _, action, victim, at = mode.split(":")
    model_dir = os.environ["TINY_MODEL_DIR"]
    state = run_dir.checkpoint_state(model_dir)
    text = open(state).read() if os.path.exists(state) else ""
    found = re.search(re.escape(run_dir.CHECKPOINT_PREFIX) + r"(\d+)", text)
    step = int(found.group(1)) if found else 0
    print(f"resumed at {step} on {len(workers)} workers", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    heartbeat.beat("restored", step, model_dir)
    lost = os.path.join(model_dir, "lost-" + "-".join(w.split(":")[1] for w in workers))  # this group's
    while step < 30:
        time.sleep(0.1)
        if os.path.exists(lost):
            if action == "kill":
                sys.exit(129)
            time.sleep(300)
        step += 1
        if index == 0 and step % 5 == 0:
            os.makedirs(os.path.dirname(state), exist_ok=True)
            with open(state + ".tmp", "w") as f:
                f.write(f'model_checkpoint_path: "{os.path.basename(run_dir.checkpoint(model_dir, step))}"\n')
            os.replace(state + ".tmp", state)
        heartbeat.beat("training", step, model_dir)
        done = os.path.join(model_dir, "victim-done")
        if index == int(victim) and step == int(at) and not os.path.exists(done):
            open(done, "w").close()
            open(lost, "w").close()
            os.kill(os.getpid(), signal.SIGKILL if action == "kill" else signal.SIGSTOP)
    heartbeat.beat("done", step, model_dir)
    print(f"finished at {step}", flush=True)
    sys.exit(0)


task = json.loads(os.environ["TF_CONFIG"])
index = task["task"]["index"]
mode = os.environ.get("TINY_MODE", "ok")
print(f"pid={os.getpid()} index={index} of {len(task['cluster']['worker'])} "
      f"cluster={','.join(task['cluster']['worker'])} cores={sorted(os.sched_getaffinity(0))} args={sys.argv[1:]} "
      f"gpus={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}")
if mode == "ok":
    sys.exit(0)
if mode == "save":
    signal.signal(signal.SIGTERM, lambda *_: (print("saved a checkpoint"), sys.exit(143)))
if mode == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if mode == "child":
    child = subprocess.Popen(["sleep", "300"])
    print(f"grandchild={child.pid}")
if mode.startswith("heal:"):
    heal(mode, index, task["cluster"]["worker"])
if mode.startswith("fail:"):
    _, bad, code = mode.split(":")
    if index == int(bad):
        for i in range(30):
            print(f"step {i}")
        print("Traceback: something broke", file=sys.stderr)
        time.sleep(0.3)
        sys.exit(int(code))
print("ready", flush=True)
time.sleep(300)
'''

MWMS_WORKER = '''
import os
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import tensorflow as tf
strategy = tf.distribute.MultiWorkerMirroredStrategy()
index = strategy.cluster_resolver.task_id
value = strategy.run(lambda: tf.constant(float(index + 1)))
total = strategy.reduce("SUM", value, axis=None)
print(f"replicas={strategy.num_replicas_in_sync} sum={float(total)}")
'''


@pytest.fixture
def worker_module(tmp_path):
    (tmp_path / "tiny_worker.py").write_text(TINY_WORKER)
    (tmp_path / "mwms_worker.py").write_text(MWMS_WORKER)
    return tmp_path


def _start(worker_dir, *args, mode="ok", module="tiny_worker", env=None):
    # TFGPU_NO_JOB_STRATEGY: the heal stand-in imports tfgpu.runtime.heartbeat, and ``import tfgpu`` in a script
    # with a TF_CONFIG of several workers would start TensorFlow and a MultiWorkerMirroredStrategy that waits for
    # its peers (tens of seconds on 2 cores, past the tests' timeouts); the stand-in is a worker without TensorFlow
    env = {**os.environ, "PYTHONPATH": f"{worker_dir}{os.pathsep}{REPO}", "TINY_MODE": mode,
           "TF_CPP_MIN_LOG_LEVEL": "2", "TFGPU_NO_JOB_STRATEGY": "1", **(env or {})}
    return subprocess.Popen([sys.executable, "-m", "tfgpu.launch", f"--module={module}", *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _run(worker_dir, *args, timeout=60, **kwargs):
    proc = _start(worker_dir, *args, **kwargs)
    try:
        output = proc.communicate(timeout=timeout)[0]
    finally:
        proc.kill()
    return proc.returncode, output


def _pids(output, key="pid"):
    return [int(p) for p in re.findall(rf"\b{key}=(\d+)", output)]


def _gone(pid):
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait_for_lines(proc, pattern, count, timeout=30):
    """Reads the launcher's output until ``count`` lines match ``pattern``; returns what it read."""
    seen, lines = 0, []
    deadline = time.time() + timeout
    while seen < count:
        assert time.time() < deadline, "".join(lines)
        line = proc.stdout.readline()
        assert line, "launcher ended early:\n" + "".join(lines)
        lines.append(line)
        seen += bool(re.search(pattern, line))
    return "".join(lines)


def test_success_gives_each_worker_its_tf_config_and_prefixed_output(worker_module):
    code, output = _run(worker_module, "--num_workers=3", "--", "--model_dir=/x", "--train_steps=5")
    assert code == 0, output
    clusters = set(re.findall(r"cluster=(\S+)", output))
    assert len(clusters) == 1  # every worker sees the same cluster
    addresses = clusters.pop().split(",")
    assert len(addresses) == 3 and len({a.split(":")[1] for a in addresses}) == 3
    for i in range(3):
        assert re.search(rf"^\[worker {i}\] pid=\d+ index={i} of 3 .* args=\['--model_dir=/x', '--train_steps=5'\] ",
                         output, re.M), output
    assert "all 3 workers finished" in output


def test_failing_worker_stops_the_others_and_is_named(worker_module):
    started = time.time()
    code, output = _run(worker_module, "--num_workers=3", "--stop_grace_s=5", mode="fail:1:3")
    assert code == 3, output
    assert time.time() - started < 20
    assert "error: worker 1 failed with exit code 3. Its last 20 lines:" in output
    tail = output.split("Its last 20 lines:")[1]
    assert "step 29" in tail and "Traceback: something broke" in tail and "step 10" not in tail
    assert re.search(r"exit codes: worker 0=143, worker 1=3, worker 2=143", output), output  # SIGTERM → 128+15
    assert all(_gone(pid) for pid in _pids(output))


def test_worker_that_ignores_sigterm_is_killed_after_the_grace_period(worker_module):
    proc = _start(worker_module, "--num_workers=2", "--stop_grace_s=1", mode="stubborn")
    try:
        head = _wait_for_lines(proc, r"\] ready", 2)
        proc.send_signal(signal.SIGINT)
        started = time.time()
        rest = proc.communicate(timeout=20)[0]
    finally:
        proc.kill()
    assert time.time() - started < 10
    assert proc.returncode == 137, head + rest  # SIGKILL: 128 + 9
    assert "SIGINT: forwarding SIGTERM to every worker" in rest
    assert all(_gone(pid) for pid in _pids(head))


def test_sigterm_to_the_launcher_lets_workers_save_and_exits_143(worker_module):
    proc = _start(worker_module, "--num_workers=2", mode="save")
    try:
        head = _wait_for_lines(proc, r"\] ready", 2)
        proc.send_signal(signal.SIGTERM)
        rest = proc.communicate(timeout=20)[0]
    finally:
        proc.kill()
    assert proc.returncode == 143, head + rest
    assert rest.count("saved a checkpoint") == 2
    assert all(_gone(pid) for pid in _pids(head))


def test_killed_launcher_takes_workers_and_their_children_with_it(worker_module):
    proc = _start(worker_module, "--num_workers=2", mode="child")
    try:
        head = _wait_for_lines(proc, r"\] ready", 2)
        proc.kill()  # SIGKILL: the launcher cannot clean up; PR_SET_PDEATHSIG must
        proc.wait()
    finally:
        proc.kill()
    workers = _pids(head)
    deadline = time.time() + 10
    while not all(_gone(pid) for pid in workers) and time.time() < deadline:
        time.sleep(0.1)
    assert all(_gone(pid) for pid in workers)
    # Grandchildren are not covered by PDEATHSIG; they only die when the launcher exits normally.
    for pid in _pids(head, "grandchild"):
        if not _gone(pid):
            os.kill(pid, signal.SIGKILL)


def test_normal_exit_kills_leftover_grandchildren(worker_module):
    proc = _start(worker_module, "--num_workers=2", "--stop_grace_s=1", mode="child")
    try:
        head = _wait_for_lines(proc, r"\] ready", 2)
        proc.send_signal(signal.SIGTERM)
        rest = proc.communicate(timeout=20)[0]
    finally:
        proc.kill()
    assert proc.returncode == 143, head + rest
    grandchildren = _pids(head, "grandchild")
    assert len(grandchildren) == 2 and all(_gone(pid) for pid in grandchildren)


def test_a_worker_that_never_starts_training_is_a_hang_and_ends_the_job_124(worker_module):
    code, output = _run(worker_module, "--num_workers=2", "--worker_timeout_s=1", "--stop_grace_s=1", mode="hang")
    assert code == 124, output
    assert re.search(r"error: worker \d did not start training within 1\.\d s \(--worker_timeout_s=1\); exit 124",
                     output), output
    assert all(_gone(pid) for pid in _pids(output))


def _history(model_dir, kind):
    records = [json.loads(line) for line in (model_dir / "history.jsonl").read_text().splitlines()]
    return [r for r in records if r["kind"] == kind]


def test_a_killed_worker_is_restarted_on_the_slots_left_from_the_newest_checkpoint(worker_module, tmp_path):
    model_dir = tmp_path / "run"
    model_dir.mkdir()
    code, output = _run(worker_module, "--num_workers=3", "--min_workers=2", "--max_restarts=2", "--stop_grace_s=2",
                        mode="heal:kill:1:12", env={"TINY_MODEL_DIR": str(model_dir)})
    assert code == 0, output
    # The stand-in workers are not in lockstep: a peer may be a few steps (and a checkpoint) ahead of the victim.
    line = re.search(r"tfgpu.launch: restart 1 of --max_restarts=2: worker 1 was killed by SIGKILL \(exit 137\) "
                     r"after step (\d+); 3 -> 2 workers, resuming from the checkpoint at step (\d+) \((\d+) step\(s\) "
                     r"lost\)$", output, re.M)
    assert line, output
    last, resumed, lost = (int(g) for g in line.groups())
    assert last >= 12 and resumed % 5 == 0 and 10 <= resumed <= last and lost == last - resumed, output
    assert output.count(f"resumed at {resumed} on 2 workers") == 2 and output.count("finished at 30") == 2, output
    assert "all 2 workers finished after 1 restart(s)" in output
    first = re.search(r"restart 1: the new group of 2 finished its first loop \(step (\d+)\) [\d.]+ s after", output)
    assert first and int(first.group(1)) > resumed, output
    clusters = re.findall(r"cluster=(\S+)", output)
    assert len(set(clusters)) == 2 and len(clusters[-1].split(",")) == 2  # fresh ports for the new group
    record, = _history(model_dir, "restart")
    assert (record["step"], record["worker"], record["exit_code"], record["workers_before"],
            record["workers_after"], record["steps_lost"]) == (resumed, 1, 137, 3, 2, lost)
    assert all(_gone(pid) for pid in _pids(output))


def test_a_hung_worker_is_killed_within_the_timeout_of_its_last_progress(worker_module, tmp_path):
    model_dir = tmp_path / "run"
    model_dir.mkdir()
    started = time.time()
    code, output = _run(worker_module, "--num_workers=3", "--min_workers=2", "--max_restarts=1",
                        "--worker_timeout_s=4", "--startup_timeout_s=30", "--stop_grace_s=1", mode="heal:stop:2:7",
                        env={"TINY_MODEL_DIR": str(model_dir)})
    assert code == 0, output
    hang = re.search(r"worker 2 made no progress for ([\d.]+) s \(--worker_timeout_s=4, stopped by a signal\)",
                     output)
    assert hang and 0 < float(hang.group(1)) < 4 + 1.5, output  # its peers, waiting for it, can go silent first
    stopped = re.search(r"group stopped ([\d.]+) s after its last progress \(worker \d, training at step \d\)",
                        output)
    # the timeout, then the kill and a SIGTERM (4 s, not less: a loaded 2-core host can leave a live worker's
    # heartbeat 1.5 s old, which was then taken for the hang)
    assert stopped and float(stopped.group(1)) < 4 + 2.5, output
    line = re.search(r"restart 1 of --max_restarts=1: worker 2 made no progress .* after step (\d+); 3 -> 2 workers, "
                     r"resuming from the checkpoint at step (\d+)", output)
    assert line and int(line.group(1)) >= 7 and 5 <= int(line.group(2)) <= int(line.group(1)), output
    assert output.count("finished at 30") == 2 and time.time() - started < 60
    assert _history(model_dir, "restart")[0]["hung"] is True


def test_failures_a_restart_cannot_help_end_the_job(worker_module, tmp_path):
    code, output = _run(worker_module, "--num_workers=3", "--max_restarts=3", "--stop_grace_s=2", mode="fail:1:3")
    assert code == 3 and "restart 1" not in output, output  # exit 3: a kernel failed, it would again
    model_dir = tmp_path / "run"
    model_dir.mkdir()
    code, output = _run(worker_module, "--num_workers=2", "--min_workers=2", "--max_restarts=3", "--stop_grace_s=2",
                        mode="heal:kill:1:6", env={"TINY_MODEL_DIR": str(model_dir)})
    assert code == 137, output
    assert "cannot restart: 1 worker slot(s) left, fewer than --min_workers=2" in output
    assert "error: worker 1 failed with exit code 137" in output


def test_restarts_stop_after_max_restarts_with_the_last_failure(worker_module, tmp_path):
    model_dir = tmp_path / "run"
    model_dir.mkdir()
    code, output = _run(worker_module, "--num_workers=2", "--max_restarts=1", "--reuse_failed_slots",
                        "--stop_grace_s=2", mode="heal:kill:0:6", env={"TINY_MODEL_DIR": str(model_dir)})
    assert code == 0, output  # one restart, on both slots: the victim's slot is reused
    assert "restart 1 of --max_restarts=1: worker 0 was killed by SIGKILL (exit 137) after step" in output
    assert "2 -> 2 workers, resuming from the checkpoint at step 5" in output, output


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores")
def test_cores_are_pinned_per_worker(worker_module):
    cores = sorted(os.sched_getaffinity(0))
    code, output = _run(worker_module, "--num_workers=2", "--cpu_cores_per_worker=1")
    assert code == 0, output
    assert "[worker 0] pid" in output
    assert re.search(rf"index=0 .*cores=\[{cores[0]}\]", output) and re.search(rf"index=1 .*cores=\[{cores[1]}\]",
                                                                                   output), output


@pytest.mark.parametrize("args, message", [
    (["--num_workers=0"], "--num_workers must be at least 1"),
    (["--num_workers=2", "--cpu_cores_per_worker=100000"], "--cpu_cores_per_worker=100000 x --num_workers=2 needs 200000 cores"),
    (["--num_workers=two"], "--num_workers: invalid int value: 'two'"),
    (["--num_workers=2", "--python=/no/such/python"], "cannot start /no/such/python"),
    (["--num_workers=2", "--min_workers=3"], "--min_workers=3 must be between 1 and --num_workers=2"),
    (["--num_workers=2", "--max_restarts=-1"], "--max_restarts must be >= 0, got -1"),
    ([], "--num_workers: is required"),
    (["--num_workers=2", "--rendezvous=http://node1:2379/run7"], "--rendezvous='http://node1:2379/run7': expected "
                                                                   "etcd://HOST:PORT/JOB_ID"),
    (["--num_workers=3", "--workers_per_host=2", "--rendezvous=etcd://node1/run7"],
     "--workers_per_host=2 must be at least 1 and divide --num_workers=3"),
    (["--num_workers=2", "--rendezvous=etcd://127.0.0.1:9/run7"], "etcd at http://127.0.0.1:9 cannot be reached"),
    (["--num_workers=2", "--rendezvous=etcd://node1/run7", "--host=node 1"],
     "--host='node 1': with --rendezvous, a host name or IP address"),
    (["--num_workers=2", "--rendezvous=etcd://node1/run7?cert=/no/cert.pem&key=/no/key.pem"],
     "--rendezvous: cert='/no/cert.pem' is not a readable file"),
])
def test_bad_launcher_flags_exit_1_before_starting(worker_module, args, message):
    code, output = _run(worker_module, *args)
    assert code == 1 and f"error: {message}" in output, output
    assert "started" not in output


def test_each_worker_gets_its_own_gpus_from_the_launchers_list(worker_module):
    code, output = _run(worker_module, "--num_workers=2", env={"CUDA_VISIBLE_DEVICES": "2,3,5,7"})
    assert code == 0, output
    assert re.search(r"\[worker 0\] .*index=0 .*gpus=2,3$", output, re.M), output
    assert re.search(r"\[worker 1\] .*index=1 .*gpus=5,7$", output, re.M), output
    assert "with GPUs 2,3 | 5,7" in output


def test_gpus_that_do_not_split_evenly_stop_the_launch_before_any_worker(worker_module, monkeypatch, capsys):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2")

    def no_worker_may_start(*args, **kwargs):
        raise AssertionError("a worker was started")

    monkeypatch.setattr(launcher.subprocess, "Popen", no_worker_may_start)
    assert launch.main(["--num_workers=2", "--module=tiny_worker"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: --num_workers=2 does not divide the 3 GPUs visible (CUDA_VISIBLE_DEVICES=0,1,2)")




@pytest.mark.slow  # by default a real all-reduce runs through the launcher in tests/test_multi_worker.py
def test_two_workers_all_reduce_over_multi_worker_mirrored_strategy(worker_module):
    code, output = _run(worker_module, "--num_workers=2", module="mwms_worker", timeout=120)
    assert code == 0, output
    assert "[worker 0] replicas=2 sum=3.0" in output and "[worker 1] replicas=2 sum=3.0" in output, output


@pytest.mark.slow  # the same assertions run by default in tests/test_multi_worker.py (launcher vs mirrored)
def test_train_end_to_end(tmp_path, data_cache):
    model_dir = tmp_path / "run"
    env = {**os.environ, "TFGPU_DATA_CACHE": data_cache, "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run(
        [sys.executable, "-m", "tfgpu.launch", "--num_workers=2", "--", "--dataset=digits", "--model=small_cnn",
         "--global_batch_size=64", "--train_steps=8", "--steps_per_loop=4", f"--model_dir={model_dir}"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert re.search(r"^\[worker 0\] final: step=8", proc.stdout, re.M), proc.stdout[-4000:]
    metrics = read_metrics(model_dir)
    assert metrics["num_workers"] == 2 and metrics["step"] == 8


def test_split_argv_gives_everything_after_the_first_separator_to_the_workers():
    assert launch.split_argv(["--num_workers=2", "--", "--x", "--", "y"]) == (["--num_workers=2"], ["--x", "--", "y"])
