"""Trials of a job that heals itself: a multi-worker run started by ``tfgpu.launch --max_restarts``, one worker
killed (``--failure=kill``: SIGKILL) or hung (``--failure=stop``: SIGSTOP) at a step its trial's seed picks; each
trial must finish on its own.

    python tools/heal_trials.py --trials=10 --failure=kill --output_dir=/tmp/heal [--workers=3 --min_workers=2]
        [-- extra train flags]

``--failure=host`` (root, iproute2, etcd): each worker is a "host", a network namespace of an emulated cluster
(``tfgpu.bench.netem``, names ``tfgpu-heal-*``) with its own ``tfgpu.launch --rendezvous`` agent; etcd runs in the
hub namespace. The victim host loses every process at once (its agent and its worker, SIGKILL): the agents left
see its lease expire and re-form the group without it. ``--failure=join`` is the other way round: the job starts
on all hosts but the last (``--min_workers`` of them), and the last host's agent starts at the seed's step; the
group grows back to ``--workers``, resuming from the newest checkpoint (no restart is counted). The namespaces and
etcd are removed when the tool ends.

Per trial (seed s): worker ``random.Random(s).randrange(workers)`` is signalled once the chief's history.jsonl
reaches a step drawn from [--first_step, --last_step]; the launcher stops the group and starts one on the
workers left. What is measured, from the run's own files and the tool's clock:

- the launcher's exit code and its ``restart`` records (history.jsonl): old -> new size, steps lost;
- recovery: from the signal to the end of the new group's first loop (its first ``train`` record); the first
  step itself ends up to --steps_per_loop steps earlier;
- for a hang: how long after the group's last progress it was stopped (``stopped_after_progress_s``);
- the exactly-once audit: ``python -m tfgpu.audit_input`` over each recorded topology change (previous workers,
  the step resumed from, one epoch after), which must show 0 records fed twice and 0 never;
- the final val_accuracy against an uninterrupted run of the same flags (``--baseline``, run once first).

Writes ``trials.json`` and prints one line per trial and the medians and maxima. Exit 0 when every trial
finished, audited clean and landed within --accuracy_tolerance of the baseline, else 2.
"""
import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)  # tfgpu from this checkout
TRAIN_FLAGS = ["--flagfile=configs/quickstart.flags", "--global_batch_size=48", "--steps_per_loop=10",
               "--checkpoint_every_steps=1000", "--checkpoint_every=20s", "--verbose=2"]


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=10)
    p.add_argument("--first_seed", type=int, default=0)
    p.add_argument("--failure", choices=("kill", "stop", "host", "join"), default="kill")
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--min_workers", type=int, default=2)
    p.add_argument("--first_step", type=int, default=40, help="The earliest step a worker is signalled at.")
    p.add_argument("--last_step", type=int, default=360, help="The latest step a worker is signalled at.")
    p.add_argument("--worker_timeout_s", type=float, default=30.0)
    p.add_argument("--startup_timeout_s", type=float, default=300.0)
    p.add_argument("--trial_timeout_s", type=float, default=900.0)
    p.add_argument("--accuracy_tolerance", type=float, default=0.01)
    p.add_argument("--rendezvous_ttl_s", type=float, default=5.0, help="--failure=host: the agents' lease TTL.")
    p.add_argument("--output_dir", required=True)
    p.add_argument("--train_flags", default=" ".join(TRAIN_FLAGS),
                   help="The run's train flags (the quickstart's digits run on a global batch 2 and 3 divide).")
    args, extra = p.parse_known_args(argv)
    args.extra = [a for a in extra if a != "--"]
    return args


def _env():
    return {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "TF_CPP_MIN_LOG_LEVEL": "2"}


def read_history(model_dir):
    from tfgpu.metrics import history

    return history.read(model_dir)


def final_accuracy(model_dir):
    """The run's final val_accuracy from its metrics.json (``results.read``, the file's one reader), or None."""
    from tfgpu.config import ConfigError
    from tfgpu.metrics import results

    try:
        return results.final_metrics(results.read(model_dir)).get("val_accuracy")
    except ConfigError:
        return None


def launch_command(args, model_dir):
    return [sys.executable, "-m", "tfgpu.launch", f"--num_workers={args.workers}", f"--min_workers={args.min_workers}",
            "--max_restarts=2", f"--worker_timeout_s={args.worker_timeout_s:g}",
            f"--startup_timeout_s={args.startup_timeout_s:g}", "--stop_grace_s=5", "--",
            *args.train_flags.split(), *args.extra, f"--model_dir={model_dir}"]


