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
