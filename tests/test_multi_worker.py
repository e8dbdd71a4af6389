"""The same loop under MultiWorkerMirroredStrategy: two worker processes on localhost with TF_CONFIG."""
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import portpicker
import pytest

from tests.conftest import REPO, checkpoint_weights, read_history, read_metrics


def _worker(args, data_cache, cluster, index):
    tf_config = {"cluster": cluster, "task": {"type": "worker", "index": index}}
    env = {**os.environ, "TF_CONFIG": json.dumps(tf_config), "TFGPU_DATA_CACHE": data_cache,
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    return subprocess.Popen([sys.executable, "-m", "tfgpu.train", *args], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _start_workers(args, data_cache, num_workers=2, cluster=None):
    cluster = cluster or {"worker": [f"localhost:{portpicker.pick_unused_port()}" for _ in range(num_workers)]}
    return [_worker(args, data_cache, cluster, index) for index in range(num_workers)]


def _finish(procs, timeout=240):
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=timeout)[0])
    finally:
        for proc in procs:
            proc.kill()
    return outputs


def test_two_workers_train_agree_and_only_the_chief_writes(tmp_path, data_cache):
    model_dir = tmp_path / "run"
    args = ["--dataset=digits", "--model=small_cnn", "--global_batch_size=64", "--train_steps=8",
            "--steps_per_loop=4", "--checkpoint_every_steps=4", "--verbose=2", f"--model_dir={model_dir}"]
    outputs = _finish(_start_workers(args, data_cache))
    for index, output in enumerate(outputs):
        assert "strategy=multi_worker_mirrored replicas=2 workers=2" in output, output[-3000:]
        assert "final: step=8" in output, output[-3000:]
    losses = [re.search(r"final: .*train_loss=(\S+)", out).group(1) for out in outputs]
    assert losses[0] == losses[1]  # the all-reduced loss is the same number on both workers
    history = read_history(model_dir)
    assert [r["step"] for r in history] == [4, 8] and history[-1]["loss"] < history[0]["loss"] + 0.5
    assert read_metrics(model_dir)["num_workers"] == 2
    assert sorted(f for f in os.listdir(model_dir / "checkpoints") if f.endswith(".index")) == \
        ["ckpt-4.index", "ckpt-8.index"]
    assert read_history(model_dir, "eval")[-1]["val_examples"] == 359


LONG = ["--dataset=digits", "--model=small_cnn", "--global_batch_size=64", "--train_steps=60", "--steps_per_loop=5",
        "--checkpoint_every_steps=10", "--deterministic", "--eval_split=none", "--verbose=2",
        "--collective_timeout_s=20"]


def _wait_for_history(model_dir, procs, lines=3, timeout=120):
    history = model_dir / "history.jsonl"
    deadline = time.time() + timeout
    while not (history.exists() and history.read_text().count("\n") >= lines):
        assert all(p.poll() is None for p in procs) and time.time() < deadline, "run ended too early"
        time.sleep(0.05)


def _weights(model_dir):
    return checkpoint_weights(model_dir)


@pytest.fixture(scope="module")
def straight(tmp_path_factory, data_cache):
    """An uninterrupted 2-worker run of LONG: the weights a resumed run must end with."""
    model_dir = tmp_path_factory.mktemp("straight")
    outputs = _finish(_start_workers(LONG + [f"--model_dir={model_dir}"], data_cache))
    assert all("final: step=60" in out for out in outputs), outputs[0][-2000:]
    return model_dir


def test_worker_death_stops_the_survivor_and_a_relaunch_resumes_exactly(straight, tmp_path, data_cache):
    model_dir = tmp_path / "crashed"
    procs = _start_workers(LONG + [f"--model_dir={model_dir}"], data_cache)
    try:
        _wait_for_history(model_dir, procs, lines=3)  # past the step-10 checkpoint
        procs[1].kill()
        started = time.time()
        survivor = procs[0].communicate(timeout=90)[0]
        assert time.time() - started < 60, "the surviving worker hung"
    finally:
        for p in procs:
            p.kill()
    assert procs[0].returncode == 129, survivor[-3000:]
    assert "error: worker 0: a collective failed" in survivor and "rerun the same launch" in survivor

    outputs = _finish(_start_workers(LONG + [f"--model_dir={model_dir}"], data_cache))
    assert all("final: step=60" in out for out in outputs), outputs[0][-2000:]
    assert re.search(r"resuming at step (10|20|30|40|50)", outputs[0])
    expected, resumed = _weights(straight), _weights(model_dir)
    for name in expected:
        np.testing.assert_array_equal(resumed[name], expected[name], err_msg=name)


