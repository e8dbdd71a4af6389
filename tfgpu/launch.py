"""Entrypoint: ``python -m tfgpu.launch --num_workers=N [--gpus_per_worker=G] [launcher flags] -- <train flags>``.

Starts N MultiWorkerMirroredStrategy workers on this host (``python -m tfgpu.train <train flags>``
each, or the command after ``--`` when it starts with a program, e.g. ``-- python script.py`` for a
tfgpu.fit script), with free localhost ports, its own TF_CONFIG and its own share of the host's GPUs in
CUDA_VISIBLE_DEVICES), prefixes their output with ``[worker i]``, and supervises them:

- all exit 0 → exit 0;
- one exits non-zero → the others get SIGTERM, then SIGKILL after ``--stop_grace_s``, and
  the launcher exits with that worker's code and prints its last lines;
- SIGINT/SIGTERM to the launcher → forwarded to every worker as SIGTERM (so they can save
  a checkpoint and exit 143), SIGKILL after the grace period; the exit code is the worst
  worker code (a failure beats 143, 143 beats 0);
- a worker whose heartbeat (``runtime/heartbeat.py``: the trainer replaces it after every loop) shows no
  progress for ``--worker_timeout_s`` (or has not started training within ``--startup_timeout_s``) has hung:
  it is killed, the others stopped the same way, and the launcher exits 124;
- ``--max_restarts=K`` (with ``--min_workers=M``): after a failure a restart could help (a worker killed by a
  signal, hung, lost a peer or preempted: codes >= 128; never 1-127, which would fail again) a new group is
  started with a fresh TF_CONFIG and ports, on the same slots, less the cause's when it was killed or hung
  (``--reuse_failed_slots`` keeps it), as many as divide the global batch and at least M; it resumes from the
  newest checkpoint, exactly, on its topology. One line and a ``restart`` record in history.jsonl per restart;
  after K restarts, or below M workers, the job ends with the last failure's code.

Across hosts, ``--rendezvous=etcd://HOST:PORT/JOB`` makes this process one host's agent (``runtime/agent.py``):
the hosts agree on each group through etcd (``runtime/rendezvous.py``), a lost host or a host that joins re-forms
the group on the hosts alive, and --num_workers/--min_workers count the whole job's workers.

Workers run in their own process groups and die with the launcher (PR_SET_PDEATHSIG).
"""
import sys

from tfgpu.runtime.launcher import LaunchError, worker_command
from tfgpu.runtime.rendezvous import RendezvousError
from tfgpu.runtime.supervisor import Launcher
from tfgpu.runtime import failures

USAGE = ("python -m tfgpu.launch --num_workers=N [--gpus_per_worker=G] [--cpu_cores_per_worker=K] "
         "[launcher flags] -- <train flags>")


def _parser():
    from tfgpu import cli

    p = cli.ArgumentParser(prog="python -m tfgpu.launch", usage=USAGE,
                           description="Start N MultiWorkerMirroredStrategy workers (python -m tfgpu.train <train "
                                       "flags> each) on this host and supervise them.")
    p.add_argument("--num_workers", type=int, required=True, help="Worker processes to start on this host.")
    p.add_argument("--gpus_per_worker", type=int, default=-1,
                   help="GPUs each worker gets, as its own CUDA_VISIBLE_DEVICES, taken in order from the launcher's "
                        "CUDA_VISIBLE_DEVICES (else every GPU of the host); -1 = an even split (an error when "
                        "--num_workers does not divide the GPUs); 0 = no GPU (CPU workers).")
    p.add_argument("--cpu_cores_per_worker", type=int, default=0,
                   help="Pin worker i to cores [i*K, (i+1)*K) of the cores this launcher may use; 0 = no pinning.")
    p.add_argument("--worker_timeout_s", type=float, default=0.0,
                   help="A worker that shows no progress (its heartbeat: one per loop of --steps_per_loop steps, "
                        "evaluations and saves included) for this long has hung: it is killed and the group "
                        "stopped (restarted with --max_restarts, else exit 124); 0 = never.")
    p.add_argument("--startup_timeout_s", type=float, default=0.0,
                   help="How long a worker may take to finish its first loop (imports, restore, tracing) before "
                        "it counts as hung; 0 = --worker_timeout_s.")
    p.add_argument("--max_restarts", type=int, default=0,
                   help="Start a new worker group after a failure, up to this many times: it resumes from the "
                        "newest checkpoint; 0 = the first failure ends the job.")
    p.add_argument("--min_workers", type=int, default=0,
                   help="The fewest workers a restarted group may have (a killed or hung worker's slot is left "
                        "out); 0 = --num_workers (no shrinking).")
    p.add_argument("--reuse_failed_slots", action="store_true",
                   help="Restart on every slot, the failed worker's too (by default a slot whose worker was killed "
                        "or hung is left out of the next group).")
    p.add_argument("--stop_grace_s", type=float, default=30.0,
                   help="After SIGTERM, seconds a worker gets to save and exit before SIGKILL.")
    p.add_argument("--python", default=sys.executable, help="Python interpreter for the workers.")
    p.add_argument("--module", default=None, help="Module each worker runs with `python -m` (default tfgpu.train; "
                   "without --module, worker args that start with a program, e.g. `-- python script.py`, are run "
                   "as given).")
    p.add_argument("--host", default="localhost", help="Address the workers use to reach each other (with "
                   "--rendezvous: this host's address as the other hosts reach it).")
    p.add_argument("--rendezvous", default="",
                   help="etcd://HOST:PORT/JOB_ID: run as this host's agent of a job across hosts (one agent per "
                        "host, same value everywhere); --num_workers and --min_workers then count the whole job's "
                        "workers, --workers_per_host this host's. Behind TLS: "
                        "?protocol=https&cacert=CA.pem&cert=CERT.pem&key=KEY.pem[&user=NAME] (or TFGPU_ETCD_CACERT, "
                        "TFGPU_ETCD_CERT, TFGPU_ETCD_KEY, TFGPU_ETCD_USER; the password only in TFGPU_ETCD_PASSWORD "
                        "or TFGPU_ETCD_PASSWORD_FILE). See docs/healing.md, 'Across hosts' and 'Security'.")
    p.add_argument("--workers_per_host", type=int, default=1, help="With --rendezvous: workers this host starts.")
    p.add_argument("--rendezvous_ttl_s", type=float, default=5.0,
                   help="With --rendezvous: seconds after which a host whose agent stopped renewing its etcd lease "
                        "counts as lost.")
    p.add_argument("--join_grace_s", type=float, default=10.0,
                   help="With --rendezvous: once --min_workers have registered, how long the first group waits for "
                        "more hosts (it starts at once when --num_workers have).")
    p.add_argument("--rendezvous_timeout_s", type=float, default=600.0,
                   help="With --rendezvous: how long an agent waits for a group that includes it.")
    return p


