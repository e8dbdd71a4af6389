"""tfgpu.runtime.launcher: each worker's share of the host's GPUs, the GPU listings it reads, exit-code rules."""
import json
import re

import hypothesis
import hypothesis.strategies as st
import pytest

from tfgpu.runtime import launcher

EIGHT = [str(i) for i in range(8)]


@pytest.mark.parametrize("workers, per_worker, devices, expected", [
    (2, -1, EIGHT, ["0,1,2,3", "4,5,6,7"]),
    (8, -1, EIGHT, EIGHT),
    (1, -1, ["3"], ["3"]),
    (3, 2, EIGHT, ["0,1", "2,3", "4,5"]),  # an explicit share may leave GPUs unused
    (2, 0, EIGHT, ["", ""]),  # CPU workers on a GPU host
    (2, -1, [], [None, None]),  # no GPU: the environment is left alone
    (2, -1, ["GPU-a1", "MIG-b2"], ["GPU-a1", "MIG-b2"]),
])
def test_gpu_split(workers, per_worker, devices, expected):
    assert launcher.gpu_sets(workers, per_worker, devices) == expected


@pytest.mark.parametrize("workers, per_worker, devices, message", [
    (3, -1, EIGHT, "--num_workers=3 does not divide the 8 GPUs visible (this host): pass --gpus_per_worker=K with "
                   "K x 3 <= 8, a --num_workers among 1,2,4,8, or --gpus_per_worker=0 for CPU workers"),
    (2, -1, ["0"], "--num_workers=2 does not divide the 1 GPUs"),
    (3, 3, EIGHT, "--gpus_per_worker=3 x --num_workers=3 needs 9 GPUs but 8 are visible"),
    (2, 1, [], "--gpus_per_worker=1 but no GPU is visible"),
])
def test_gpu_split_errors_name_the_flags(workers, per_worker, devices, message):
    with pytest.raises(launcher.LaunchError, match=re.escape(message)):
        launcher.gpu_sets(workers, per_worker, devices)


@hypothesis.settings(max_examples=200, deadline=None)
@hypothesis.given(num_gpus=st.integers(0, 16), workers=st.integers(1, 9), per_worker=st.integers(-1, 5))
def test_gpu_split_never_shares_a_gpu(num_gpus, workers, per_worker):
    devices = [f"GPU-{i}" for i in range(num_gpus)]
    try:
        sets = launcher.gpu_sets(workers, per_worker, devices)
    except launcher.LaunchError as e:
        assert "\n" not in str(e) and "--" in str(e)
        return
    assert len(sets) == workers
    if None in sets:  # nothing to split
        assert set(sets) == {None} and not devices and per_worker == -1
        return
    shares = [s.split(",") if s else [] for s in sets]
    used = [d for share in shares for d in share]
    assert len(used) == len(set(used)) and set(used) <= set(devices)  # disjoint, all real
    assert len({len(share) for share in shares}) == 1  # the same count each
    if per_worker == -1:
        assert len(used) == num_gpus  # the default split hands out every GPU


def test_visible_devices_and_nvidia_smi_listing():
    assert launcher.parse_visible_devices("0, 2,3") == ["0", "2", "3"]
    assert launcher.parse_visible_devices("1,-1,2") == ["1"]  # CUDA stops at the first invalid index
    assert launcher.parse_visible_devices("") == []
    with pytest.raises(launcher.LaunchError, match="lists GPU 1 twice"):
        launcher.parse_visible_devices("1,0,1")
    listing = ("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-11111111-2222)\n"
               "GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-33333333-4444)\n"
               "  MIG 3g.20gb     Device  0: (UUID: MIG-aaaa-bbbb)\n"
               "  MIG 3g.20gb     Device  1: (UUID: MIG-cccc-dddd)\n")
    assert launcher.parse_nvidia_smi_list(listing) == ["0", "MIG-aaaa-bbbb", "MIG-cccc-dddd"]
    assert launcher.host_gpus({"CUDA_VISIBLE_DEVICES": "4,5"}) == (["4", "5"], "CUDA_VISIBLE_DEVICES=4,5")


def test_exit_code_rules():
    assert launcher.exit_code(-9) == 137 and launcher.exit_code(3) == 3
    assert launcher.worst_exit_code([0, 0]) == 0
    assert launcher.worst_exit_code([143, 0]) == 143
    assert launcher.worst_exit_code([143, 137, 1]) == 137
    configs = [json.loads(c) for c in launcher.tf_configs("localhost", [1, 2])]
    assert configs[1] == {"cluster": {"worker": ["localhost:1", "localhost:2"]}, "task": {"type": "worker", "index": 1}}


def test_group_sizes_must_divide_the_workers_global_batch():
    import argparse

    from tfgpu.launch import train_batches

    args = argparse.Namespace(module=None, python="python")
    fits = launcher.batch_rule(train_batches(args, ["--flagfile=configs/quickstart.flags", "--global_batch_size=48",
                                                    "--model_dir=/tmp/r"]), None)
    assert [n for n in range(1, 7) if fits(n)] == [1, 2, 3, 4, 6]
    two_gpus = launcher.batch_rule(train_batches(args, ["--dataset=digits", "--global_batch_size=36",
                                                        "--model_dir=/tmp/r"]), "0,1")
    assert [n for n in range(1, 7) if two_gpus(n)] == [1, 2, 3, 6]  # 2 replicas per worker: 4 x 2 does not divide 36
    assert train_batches(args, ["python", "my_script.py"]) is None  # another program: any size
    assert train_batches(args, ["--no_such_flag=1"]) is None  # the workers will name the flag
    assert launcher.batch_rule(None, None)(7)