def test_max_restarts_lets_the_survivor_wait_for_a_replaced_worker(straight, tmp_path, data_cache):
    """Like a cluster that restarts a lost pod: the survivor re-executes itself, the replacement joins, and
    the job finishes with the weights of an uninterrupted run."""
    cluster = {"worker": [f"localhost:{portpicker.pick_unused_port()}" for _ in range(2)]}
    model_dir = tmp_path / "healed"
    args = LONG + ["--max_restarts=1", f"--model_dir={model_dir}"]
    procs = _start_workers(args, data_cache, cluster=cluster)
    try:
        _wait_for_history(model_dir, procs, lines=3)
        procs[1].kill()
        procs[1].wait()
        replacement = _worker(args, data_cache, cluster, 1)
        procs.append(replacement)
        survivor, replaced = procs[0].communicate(timeout=180)[0], replacement.communicate(timeout=180)[0]
    finally:
        for p in procs:
            p.kill()
    assert procs[0].returncode == 0 and replacement.returncode == 0, survivor[-3000:]
    assert "restarting this worker (1 of --max_restarts=1)" in survivor
    assert "final: step=60" in survivor and "final: step=60" in replaced
    expected, healed = _weights(straight), _weights(model_dir)
    for name in expected:
        np.testing.assert_array_equal(healed[name], expected[name], err_msg=name)


def test_sigterm_to_one_worker_checkpoints_all_at_the_same_step(tmp_path, data_cache):
    model_dir = tmp_path / "run"
    procs = _start_workers(LONG + ["--train_steps=400", f"--model_dir={model_dir}"], data_cache)
    try:
        _wait_for_history(model_dir, procs, lines=2)
        procs[1].send_signal(signal.SIGTERM)
        outputs = [p.communicate(timeout=90)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [143, 143], outputs[0][-2000:] + outputs[1][-2000:]
    steps = {re.search(r"checkpoint saved at step (\d+)", out).group(1) for out in outputs}
    assert len(steps) == 1
    assert os.path.exists(model_dir / "checkpoints" / f"ckpt-{steps.pop()}.index")


def test_two_workers_through_the_launcher_match_mirrored_two_replicas(run_train, tmp_path, data_cache):
    """Same global batches either way: one shard read element-sharded by 2 workers (0,2,4.. and 1,3,5..) or by
    one pipeline feeding 2 replicas (0..31 and 32..63), unshuffled; BatchNorm synchronized.
    Tolerance: 1e-4 on per-loop losses, 1e-4 absolute + 1e-4 relative on every variable (small_cnn: see
    tests/test_trainer.py::test_mirrored_two_replicas_matches_one_device for why not a deeper net)."""
    from tfgpu.data import builtin, tfrecord

    data = builtin.load_builtin("digits")
    images, labels = data["splits"]["train"]
    one_shard = tmp_path / "digits-one-shard"
    split = tfrecord.write_arrays(str(one_shard), "train", images, labels, num_shards=1)
    tfrecord.write_manifest(str(one_shard), {"classes": data["classes"], "splits": {"train": split},
                                             "image_shape": {"height": 8, "width": 8, "channels": 1}})
    common = [f"--data_dir={one_shard}", "--model=small_cnn", "--global_batch_size=64", "--train_steps=8",
              "--steps_per_loop=4", "--shuffle_buffer=1", "--sync_batch_norm", "--deterministic", "--verbose=2"]
    run_train(*common, "--cpu_logical_devices=2", "--distribution_strategy=mirrored",
              f"--model_dir={tmp_path / 'mirrored'}")
    env = {**os.environ, "TFGPU_DATA_CACHE": data_cache, "TF_CPP_MIN_LOG_LEVEL": "2"}
    launch = subprocess.run([sys.executable, "-m", "tfgpu.launch", "--num_workers=2", "--", *common,
                             f"--model_dir={tmp_path / 'workers'}"], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    assert launch.returncode == 0, launch.stdout[-3000:]
    assert read_metrics(tmp_path / "workers")["strategy"] == "multi_worker_mirrored"
    mirrored, workers = read_history(tmp_path / "mirrored"), read_history(tmp_path / "workers")
    np.testing.assert_allclose([r["loss"] for r in workers], [r["loss"] for r in mirrored], atol=1e-4)
    expected, actual = _weights(tmp_path / "mirrored"), _weights(tmp_path / "workers")
    assert expected.keys() == actual.keys()
    for name in expected:
        np.testing.assert_allclose(actual[name], expected[name], rtol=1e-4, atol=1e-4, err_msg=name)


def test_port_in_use_is_a_clear_error_not_a_hang(tmp_path, data_cache):
    import socket

    with socket.socket() as busy:
        busy.bind(("localhost", 0))
        busy.listen()
        cluster = {"worker": [f"localhost:{busy.getsockname()[1]}", f"localhost:{portpicker.pick_unused_port()}"]}
        proc = _worker(["--dataset=digits", "--model=small_cnn", "--train_steps=2", f"--model_dir={tmp_path}"],
                       data_cache, cluster, 0)
        output = _finish([proc], timeout=120)[0]
    assert proc.returncode == 1, output[-2000:]
    assert f"error: --cluster: this worker cannot serve on {cluster['worker'][0]}" in output
