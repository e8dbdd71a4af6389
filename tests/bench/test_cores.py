"""tfgpu.bench.cores: each emulated host gets its own cores, TensorFlow's pools are sized to them, and a child put
on a share runs there; netem's workers take equal shares."""
import os
import subprocess
import sys

import pytest

from tfgpu.bench import cores, netem


def test_hosts_get_disjoint_shares_in_order():
    assert cores.shares(2, 1, available={3, 1}) == [(1,), (3,)]
    assert cores.shares(2, 2, available=range(5)) == [(0, 1), (2, 3)]
    assert cores.fitting(2, available=range(5)) == 2
    assert cores.describe([(0,), (2, 3)]) == "core 0 | cores 2,3"


def test_more_hosts_than_cores_is_one_line():
    with pytest.raises(ValueError, match=r"3 hosts of 1 core\(s\) need 3 cores; this process may use 2 \(0,1\)"):
        cores.shares(3, 1, available=[0, 1])


def test_thread_pools_match_the_share():
    assert cores.env((4, 5)) == {"TF_NUM_INTRAOP_THREADS": "2", "TF_NUM_INTEROP_THREADS": "2"}
    assert cores.env(None) == {} and cores.pin(None) is None


def test_netem_workers_take_equal_shares_or_none_when_cores_are_short():
    assert netem.worker_shares(2, available=range(4)) == [(0, 1), (2, 3)]
    assert netem.worker_shares(3, available=range(2)) == [None, None, None]  # auto: no share of a core
    assert netem.worker_shares(2, 0, available=range(4)) == [None, None]
    with pytest.raises(netem.ClusterError, match="--cores_per_worker: 2 hosts of 2 core"):
        netem.worker_shares(2, 2, available=range(2))


def test_a_child_put_on_a_share_runs_there_with_pools_of_its_size():
    share = cores.shares(1, 1)[0]
    show = "import os; print(sorted(os.sched_getaffinity(0)), os.environ['TF_NUM_INTRAOP_THREADS'])"
    out = subprocess.run([sys.executable, "-c", show], env={**os.environ, **cores.env(share)},
                         preexec_fn=cores.pin(share), stdout=subprocess.PIPE, text=True, check=True).stdout
    assert out.strip() == f"{list(share)} 1"
