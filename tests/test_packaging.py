"""The installed package, not the checkout: a wheel built from the repository holds the recipes, and the
installed tfgpu lists and reads them from any directory (slow: builds a wheel)."""
import os
import subprocess
import sys
import zipfile

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow


def test_a_wheel_ships_the_recipes_and_the_installed_package_reads_them_anywhere(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", REPO, "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path / "dist")], check=True, timeout=300)
    wheel = next((tmp_path / "dist").glob("tfgpu-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    shipped = sorted(n for n in names if n.startswith("tfgpu/recipes/"))
    assert "tfgpu/recipes/quickstart.flags" in shipped
    assert len(shipped) == len([f for f in os.listdir(os.path.join(REPO, "configs")) if f.endswith(".flags")])
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(tmp_path / "site"),
                    str(wheel)], check=True, timeout=300)
    (tmp_path / "elsewhere").mkdir()
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    listed = subprocess.run([sys.executable, "-m", "tfgpu.train", "--list_recipes"], cwd=tmp_path / "elsewhere",
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    assert listed.returncode == 0 and "quickstart " in listed.stdout, listed.stdout
    where = subprocess.run([sys.executable, "-c", "import tfgpu; print(tfgpu.__file__)"], cwd=tmp_path / "elsewhere",
                           env=env, stdout=subprocess.PIPE, text=True, check=True)
    assert where.stdout.startswith(str(tmp_path / "site"))  # the wheel's copy, not the checkout's
    bad = subprocess.run([sys.executable, "-m", "tfgpu.train", "--recipe=quickstart", "--model_dir=run",
                          "--epochs=-1"], cwd=tmp_path / "elsewhere", env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, timeout=120)
    assert bad.returncode == 1 and bad.stdout.strip() == \
        "error: --epochs: must be positive when --train_steps is 0, got -1.0"
