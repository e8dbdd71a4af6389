"""tools/slurm/train.sbatch on a real Slurm cluster: real sbatch, srun task launch, signals and requeue.

Needs a running cluster (`bash tools/slurm/local_cluster.sh up`, as root, brings up one on this host); each test
skips with the reason when there is none. Marked ``slurm``: not in the default run; `python -m pytest -q -m slurm`.
Every job runs 2 CPU workers on one node with the template's CPU-partition override; each test cancels its jobs.
"""
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO, read_history, read_metrics
from tfgpu.runtime import run_dir

RESUMED = r"^0: .*restored .*" + re.escape(run_dir.CHECKPOINT_PREFIX) + r"(\d+): resuming at step \1$"

pytestmark = pytest.mark.slurm

TEMPLATE = os.path.join(REPO, "tools", "slurm", "train.sbatch")
LOCAL_CLUSTER = os.path.join(REPO, "tools", "slurm", "local_cluster.sh")
CPU_PARTITION = ["--nodes=1", "--ntasks-per-node=2", "--gpus-per-node=0", "--cpus-per-task=1"]
JOB_TIMEOUT_S = 240  # one 2-worker run takes ~45 s on 2 cores, most of it TensorFlow starting twice
FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
                "DEADLINE"}


@pytest.fixture(scope="module")
def slurm_cluster():
    if shutil.which("sinfo") is None or shutil.which("sbatch") is None:
        pytest.skip("Slurm is not installed (no sinfo/sbatch): as root, `bash tools/slurm/local_cluster.sh up`")
    proc = subprocess.run(["bash", LOCAL_CLUSTER, "status"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=30)
    if proc.returncode != 0:
        pytest.skip(f"no Slurm cluster answers here ({proc.stdout.strip()}): as root, "
                    "`bash tools/slurm/local_cluster.sh up`")


class Job:
    """One sbatch of the template with a tiny digits run; its output file and model_dir live under tmp_path."""

    def __init__(self, tmp_path, data_cache, steps, *train_flags, python=sys.executable, env=None):
        self.out, self.model_dir, self.tmp = tmp_path / "job.out", tmp_path / "run", tmp_path / "tmp"
        self.tmp.mkdir()
        flags = tmp_path / "tiny.flags"
        flags.write_text("--dataset=digits\n--model=small_cnn\n--global_batch_size=64\n--steps_per_loop=4\n"
                         f"--checkpoint_every_steps=8\n--eval_split=none\n--train_steps={steps}\n")
        env = {**os.environ, "TFGPU_PYTHON": str(python), "TFGPU_DATA_CACHE": data_cache,
               "TF_CPP_MIN_LOG_LEVEL": "2", "TMPDIR": str(self.tmp), **(env or {})}
        env.pop("TF_CONFIG", None)
        proc = subprocess.run(["sbatch", "--parsable", "--job-name=tfgpu-test", *CPU_PARTITION,
                               f"--output={self.out}", f"--chdir={REPO}", TEMPLATE, str(flags), str(self.model_dir),
                               *train_flags], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=30)
        assert proc.returncode == 0, proc.stdout
        self.id = proc.stdout.strip().split(";")[0]

    def output(self):
        return self.out.read_text() if self.out.exists() else ""

    def info(self):
        """scontrol's fields of the job (JobState, Restarts, ExitCode, ...)."""
        line = subprocess.run(["scontrol", "-o", "show", "job", self.id], stdout=subprocess.PIPE, text=True,
                              timeout=30).stdout
        return dict(re.findall(r"(\w+)=(\S*)", line))

    def wait_for_output(self, pattern, timeout=JOB_TIMEOUT_S):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            match = re.search(pattern, self.output(), re.M)
            if match:
                return match
            if self.info().get("JobState") in FINAL_STATES:
                break
            time.sleep(0.5)
        raise AssertionError(f"job {self.id}: no {pattern!r} in its output:\n{self.output()[-4000:]}")

    def wait_until_final(self, timeout=JOB_TIMEOUT_S):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = self.info()
            if info.get("JobState") in FINAL_STATES:
                return info
            time.sleep(1)
        raise AssertionError(f"job {self.id} still {self.info().get('JobState')} after {timeout}s:\n"
                             f"{self.output()[-4000:]}")

    def worker_pid(self, rank):
        """The pid of the tfgpu.train process srun started as task ``rank`` of this job."""
        wanted = {f"SLURM_JOB_ID={self.id}".encode(), f"SLURM_PROCID={rank}".encode()}
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    environ = set(f.read().split(b"\0"))
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmdline = f.read()
            except OSError:
                continue
            if wanted <= environ and b"tfgpu.train" in cmdline:
                return int(pid)
        raise AssertionError(f"job {self.id}: no task {rank} process on this host")


@pytest.fixture
def submit(slurm_cluster, tmp_path, data_cache):
    jobs = []

    def run(steps, *train_flags, python=sys.executable, env=None):
        jobs.append(Job(tmp_path, data_cache, steps, *train_flags, python=python, env=env))
        return jobs[-1]

    yield run
    for job in jobs:
        subprocess.run(["scancel", "--full", "--signal=KILL", job.id], capture_output=True, timeout=30)
        subprocess.run(["scancel", job.id], capture_output=True, timeout=30)
    for job in jobs:  # a job's processes may hold files in tmp_path until they are gone
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and job.info().get("JobState") not in FINAL_STATES | {None}:
            time.sleep(1)


def _finals(output):
    """{rank: final step} from the workers' `final:` lines."""
    return {int(rank): int(step) for rank, step in re.findall(r"^(\d): final: step=(\d+)", output, re.M)}


def test_template_trains_two_workers_and_only_the_chief_writes(submit):
    job = submit(16)
    info = job.wait_until_final()
    out = job.output()
    assert (info["JobState"], info["ExitCode"], info["Restarts"]) == ("COMPLETED", "0:0", "0"), out[-4000:]
    assert "tfgpu: finished" in out
    assert _finals(out) == {0: 16, 1: 16}, out[-4000:]
    assert re.search(r"^1: .*cluster: 2 workers from slurm, this is worker 1 at \S+:\d+$", out, re.M)
    assert read_metrics(job.model_dir)["num_workers"] == 2
    # One writer: one summary file, single-shard checkpoints, and worker 1's share of each save deleted. The flags say
    # --eval_split=none, and a TensorBoard run is made at its first scalar, so there is no validation run.
    assert sorted(os.listdir(job.model_dir / "summaries")) == ["train"]
    assert len(os.listdir(job.model_dir / "summaries" / "train")) == 1
    data = [f for f in os.listdir(job.model_dir / run_dir.CHECKPOINTS_DIR) if ".data-" in f]
    assert data and all(f.endswith("-of-00001") for f in data), data
    assert os.listdir(job.tmp) == []


def test_scancel_term_saves_one_step_exits_143_and_the_requeue_finishes(submit):
    steps = 400
    job = submit(steps)
    job.wait_for_output(r"^0: step 12/")
    subprocess.run(["scancel", "--signal=TERM", job.id], check=True, timeout=30)  # to the steps, like --signal
    info = job.wait_until_final()
    out = job.output()
    # Restarts may be 2: on a loaded host slurmctld's delayed cancel of the first run's step 0 can hit the
    # requeued run's step 0 (same id); that SIGTERM is one more save and requeue (seen once on 2 cores).
    assert info["JobState"] == "COMPLETED" and int(info["Restarts"]) >= 1, out[-4000:]
    saved = dict(re.findall(r"^(\d): .*preempted: checkpoint saved at step (\d+)", out, re.M))
    assert set(saved) == {"0", "1"} and len(set(saved.values())) == 1, out[-4000:]
    step = saved["0"]
    assert "tfgpu: exit 143 (SIGTERM: a preemption or time-limit signal" in out
    assert "tfgpu: job %s restart 1: 2 tasks" % job.id in out
    assert len(re.findall(rf"^\d: .*resuming at step {step}$", out, re.M)) == 2, out[-4000:]
    assert _finals(out) == {0: steps, 1: steps}
    history = read_history(job.model_dir)
    assert history[-1]["step"] == steps


def test_a_job_requeued_with_fewer_tasks_resumes_on_them_and_finishes(submit):
    """A preemption after which the job gets fewer tasks (changed while it waits, as a cluster that lost nodes
    would): the requeued run starts one task, which says the topology changed and trains to the end."""
    steps = 200
    job = submit(steps)
    job.wait_for_output(r"^0: step 12/")
    subprocess.run(["scontrol", "hold", job.id], check=True, timeout=30)  # so it waits once requeued
    subprocess.run(["scancel", "--signal=TERM", job.id], check=True, timeout=30)
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while job.info().get("JobState") != "PENDING":
        assert time.monotonic() < deadline, job.output()[-4000:]
        time.sleep(0.5)
    subprocess.run(["scontrol", "update", f"JobId={job.id}", "NumTasks=1", "TasksPerNode=1"], check=True, timeout=30)
    subprocess.run(["scontrol", "release", job.id], check=True, timeout=30)
    info = job.wait_until_final()
    out = job.output()
    assert info["JobState"] == "COMPLETED", out[-4000:]
    assert f"tfgpu: job {job.id} restart 1: 1 tasks" in out, out[-4000:]
    assert re.search(r"^0: .*topology changed: 2 workers x 1 replica -> 1 worker x 1 replica \(global batch 64 kept",
                     out, re.M), out[-4000:]
    assert _finals(out) == {0: steps}
    (change,) = read_history(job.model_dir, "topology")
    assert (change["before"]["num_workers"], change["after"]["num_workers"]) == (2, 1)
    assert read_history(job.model_dir)[-1]["step"] == steps


def test_a_killed_worker_makes_its_peer_exit_129_and_the_job_requeues(submit):
    steps = 200
    job = submit(steps)
    job.wait_for_output(r"^0: step 12/")
    os.kill(job.worker_pid(1), 9)
    job.wait_for_output(r"^tfgpu: job \d+ restart 1:")
    first_run = job.output()
    assert re.search(r"^srun: error: \S+: task 1: Killed$", first_run, re.M), first_run[-4000:]
    # The survivor finds its peer gone (exit 129), racing srun --kill-on-bad-exit's SIGTERM to it: srun then
    # exits 137 (the killed task's 128+9) or 143, and the template requeues both.
    assert re.search(r"^0: error: worker 0: a collective failed after step \d+ .*another worker died", first_run,
                     re.M), first_run[-4000:]
    assert re.search(r"^srun: error: \S+: task 0: (Exited with exit code 129|Terminated)$", first_run, re.M)
    assert re.search(r"^tfgpu: exit (137 \(a task was killed by signal 9\)|143 \(SIGTERM.*\)): requeueing",
                     first_run, re.M), first_run[-4000:]
    info = job.wait_until_final()
    out = job.output()
    # Restarts may be 2: on a loaded host slurmctld's delayed cancel of the first run's step 0 can hit the
    # requeued run's step 0 (same id); that SIGTERM is one more save and requeue (seen once on 2 cores).
    assert info["JobState"] == "COMPLETED" and int(info["Restarts"]) >= 1, out[-4000:]
    assert re.search(RESUMED, out, re.M), out[-4000:]
    assert _finals(out) == {0: steps, 1: steps}


def test_a_killed_worker_is_restarted_inside_the_allocation_without_a_requeue(submit):
    """TFGPU_MAX_RESTARTS: the failed step is started again at once on the nodes still up (here the one node,
    both tasks), resumes from the last checkpoint and finishes; the job is never requeued."""
    steps = 200
    job = submit(steps, env={"TFGPU_MAX_RESTARTS": "1"})
    job.wait_for_output(r"^0: step 12/")
    os.kill(job.worker_pid(1), 9)
    job.wait_for_output(r"^tfgpu: restart 1 of TFGPU_MAX_RESTARTS=1: the step exited (137|143); 2 -> 2 tasks on 1 "
                        r"node\(s\), resuming from the newest checkpoint in ")
    info = job.wait_until_final()
    out = job.output()
    assert info["JobState"] == "COMPLETED" and int(info["Restarts"]) == 0, out[-4000:]
    assert "requeueing" not in out
    assert re.search(RESUMED, out, re.M), out[-4000:]
    assert _finals(out) == {0: steps, 1: steps}


def test_a_configuration_error_exits_1_and_is_not_requeued(submit):
    job = submit(16, "--no_such_flag=1")
    info = job.wait_until_final()
    out = job.output()
    assert (info["JobState"], info["ExitCode"], info["Restarts"]) == ("FAILED", "1:0", "0"), out[-4000:]
    assert "error: --no_such_flag: unknown flag for python -m tfgpu.train" in out
    assert "tfgpu: configuration error (exit 1): not requeueing" in out
    time.sleep(3)
    assert job.info()["JobState"] == "FAILED"  # still: nothing requeued it


# Stands in for TFGPU_PYTHON to fix the order of a race: task 1 rejects its flags at once while task 0 is still
# starting (importing TensorFlow takes seconds), so srun's --kill-on-bad-exit stops task 0 with SIGTERM.
ONE_TASK_REJECTS_ITS_FLAGS = """#!/bin/bash
if [ "$SLURM_PROCID" = 1 ]; then
  echo "error: --no_such_flag: unknown flag for python -m tfgpu.train" >&2
  exit 1
fi
exec sleep 120
"""


def test_a_configuration_error_is_not_requeued_when_srun_stops_the_other_task_first(submit, tmp_path):
    """srun then exits 143 (its stopped task's 128+SIGTERM), as for a preemption; CI saw the real run requeue once
    this way. The template reads each task's code from srun's own lines and finds the 1."""
    python = tmp_path / "python"
    python.write_text(ONE_TASK_REJECTS_ITS_FLAGS)
    python.chmod(0o755)
    job = submit(16, "--no_such_flag=1", python=python)
    info = job.wait_until_final()
    out = job.output()
    assert re.search(r"^srun: error: \S+: task 1: Exited with exit code 1$", out, re.M), out[-4000:]
    assert re.search(r"^srun: error: \S+: task 0: Terminated$", out, re.M), out[-4000:]  # the race, forced
    assert (info["JobState"], info["ExitCode"], info["Restarts"]) == ("FAILED", "1:0", "0"), out[-4000:]
    assert "tfgpu: configuration error (exit 1): not requeueing" in out
    assert "requeueing to resume" not in out


def test_a_cancelled_job_is_not_requeued(submit):
    """scancel (no --signal) also sends SIGTERM: the workers save and exit 143 as for a preemption, but the job
    is ending, and requeueing it would undo the cancel."""
    job = submit(400)
    job.wait_for_output(r"^0: step 8/")
    subprocess.run(["scancel", job.id], check=True, timeout=30)
    job.wait_for_output(r"^tfgpu: exit \d+ but the job is COMPLETING \(cancelled\): not requeueing$", timeout=60)
    info = job.wait_until_final()
    assert (info["JobState"], info["Restarts"]) == ("CANCELLED", "0"), job.output()[-4000:]
