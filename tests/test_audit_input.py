"""tfgpu.audit_input: every worker's real training pipeline, read and counted per epoch."""
import json

import numpy as np
import pytest

from tfgpu import audit_input
from tfgpu import convert as convert_cli


@pytest.fixture(scope="module")
def four_shards(tmp_path_factory):
    """A dataset converted by tfgpu.convert into 4 train shards (31 records; every image is stored twice, so
    identical records must not count as duplicates)."""
    root = tmp_path_factory.mktemp("audit")
    images = np.random.default_rng(0).integers(0, 256, (16, 4, 4, 3), dtype=np.uint8)
    np.savez(root / "arrays.npz", x=np.concatenate([images, images])[:31], y=np.arange(31) % 3)
    assert convert_cli.main([f"--source={root / 'arrays.npz'}", f"--output_dir={root / 'data'}",
                             "--num_shards=4"]) == 0
    return str(root / "data")


def _audit(tmp_path, *args):
    out = tmp_path / "audit.json"
    code = audit_input.main([*args, f"--output_json={out}"])
    return code, json.loads(out.read_text())


@pytest.mark.parametrize("workers", [1, 2, 3, 4, 5])
def test_a_converted_folder_of_4_shards_is_read_exactly_once_by_1_to_5_workers(four_shards, tmp_path, workers):
    code, result = _audit(tmp_path, f"--data_dir={four_shards}", f"--num_workers={workers}",
                          "--global_batch_size=5" if workers == 5 else f"--global_batch_size={2 * workers}",
                          "--epochs=2", "--seed=3")
    assert code == 0 and result["records"] == 31 and len(result["epochs"]) == 2
    for epoch in result["epochs"]:
        assert (epoch["missing"], epoch["duplicated"]) == (0, 0)
        assert epoch["seen_once"] == 31 - 31 % workers and epoch["left_out"] == 31 % workers


@pytest.mark.parametrize("workers,replicas", [(3, 2), (5, 1)])
def test_digits_is_read_exactly_once_by_uneven_worker_counts(data_cache, tmp_path, workers, replicas):
    code, result = _audit(tmp_path, "--dataset=digits", f"--data_cache_dir={data_cache}",
                          f"--num_workers={workers}", f"--replicas_per_worker={replicas}",
                          f"--global_batch_size={8 * workers * replicas}", "--flagfile=configs/quickstart.flags",
                          "--epochs=1")
    assert code == 0 and result["records"] == 1438
    assert result["epochs"] == [{"epoch": 1, "seen_once": 1438 - 1438 % workers, "missing": 0, "duplicated": 0,
                                 "left_out": 1438 % workers}]


def test_a_bad_flag_is_one_line_and_exit_1(capsys):
    assert audit_input.main(["--dataset=digits", "--num_workers=0"]) == 1
    assert capsys.readouterr().err.strip() == "error: --num_workers: must be >= 1, got 0"
    assert audit_input.main(["--dataset=digits", "--num_workers=2", "--global_batch_size=3"]) == 1
    assert "--global_batch_size: 3 is not divisible by the 2 replicas" in capsys.readouterr().err


@pytest.mark.parametrize("args, flag", [
    (["--previous_global_batch_size=25", "--global_batch_size=24", "--replicas_per_worker=2"],
     "previous_global_batch_size"),
    (["--previous_replicas_per_worker=5", "--global_batch_size=24"], "previous_replicas_per_worker"),
    (["--previous_num_workers=5", "--global_batch_size=24"], "previous_num_workers"),
])
def test_an_interrupted_run_s_batch_that_does_not_fit_its_replicas_names_the_previous_flag(four_shards, capsys, args,
                                                                                          flag):
    """--global_batch_size=24 fits this run's replicas: it was blamed for the interrupted run's 25 (issue 37)."""
    assert audit_input.main([f"--data_dir={four_shards}", "--resume_from_step=2", *args]) == 1
    said = capsys.readouterr().err.strip()
    assert said.startswith(f"error: --{flag}: the interrupted run's global batch ") and "\n" not in said, said
    assert "is not divisible by the" in said


@pytest.mark.parametrize("before,after", [(2, 1), pytest.param(1, 2, marks=pytest.mark.slow), (2, 3),
                                           pytest.param(2, 2, marks=pytest.mark.slow)])
