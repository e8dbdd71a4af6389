"""tools/slurm/train.sbatch's restarts inside the allocation (TFGPU_MAX_RESTARTS): a failed srun step is started
again on the nodes left, with stand-ins for srun, sinfo and scontrol (no Slurm needed; the real cluster's tests
are tests/tools/test_slurm.py)."""
import os
import re
import subprocess
import sys

from tests.conftest import REPO
from tests.runtime.test_cluster import _executable

# srun honouring --ntasks and --exclude as the template passes them: starts the tasks on this host with the step's
# variables, logs its own arguments, exits with the worst task's code.
SRUN = r'''#!/usr/bin/env python3
import os, subprocess, sys
args, ntasks = sys.argv[1:], int(os.environ["SLURM_NTASKS"])
print("SRUN " + " ".join(a for a in args if a.startswith("--ntasks") or a.startswith("--exclude")), flush=True)
while args and args[0].startswith("-"):
    option = args.pop(0)
    if option.startswith("--ntasks="):
        ntasks = int(option.split("=")[1])
codes = []
for rank in range(ntasks):
    env = {**os.environ, "SLURM_PROCID": str(rank), "SLURM_STEP_NUM_TASKS": str(ntasks)}
    codes.append(subprocess.run(args, env=env).returncode)
sys.exit(max(codes))
'''

# The training process: task 1 of the first step exits 137 (killed), every other task of every step exits 0.
PYTHON = r'''#!{python}
import os, sys
count = os.path.join(os.environ["STEPS_DIR"], os.environ["SLURM_PROCID"])
step = int(open(count).read()) if os.path.exists(count) else 0
open(count, "w").write(str(step + 1))
print(f"TASK {{os.environ['SLURM_PROCID']}} of {{os.environ['SLURM_STEP_NUM_TASKS']}} in step {{step}}", flush=True)
sys.exit(int(os.environ.get("FAIL_CODE", "137")) if step == 0 and os.environ["SLURM_PROCID"] == "1" else 0)
'''


def _run(tmp_path, lost_node="", **env):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    _executable(bin_dir / "srun", SRUN)
    _executable(bin_dir / "scontrol", "#!/bin/sh\n[ \"$1 $2\" = 'show hostnames' ] && printf 'node1\\nnode2\\n' "
                                      "&& exit 0\nexit 1\n")
    _executable(bin_dir / "sinfo", f"#!/bin/sh\nprintf '{lost_node}'\n")
    python = _executable(tmp_path / "python", PYTHON.format(python=sys.executable))
    steps = tmp_path / "steps"
    steps.mkdir(exist_ok=True)
    flags = tmp_path / "tiny.flags"
    flags.write_text("--dataset=digits\n")
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "SLURM_JOB_ID": "4242",
           "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "node[1-2]", "TFGPU_PYTHON": str(python),
           "STEPS_DIR": str(steps), **env}
    return subprocess.run(["bash", os.path.join(REPO, "tools", "slurm", "train.sbatch"), str(flags),
                           str(tmp_path / "run")], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=60)


def test_a_killed_task_is_restarted_inside_the_allocation_on_every_node_still_up(tmp_path):
    proc = _run(tmp_path, TFGPU_MAX_RESTARTS="2")
    assert proc.returncode == 0 and "tfgpu: finished" in proc.stdout, proc.stdout
    assert ("tfgpu: restart 1 of TFGPU_MAX_RESTARTS=2: the step exited 137; 2 -> 2 tasks on 2 node(s), resuming "
            "from the newest checkpoint in") in proc.stdout
    assert re.findall(r"^TASK (\d) of (\d) in step 1$", proc.stdout, re.M) == [("0", "2"), ("1", "2")]
    assert "requeue" not in proc.stdout


def test_a_lost_node_is_left_out_and_too_few_tasks_stop_the_restarts(tmp_path):
    proc = _run(tmp_path, lost_node="node2\\n", TFGPU_MAX_RESTARTS="1")
    assert proc.returncode == 0, proc.stdout
    assert "2 -> 1 tasks on 1 node(s) (without node2)" in proc.stdout
    assert "SRUN --ntasks=1 --exclude=node2" in proc.stdout  # the new step avoids the lost node
    assert re.findall(r"^TASK (\d) of (\d) in step 1$", proc.stdout, re.M) == [("0", "1")]
    (tmp_path / "min").mkdir()
    proc = _run(tmp_path / "min", lost_node="node2\\n", TFGPU_MAX_RESTARTS="1", TFGPU_MIN_WORKERS="2")
    assert "tfgpu: cannot restart inside the allocation: 1 tasks left on 1 node(s), fewer than TFGPU_MIN_WORKERS=2" \
        in proc.stdout
    assert proc.returncode == 137


def test_permanent_failures_and_the_default_are_not_restarted(tmp_path):
    proc = _run(tmp_path, TFGPU_MAX_RESTARTS="2", FAIL_CODE="3")
    assert proc.returncode == 3 and "restart 1" not in proc.stdout and "not requeueing" in proc.stdout
    (tmp_path / "default").mkdir()
    proc = _run(tmp_path / "default", TFGPU_MAX_REQUEUES="0")  # TFGPU_MAX_RESTARTS unset: the requeue path as before
    assert proc.returncode == 137 and "restart 1" not in proc.stdout and "giving up" in proc.stdout, proc.stdout
