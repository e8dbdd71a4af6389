"""A run on a file system TensorFlow provides rather than the local disk: convert, train, resume, evaluate, export
and report, all on ``ram://`` (TensorFlow's in-memory file system, standing in for ``gs://``), and a scheme the
installed TensorFlow lacks refused in one line naming the flag.

``ram://`` lives in one process, so every command runs in this process (its ``main``), not as a subprocess.
"""
import json
import os
import uuid

import numpy as np
import pytest

from tfgpu.runtime import fileio, run_dir


@pytest.fixture
def ram_root():
    """A fresh ``ram://`` directory, removed afterwards (ram:// outlives a test inside the pytest process)."""
    root = f"ram://tfgpu-test-{uuid.uuid4().hex[:8]}"
    yield root
    fileio.rmtree(root)


def _tiny_digits(path, per_split=(40, 20)):
    """A .npz of a few dozen real digits (8x8 grayscale, 10 classes) with train and val splits."""
    from tfgpu.data.sources.builtin import load_builtin

    splits = load_builtin("digits")["splits"]
    arrays = {}
    for (split, (images, labels)), n in zip(splits.items(), per_split):
        arrays[f"x_{split}"], arrays[f"y_{split}"] = images[:n, ..., 0], labels[:n]
    np.savez(path, **arrays)
    return str(path)


def _json(path):
    return json.loads(fileio.read_bytes(path))


@pytest.mark.slow
def test_convert_train_resume_evaluate_export_report_on_ram(tmp_path, ram_root, train_here, capsys, monkeypatch):
    import keras

    from tfgpu import evaluate, export, report
    from tfgpu.data.conversion import convert

    monkeypatch.chdir(tmp_path)  # anything written through os with a "ram://" path would land here as ./ram:
    source = _tiny_digits(tmp_path / "digits.npz")
    data_dir, model_dir = f"{ram_root}/data", f"{ram_root}/run"
    convert.convert(convert.Options(source=source, output_dir=data_dir, num_shards="2"))
    manifest = _json(f"{data_dir}/dataset.json")
    assert {s: e["num_examples"] for s, e in manifest["splits"].items()} == {"train": 40, "val": 20}
    shards = [s["file"] for e in manifest["splits"].values() for s in e["shards"]]
    assert all(fileio.exists(f"{data_dir}/{name}") for name in shards)
    convert.convert(convert.Options(source=source, output_dir=data_dir, num_shards="2"))  # a rerun reuses them
    assert "reusing 4 complete, verified shard(s)" in capsys.readouterr().err

    run = [f"--data_dir={data_dir}", f"--model_dir={model_dir}", "--model=small_cnn", "--global_batch_size=8",
           "--steps_per_loop=2", "--checkpoint_every_steps=2", "--input_range=0,1"]
    train_here(*run, "--train_steps=2")
    assert fileio.exists(run_dir.checkpoint(model_dir, 2) + ".index")
    resumed = train_here(*run, "--train_steps=4")
    assert "resuming at step 2" in resumed.output
    history = [json.loads(line) for line in fileio.read_text(f"{model_dir}/history.jsonl").splitlines()]
    assert [r["step"] for r in history if r["kind"] == "train"] == [2, 4]
    assert _json(f"{model_dir}/metrics.json")["step"] == 4
    assert "model: small_cnn" in fileio.read_text(f"{model_dir}/config.yaml")

    capsys.readouterr()
    assert evaluate.main([f"--model_dir={model_dir}"]) == 0
    assert _json(f"{model_dir}/eval-val-step4.json")["val_examples"] == 20

    output = f"{model_dir}/exported/model.keras"
    assert export.main([f"--model_dir={model_dir}", f"--output={output}"]) == 0
    assert _json(f"{model_dir}/exported/model.input.json")["bare"]["input"]["range"] == [0.0, 1.0]
    local = tmp_path / "model.keras"
    local.write_bytes(fileio.read_bytes(output))
    batch = np.random.default_rng(0).uniform(0, 1, (3, 8, 8, 1)).astype(np.float32)
    assert keras.saving.load_model(str(local)).predict(batch, verbose=0).shape == (3, 10)
    assert fileio.exists(f"{model_dir}/export/model.keras")  # the training run's own export

    fileio.remove(f"{model_dir}/report.md")
    monkeypatch.delenv("TFGPU_REPORT_PLOTS")  # the regenerated report with its plots, as a user gets it
    assert report.main([f"--model_dir={model_dir}"]) == 0
    text = fileio.read_text(f"{model_dir}/report.md")
    assert "small_cnn" in text and "plots/" in text
    assert any(name.endswith(".png") for name in fileio.listdir(f"{model_dir}/plots"))
    assert sorted(os.listdir(tmp_path)) == ["digits.npz", "model.keras"]


def test_an_unavailable_scheme_fails_in_one_line_naming_the_flag(tmp_path, train_here, capsys):
    from tfgpu import evaluate, report
    from tfgpu.data.conversion import convert

    result = train_here("--dataset=digits", "--model_dir=s3://bucket/run", check=False)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.returncode == 1 and len(lines) == 1
    assert lines[0].startswith("error: --model_dir") and "s3://" in lines[0] and "tensorflow-io" in lines[0]

    result = train_here("--data_dir=hdfs://cluster/data", f"--model_dir={tmp_path}", check=False)
    assert result.returncode == 1 and result.output.startswith("error: --data_dir") and "hdfs://" in result.output
    for main, args, flag in ((evaluate.main, ["--model_dir=s3://bucket/run"], "--model_dir"),
                             (report.main, ["--model_dir=nosuchfs://x/run"], "--model_dir")):
        capsys.readouterr()
        assert main(args) == 1
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"error: {flag}") and "\n" not in err and "plugin" in err
    with pytest.raises(convert.ConfigError, match="output_dir.*nosuchfs://"):
        convert.check_options(convert.Options(source="digits", output_dir="nosuchfs://x/out"))