def test_a_resume_on_another_number_of_workers_feeds_each_record_once(four_shards, tmp_path, before, after):
    """Interrupted at step 2 (12 of 31 records fed), resumed on ``after`` workers: the interrupted epoch holds
    every record once (the 31 % after records left out of the rest: fewer than the workers), so does the next."""
    code, result = _audit(tmp_path, f"--data_dir={four_shards}", f"--num_workers={after}", "--global_batch_size=6",
                          f"--previous_num_workers={before}", "--resume_from_step=2", "--epochs=1", "--seed=3")
    assert code == 0 and result["interrupted_epoch"]["records_consumed_before"] == 12
    interrupted, following = result["epochs"]
    assert (interrupted["epoch"], following["epoch"]) == (1, 2)
    for epoch in result["epochs"]:
        assert (epoch["missing"], epoch["duplicated"]) == (0, 0)
        assert epoch["seen_once"] + epoch["left_out"] == 31 and epoch["left_out"] < after


@pytest.mark.slow  # by default: the same rows on a converted folder of 4 shards, above
@pytest.mark.parametrize("before,after,replicas", [(2, 1, 2), (1, 2, 1), (2, 3, 1)])
def test_digits_resumed_on_another_topology_reads_0_twice_and_0_never(data_cache, tmp_path, before, after, replicas):
    """The issue's table (step 30 of a 59.9-step epoch at global batch 24): 352 records fed twice and 374 never
    for 2 -> 1 workers before the data position was kept in records."""
    code, result = _audit(tmp_path, "--dataset=digits", f"--data_cache_dir={data_cache}", f"--num_workers={after}",
                          f"--replicas_per_worker={replicas}", f"--previous_num_workers={before}",
                          "--resume_from_step=30", "--global_batch_size=24", "--epochs=1")
    assert code == 0 and result["interrupted_epoch"] == {
        "epoch": 1, "records_consumed_before": 720, "records_fed_after_per_worker": (1438 - 720) // after}
    assert [(e["missing"], e["duplicated"], e["left_out"]) for e in result["epochs"]] == [
        (0, 0, (1438 - 720) % after), (0, 0, 1438 % after)]


@pytest.mark.parametrize("workers,before,shuffle_buffer", [(1, 1, 10000), (3, 2, 8)])
def test_the_index_audit_computes_the_keys_the_real_pipelines_read(four_shards, workers, before, shuffle_buffer):
    """audit_input's default reads no record: each worker's keys come from the epochs' orders (data.index.order). They
    must be the keys the real pipelines read, in order, across an epoch boundary and a resume on another topology."""
    from tfgpu.config import Config, DatasetConfig
    from tfgpu.data import catalog
    from tfgpu.data.index import position, resume
    from tfgpu.tasks.registry import input_config

    config = Config(model_dir="unused", data_dir=four_shards, global_batch_size=6, seed=3,
                    shuffle_buffer=shuffle_buffer)
    info = catalog.prepare(DatasetConfig.of(config))
    inputs = input_config(config)
    recorded = position.from_step(2, position.Topology(before, 1, 6, 1), 31)
    plan = resume.plan_resume(inputs, info, workers, 2, recorded)
    records = 31 // workers + 12
    computed = audit_input.index_keys(inputs, info, workers, records, plan)
    read = audit_input.read_keys(config, info, workers, 1, records, 2, plan)
    for worker in range(workers):
        assert computed[worker].tolist() == read[worker].tolist(), f"worker {worker}"


def test_the_audit_reads_no_record_unless_asked(four_shards, tmp_path, monkeypatch):
    real, calls = audit_input.read_keys, []
    monkeypatch.setattr(audit_input, "read_keys", lambda *a, **k: calls.append(1) or real(*a, **k))
    code, result = _audit(tmp_path, f"--data_dir={four_shards}", "--num_workers=2", "--global_batch_size=4")
    assert code == 0 and not calls and result["read_records"] is False
    assert result["epochs"][0]["missing"] == result["epochs"][0]["duplicated"] == 0
    code, result = _audit(tmp_path, f"--data_dir={four_shards}", "--num_workers=2", "--global_batch_size=4",
                          "--read_records")
    assert code == 0 and calls and result["read_records"] is True
