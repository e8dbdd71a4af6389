"""An emulated host's share of this machine's cores: disjoint core sets, one per host, and TensorFlow's thread
pools sized to the share, so a worker given one core runs as it would on a one-core host.

A process is put on its share between fork and exec (``sched_setaffinity``, what ``taskset`` does): every thread
and child it starts stays there, and TensorFlow sizes its default pools from the affinity too. The pools are also
named in the environment (``TF_NUM_INTRAOP_THREADS``, ``TF_NUM_INTEROP_THREADS``), so a setting inherited from the
caller cannot give a one-core host two cores' worth of threads. ``tfgpu.bench.netem`` runs each emulated worker on
its share; ``tfgpu.plan`` runs its single-replica measurement and the all-reduce probe's workers on the same
shares, so the figures it predicts from are those of the hosts it validates on. Nothing is made that outlives the
processes (no cgroup), so there is nothing to clean up.
"""
import os

THREAD_VARIABLES = ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")


def usable(available=None) -> list:
    """The cores this process may run on (sorted), or ``available`` sorted."""
    return sorted(os.sched_getaffinity(0) if available is None else available)


def fitting(cores_per_host: int, available=None) -> int:
    """How many hosts of ``cores_per_host`` cores fit in the usable cores."""
    return len(usable(available)) // max(1, cores_per_host)


def shares(num_hosts: int, cores_per_host: int, available=None) -> list:
    """Disjoint core sets (tuples), one per host: host i gets cores [i·k, (i+1)·k) of the usable ones.
    ValueError when they do not fit."""
    cores = usable(available)
    if cores_per_host < 1:
        raise ValueError(f"a host needs at least one core, got {cores_per_host}")
    if num_hosts * cores_per_host > len(cores):
        raise ValueError(f"{num_hosts} hosts of {cores_per_host} core(s) need {num_hosts * cores_per_host} cores; "
                         f"this process may use {len(cores)} ({','.join(map(str, cores))})")
    return [tuple(cores[i * cores_per_host:(i + 1) * cores_per_host]) for i in range(num_hosts)]


def env(share) -> dict:
    """The environment that sizes TensorFlow's intra- and inter-op pools to ``share`` ({} for no share)."""
    return {name: str(len(share)) for name in THREAD_VARIABLES} if share else {}


def pin(share):
    """A ``preexec_fn`` that puts the child on ``share`` (None for no share: the child keeps the caller's cores)."""
    if not share:
        return None
    cores = set(share)

    def setup():
        os.sched_setaffinity(0, cores)

    return setup


def describe(share_list) -> str:
    """``core 0 | core 1`` or ``cores 0,1 | cores 2,3``: the shares as a reader checks them."""
    return " | ".join(f"core{'s' if len(s) > 1 else ''} {','.join(map(str, s))}" for s in share_list)
