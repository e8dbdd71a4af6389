"""The same loop under MultiWorkerMirroredStrategy: two worker processes on localhost with TF_CONFIG."""
import json
import os
import re
import subprocess
import sys

import portpicker

from tests.conftest import REPO, read_history, read_metrics


def _start_workers(args, data_cache, num_workers=2):
    ports = [portpicker.pick_unused_port() for _ in range(num_workers)]
    cluster = {"worker": [f"localhost:{p}" for p in ports]}
    procs = []
    for index in range(num_workers):
        tf_config = {"cluster": cluster, "task": {"type": "worker", "index": index}}
        env = {**os.environ, "TF_CONFIG": json.dumps(tf_config), "TFGPU_DATA_CACHE": data_cache,
               "TF_CPP_MIN_LOG_LEVEL": "2"}
        procs.append(subprocess.Popen([sys.executable, "-m", "tfgpu.train", *args], cwd=REPO, env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    return procs


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