def worker_pids(launcher_pid):
    """{task index: pid} of the launcher's worker processes, from their TF_CONFIG."""
    import psutil

    found = {}
    try:
        children = psutil.Process(launcher_pid).children()
    except psutil.NoSuchProcess:
        return found
    for child in children:
        try:
            config = json.loads(child.environ().get("TF_CONFIG", "{}"))
            found[config["task"]["index"]] = child.pid
        except (psutil.Error, ValueError, KeyError):
            continue
    return found


def victim_and_step(args, seed):
    rng = random.Random(seed)
    return rng.randrange(args.workers), rng.randint(args.first_step, args.last_step)


def run_trial(args, seed, model_dir, log_path):
    """Starts the launcher, signals the seed's worker at the seed's step, waits; returns what happened."""
    victim, at_step = victim_and_step(args, seed)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(launch_command(args, model_dir), cwd=REPO, env=_env(), stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        signalled_at, signalled_step = None, None
        deadline = time.time() + args.trial_timeout_s
        try:
            while proc.poll() is None and time.time() < deadline:
                if signalled_at is None:
                    steps = [r["step"] for r in read_history(model_dir) if r["kind"] == "train"]
                    if steps and max(steps) >= at_step:
                        pid = worker_pids(proc.pid).get(victim)
                        if pid is not None:
                            os.kill(pid, signal.SIGKILL if args.failure == "kill" else signal.SIGSTOP)
                            signalled_at, signalled_step = time.time(), max(steps)
                time.sleep(0.2)
            timed_out = proc.poll() is None
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return outcome(seed, victim, at_step, signalled_step, signalled_at, model_dir,
                   None if timed_out else proc.returncode, timed_out)


def outcome(seed, victim, at_step, signalled_step, signalled_at, model_dir, exit_code, timed_out):
    """A trial's record, from the run's history.jsonl and metrics.json and the tool's clock."""
    history = read_history(model_dir)
    restarts = [r for r in history if r["kind"] == "restart"]
    topologies = [r for r in history if r["kind"] == "topology"]
    # The new group's first loop: after the restart record (written when the group failed, or when the new chief
    # restored), or, for a group that grew (no restart), after its topology record.
    change = restarts[0]["time"] if restarts else topologies[0]["time"] if topologies and signalled_at else None
    after = [r for r in history if r["kind"] == "train" and change is not None and r["time"] > change]
    return {"seed": seed, "victim": victim, "at_step": at_step, "signalled_step": signalled_step,
            "exit_code": exit_code, "timed_out": timed_out,
            "restarts": restarts,
            "recovery_s": round(after[0]["time"] - signalled_at, 2) if after and signalled_at else None,
            "first_loop_step": after[0]["step"] if after else None,
            "topologies": [r for r in history if r["kind"] == "topology"],
            "val_accuracy": final_accuracy(model_dir)}


# -- a whole host lost: hosts as network namespaces, one tfgpu.launch agent each, etcd in the hub ----------------

NETEM_PREFIX = "tfgpu-heal"


def _netem():
    os.environ["TFGPU_NETEM_PREFIX"] = NETEM_PREFIX  # read when tfgpu.bench.netem is imported: our names only
    import importlib

    from tfgpu.bench import netem

    if netem.PREFIX != NETEM_PREFIX:  # imported earlier in this process (a test run) with another prefix
        netem = importlib.reload(netem)
    return netem


class HostCluster:
    """``args.workers`` namespaces and etcd serving them from the hub; ``close`` removes all of it."""

    def __init__(self, args):
        self.netem = _netem()
        self.netem.check_host()
        if not shutil.which("etcd"):
            raise SystemExit("error: --failure=host needs etcd (apt-get install -y etcd-server)")
        self.netem.down()  # what a killed earlier run of this tool left
        self.etcd = None
        self.netem.up(args.workers, "10gbit", 0.0)
        try:
            data = os.path.join(args.output_dir, "etcd")
            shutil.rmtree(data, ignore_errors=True)
            url = f"http://{self.netem.HUB_ADDRESS}:2379"
            self.etcd = subprocess.Popen(
                ["ip", "netns", "exec", self.netem.HUB, "etcd", "--name", "heal", "--data-dir", data,
                 "--listen-client-urls", url, "--advertise-client-urls", url,
                 "--listen-peer-urls", "http://127.0.0.1:2380", "--initial-advertise-peer-urls",
                 "http://127.0.0.1:2380", "--initial-cluster", "heal=http://127.0.0.1:2380"],
                stdout=open(data + ".log", "wb"), stderr=subprocess.STDOUT, start_new_session=True)
            probe = f"import urllib.request; urllib.request.urlopen('{url}/health', timeout=1).read()"
            for _ in range(100):
                if subprocess.run(["ip", "netns", "exec", self.netem.HUB, sys.executable, "-c", probe],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0:
                    break
                time.sleep(0.2)
            else:
                raise RuntimeError(f"etcd did not start in {self.netem.HUB} (see {data}.log)")
            self.endpoint = f"etcd://{self.netem.HUB_ADDRESS}:2379"
        except BaseException:
            self.close()
            raise

    def kill_host(self, index):
        """SIGKILL to every process of host ``index`` at once (its agent and its workers): a lost machine."""
        name = self.netem.worker_ns(index)
        pids = subprocess.run(["ip", "netns", "pids", name], stdout=subprocess.PIPE, text=True).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        return len(pids)

    def close(self):
        if self.etcd is not None and self.etcd.poll() is None:
            os.killpg(self.etcd.pid, signal.SIGKILL)
            self.etcd.wait()
        self.netem.down()


def agent_command(args, model_dir, cluster, job, index, join_grace_s=120):
    """Host ``index``'s agent: ``tfgpu.launch --rendezvous`` inside its namespace, one worker, the trial's flags."""
    netem = cluster.netem
    return ["ip", "netns", "exec", netem.worker_ns(index), sys.executable, "-m", "tfgpu.launch",
            f"--rendezvous={cluster.endpoint}/{job}", f"--num_workers={args.workers}",
            f"--min_workers={args.min_workers}", "--workers_per_host=1", f"--host={netem.worker_address(index)}",
            "--max_restarts=2", f"--worker_timeout_s={args.worker_timeout_s:g}",
            f"--startup_timeout_s={args.startup_timeout_s:g}", "--stop_grace_s=5",
            f"--rendezvous_ttl_s={args.rendezvous_ttl_s:g}", f"--join_grace_s={join_grace_s:g}", "--",
            *args.train_flags.split(), *args.extra, f"--model_dir={model_dir}"]


def run_host_trial(args, seed, model_dir, log_path, cluster):
    """One agent per host namespace; at the seed's step the seed's host loses every process (``host``), or the last
    host's agent starts (``join``: the job started without it); the agents alive then must finish."""
    join = args.failure == "join"
    victim, at_step = (args.workers - 1, victim_and_step(args, seed)[1]) if join else victim_and_step(args, seed)
    job = f"{os.path.basename(args.output_dir.rstrip('/'))}-{seed}-{int(time.time())}"
    procs = {}

    def start(index):
        log = open(f"{log_path}.host{index}", "wb")
        # Joining: the first group starts once --min_workers registered (no wait for the host that comes later).
        command = agent_command(args, model_dir, cluster, job, index, join_grace_s=0 if join else 120)
        procs[index] = subprocess.Popen(command, cwd=REPO, env=_env(), stdout=log, stderr=subprocess.STDOUT,
                                        start_new_session=True)

    signalled_at, signalled_step = None, None
    try:
        for index in range(args.workers):
            if not (join and index == victim):
                start(index)
        deadline = time.time() + args.trial_timeout_s
        while time.time() < deadline:
            running = [p for i, p in procs.items() if join or i != victim]
            if signalled_at is not None and not any(p.poll() is None for p in running):
                break
            if signalled_at is None:
                if all(p.poll() is not None for p in running):
                    break  # ended before the step came
                steps = [r["step"] for r in read_history(model_dir) if r["kind"] == "train"]
                if steps and max(steps) >= at_step:
                    if join:
                        start(victim)
                    else:
                        cluster.kill_host(victim)
                    signalled_at, signalled_step = time.time(), max(steps)
            time.sleep(0.2)
        survivors = [p for i, p in procs.items() if join or i != victim]
        timed_out = any(p.poll() is None for p in survivors)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    codes = [p.returncode for p in survivors]
    exit_code = None if timed_out else next((c for c in codes if c), 0)
    return outcome(seed, victim, at_step, signalled_step, signalled_at, model_dir, exit_code, timed_out)


def audit(args, trial, log_path):
    """tfgpu.audit_input over each recorded topology change (or the final topology from the start): the worst
    counts of records fed twice and never."""
    changes = [(t["before"]["num_workers"], t["after"]["num_workers"], t["step"]) for t in trial["topologies"]]
    if not changes:  # restarted before the first checkpoint, or on the same topology: one plain audit
        workers = trial["restarts"][-1]["workers_after"] if trial["restarts"] else args.workers
        changes = [(workers, workers, 0)]
    worst = {"duplicated": 0, "missing": 0}
    for before, after, step in changes:
        out = log_path + f".audit-{step}.json"
        command = [sys.executable, "-m", "tfgpu.audit_input", *args.train_flags.split(), *args.extra,
                   f"--num_workers={after}", f"--previous_num_workers={before}", f"--resume_from_step={step}",
                   "--epochs=1", f"--output_json={out}"]
        done = subprocess.run(command, cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=600)
        try:
            with open(out) as f:
                epochs = json.load(f)["epochs"]
        except (OSError, ValueError, KeyError):
            raise RuntimeError(f"audit failed (exit {done.returncode}): {done.stdout[-2000:]}") from None
        for key in worst:
            worst[key] = max(worst[key], max(e[key] for e in epochs))
    return worst


def baseline(args):
    model_dir = os.path.join(args.output_dir, "baseline")
    accuracy = final_accuracy(model_dir)
    if accuracy is None:
        log = model_dir + ".log"
        started = time.time()
        with open(log, "wb") as f:
            subprocess.run(launch_command(args, model_dir), cwd=REPO, env=_env(), stdout=f, stderr=subprocess.STDOUT,
                           timeout=args.trial_timeout_s)
        accuracy = final_accuracy(model_dir)
        print(f"baseline (uninterrupted, {args.workers} workers): val_accuracy={accuracy} in "
              f"{time.time() - started:.0f} s", flush=True)
    return accuracy


def summary(values):
    values = [v for v in values if v is not None]
    if not values:
        return "n/a"
    return f"median {statistics.median(values):g}, max {max(values):g} (n={len(values)})"


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    os.makedirs(args.output_dir, exist_ok=True)
    reference = baseline(args)
    if args.failure in ("host", "join"):  # a SIGTERM (e.g. `timeout`) still removes the namespaces and etcd
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    cluster = HostCluster(args) if args.failure in ("host", "join") else None
    try:
        return run_trials(args, reference, cluster)
    finally:
        if cluster is not None:
            cluster.close()


def run_trials(args, reference, cluster) -> int:
    trials = []
    for seed in range(args.first_seed, args.first_seed + args.trials):
        model_dir = os.path.join(args.output_dir, f"{args.failure}-{seed}")
        log_path = model_dir + ".log"
        if os.path.exists(model_dir):
            raise SystemExit(f"error: --output_dir: {model_dir} exists; use a new --output_dir or another "
                             "--first_seed")
        started = time.time()
        if cluster is not None:
            trial = run_host_trial(args, seed, model_dir, log_path, cluster)
        else:
            trial = run_trial(args, seed, model_dir, log_path)
        trial["audit"] = audit(args, trial, log_path) if trial["exit_code"] == 0 else None
        trial["wall_s"] = round(time.time() - started, 1)
        restart = trial["restarts"][0] if trial["restarts"] else {}
        trial["steps_lost"] = restart.get("steps_lost")
        trial["stopped_after_progress_s"] = restart.get("stopped_after_progress_s")
        accuracy = trial["val_accuracy"]
        changed = restart if args.failure != "join" else [
            (t["before"]["num_workers"], t["after"]["num_workers"]) for t in trial["topologies"]] == [
            (args.workers - 1, args.workers)]
        trial["ok"] = bool(trial["exit_code"] == 0 and trial["audit"] and not any(trial["audit"].values())
                           and changed and accuracy is not None and reference is not None
                           and abs(accuracy - reference) <= args.accuracy_tolerance)
        trials.append(trial)
        sizes = [(t["before"]["num_workers"], t["after"]["num_workers"], t["step"]) for t in trial["topologies"]]
        print(f"trial {seed}: {args.failure} {'host' if cluster else 'worker'} {trial['victim']} at step "
              f"{trial['signalled_step']} -> exit "
              f"{trial['exit_code']}, {restart.get('workers_before')} -> {restart.get('workers_after')} workers, "
              f"topology changes (before, after, step) {sizes}, resumed at {restart.get('step')}, "
              f"steps lost {trial['steps_lost']}, recovery {trial['recovery_s']} s, "
              f"stopped {trial['stopped_after_progress_s']} s after the last progress, audit {trial['audit']}, "
              f"val_accuracy {accuracy} (baseline {reference}), {trial['wall_s']} s: "
              f"{'ok' if trial['ok'] else 'FAILED'}", flush=True)
        with open(os.path.join(args.output_dir, f"trials-{args.failure}.json"), "w") as f:
            json.dump({"baseline_val_accuracy": reference, "trials": trials}, f, indent=2)
    print(f"{args.failure}: {sum(t['ok'] for t in trials)}/{len(trials)} trials ok; recovery s "
          f"{summary([t['recovery_s'] for t in trials])}; steps lost {summary([t['steps_lost'] for t in trials])}; "
          f"stopped after last progress s {summary([t['stopped_after_progress_s'] for t in trials])}; "
          f"|val_accuracy - baseline| "
          f"{summary([abs(t['val_accuracy'] - reference) for t in trials if t['val_accuracy'] is not None])}")
    return 0 if all(t["ok"] for t in trials) else 2


if __name__ == "__main__":
    sys.exit(main())