def split_argv(argv):
    """(launcher args, worker args): everything after the first ``--`` goes to the workers unchanged."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def parse_args(argv):
    """Launcher flags → namespace; raises ConfigError (bad syntax) or LaunchError (bad value) naming the flag."""
    args = _parser().parse_args(argv)
    if args.num_workers < 1:
        raise LaunchError(f"--num_workers must be at least 1, got {args.num_workers}")
    if args.gpus_per_worker < -1:
        raise LaunchError(f"--gpus_per_worker must be -1 (even split), 0 (no GPU) or positive, got "
                          f"{args.gpus_per_worker}")
    if args.cpu_cores_per_worker < 0:
        raise LaunchError(f"--cpu_cores_per_worker must be >= 0, got {args.cpu_cores_per_worker}")
    if args.worker_timeout_s < 0 or args.stop_grace_s < 0 or args.startup_timeout_s < 0:
        raise LaunchError("--worker_timeout_s, --startup_timeout_s and --stop_grace_s must be >= 0")
    if args.max_restarts < 0:
        raise LaunchError(f"--max_restarts must be >= 0, got {args.max_restarts}")
    if not 0 <= args.min_workers <= args.num_workers:
        raise LaunchError(f"--min_workers={args.min_workers} must be between 1 and --num_workers={args.num_workers}")
    args.min_workers = args.min_workers or args.num_workers
    if args.rendezvous:
        from tfgpu.runtime import rendezvous

        try:
            rendezvous.parse_endpoint(args.rendezvous)
        except ValueError as e:
            raise LaunchError(str(e)) from None
        if not rendezvous.records.NAME.fullmatch(args.host):
            raise LaunchError(f"--host={args.host!r}: with --rendezvous, a host name or IP address (letters, digits, "
                              "'.', '-', ':', '%', '[', ']'; at most 200)")
        if args.workers_per_host < 1 or args.num_workers % args.workers_per_host:
            raise LaunchError(f"--workers_per_host={args.workers_per_host} must be at least 1 and divide "
                              f"--num_workers={args.num_workers} (the job's most workers)")
        if min(args.rendezvous_ttl_s, args.rendezvous_timeout_s) <= 0 or args.join_grace_s < 0:
            raise LaunchError("--rendezvous_ttl_s and --rendezvous_timeout_s must be > 0, --join_grace_s >= 0")
    return args


def train_batches(args, worker_args):
    """(global batch, eval batch, CPU logical devices) of the workers' tfgpu.train flags, read without TensorFlow,
    for the group sizes a restart may take (``launcher.batch_rule``); None for another program, a remote
    --config/--flagfile (reading it would load TensorFlow) or flags that do not parse (the workers then say what
    is wrong)."""
    if worker_command(args, worker_args)[1:3] != ["-m", "tfgpu.train"] or any(
            "://" in a for a in worker_args if a.startswith(("--config", "--flagfile"))):
        return None
    from tfgpu import cli

    try:
        parser = cli.ArgumentParser(prog="tfgpu.train")
        parser.add_config_flags(config_file=True)
        namespace = parser.parse_args(list(worker_args))
        config = cli.resolve(namespace, namespace.config, references=False)
    except Exception:  # noqa: BLE001 - the workers report their own flag errors
        return None
    return config.global_batch_size, config.eval_batch_size or config.global_batch_size, config.cpu_logical_devices


def make_launcher(args, worker_args):
    """The one-host Launcher, or this host's agent of a job across hosts (--rendezvous)."""
    batches = train_batches(args, worker_args)
    if not args.rendezvous:
        return Launcher(args, worker_args, train_batches=batches)
    from tfgpu.runtime import agent, rendezvous

    endpoint = rendezvous.parse(args.rendezvous)
    rdzv = rendezvous.Rendezvous(endpoint, endpoint.job, agent.host_id(args.host), args.host, args.workers_per_host,
                                 ttl_s=args.rendezvous_ttl_s)
    return agent.HostAgent(args, worker_args, rdzv, train_batches=batches)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    launcher_argv, worker_argv = split_argv(argv)
    from tfgpu import cli

    if cli.wants_help(launcher_argv):
        print(_parser().format_help())
        return 0
    try:
        args = parse_args(launcher_argv)
        launcher = make_launcher(args, worker_argv)
        return launcher.run()
    except (LaunchError, cli.ConfigError, RendezvousError) as e:
        print(f"error: {e}", file=sys.stderr)
        return failures.BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
