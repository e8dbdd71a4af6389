"""Slurm's compressed notations, read as Slurm writes them (the job-level cases are in test_cluster)."""
import pytest

from tfgpu.runtime import slurm


def test_expand_hostlist():
    assert slurm.expand_hostlist("node[01-02,05],gpu3") == ["node01", "node02", "node05", "gpu3"]
    assert slurm.expand_hostlist("n[8-10]") == ["n8", "n9", "n10"]
    assert slurm.expand_hostlist("rack[1-2]-n[1-2]") == ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]


def test_expand_tasks_per_node():
    assert slurm.expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    with pytest.raises(ValueError, match="malformed at 'x2'"):
        slurm.expand_tasks_per_node("2,x2")


def test_port_base_comes_from_the_job_id_or_the_override():
    assert slurm.slurm_port_base({"SLURM_JOB_ID": "17"}) == 12000 + 17 * 10
    assert slurm.slurm_port_base({"SLURM_JOB_ID": "17", "TFGPU_SLURM_PORT_BASE": "20000"}) == 20000
    with pytest.raises(ValueError, match="TFGPU_SLURM_PORT_BASE"):
        slurm.slurm_port_base({"SLURM_JOB_ID": "17", "TFGPU_SLURM_PORT_BASE": "80"})
