"""tools/heal_trials.py: the seed decides the victim and the step; one real trial (3 workers, one kill -9'd,
--min_workers=2) finishes on its own, audits clean and lands near the uninterrupted run (slow)."""
import json
import os

import pytest
from tests.tools import load

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


trials = load("heal_trials")


def test_the_launch_command_asks_for_restarts_on_the_workers_left(tmp_path):
    args = trials.parse_args(["--output_dir", str(tmp_path), "--workers=3", "--min_workers=2", "--", "--epochs=2"])
    command = trials.launch_command(args, str(tmp_path / "run"))
    assert command[command.index("-m") + 1] == "tfgpu.launch"
    assert {"--num_workers=3", "--min_workers=2", "--max_restarts=2"} <= set(command)
    assert command[-2:] == ["--epochs=2", f"--model_dir={tmp_path / 'run'}"]  # extra flags win over the defaults
    assert "--checkpoint_every=20s" in command


@pytest.mark.slow
def test_one_killed_worker_heals_audits_clean_and_keeps_the_accuracy(tmp_path):
    out = tmp_path / "trials"
    code = trials.main(["--trials=1", "--failure=kill", f"--output_dir={out}"])  # the quickstart's 450 steps
    report = json.loads((out / "trials-kill.json").read_text())
    trial, = report["trials"]
    assert code == 0 and trial["ok"], trial
    restart, = trial["restarts"]
    assert (restart["workers_before"], restart["workers_after"], restart["exit_code"]) == (3, 2, 137)
    assert trial["audit"] == {"duplicated": 0, "missing": 0}


def test_each_host_agent_runs_in_its_namespace_with_its_address_and_the_shared_rendezvous(tmp_path):
    import types

    from tfgpu.bench import netem

    args = trials.parse_args(["--output_dir", str(tmp_path), "--failure=host", "--workers=3", "--min_workers=2"])
    cluster = types.SimpleNamespace(netem=netem, endpoint="etcd://10.233.0.254:2379")
    command = trials.agent_command(args, str(tmp_path / "run"), cluster, "job7", 2)
    assert command[:4] == ["ip", "netns", "exec", netem.worker_ns(2)]
    assert command[command.index("-m") + 1] == "tfgpu.launch"
    assert {"--rendezvous=etcd://10.233.0.254:2379/job7", "--host=10.233.0.3", "--workers_per_host=1",
            "--num_workers=3", "--min_workers=2"} <= set(command)
    assert command[-1] == f"--model_dir={tmp_path / 'run'}"
    # the seed picks the host and the step the same way for every failure kind
    assert trials.victim_and_step(args, 4) == trials.victim_and_step(args, 4)


def _skip_without_namespaces_and_etcd():
    import shutil

    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("etcd"):
        pytest.skip("needs root, iproute2 (network namespaces) and etcd (apt-get install -y etcd-server)")


@pytest.mark.slow
def test_one_lost_host_heals_audits_clean_and_keeps_the_accuracy(tmp_path):
    _skip_without_namespaces_and_etcd()
    out = tmp_path / "trials"
    code = trials.main(["--trials=1", "--failure=host", f"--output_dir={out}"])
    trial, = json.loads((out / "trials-host.json").read_text())["trials"]
    assert code == 0 and trial["ok"], trial
    restart, = trial["restarts"]
    assert (restart["workers_before"], restart["workers_after"]) == (3, 2)
    assert "was lost with host" in restart["reason"]
    assert trial["audit"] == {"duplicated": 0, "missing": 0}


@pytest.mark.slow
def test_a_host_that_joins_grows_the_group_back_and_the_run_stays_exact(tmp_path):
    _skip_without_namespaces_and_etcd()
    out = tmp_path / "trials"
    code = trials.main(["--trials=1", "--failure=join", f"--output_dir={out}"])
    trial, = json.loads((out / "trials-join.json").read_text())["trials"]
    assert code == 0 and trial["ok"], trial
    assert [(t["before"]["num_workers"], t["after"]["num_workers"]) for t in trial["topologies"]] == [(2, 3)]
    assert trial["restarts"] == [] and trial["audit"] == {"duplicated": 0, "missing": 0}
