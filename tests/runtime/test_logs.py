"""tfgpu.runtime.logs: TensorFlow's native start-up lines are held back unless the import fails or they are asked
for (file descriptor 2 is what they write to, so the test runs in a subprocess)."""
import subprocess
import sys

import pytest

from tests.conftest import REPO

CHILD = """
import os, sys
from tfgpu.runtime import logs
show, fail = sys.argv[1] == "show", sys.argv[2] == "fail"
print("before", file=sys.stderr, flush=True)
try:
    with logs.quiet_native_startup(show=show):
        os.write(2, b"I0000 native start-up line\\n")
        print("python line", file=sys.stderr)
        if fail:
            raise ImportError("broken install")
except ImportError as e:
    print(f"raised: {e}", file=sys.stderr)
print("after", file=sys.stderr, flush=True)
"""


@pytest.mark.parametrize("show, fail, shown", [
    ("quiet", "ok", ["before", "after"]),
    ("show", "ok", ["before", "I0000 native start-up line", "python line", "after"]),
    ("quiet", "fail", ["before", "I0000 native start-up line", "python line", "raised: broken install", "after"]),
])
def test_native_start_up_lines_are_held_back_unless_shown_or_the_import_fails(show, fail, shown):
    proc = subprocess.run([sys.executable, "-c", CHILD, show, fail], cwd=REPO, stderr=subprocess.PIPE, text=True,
                          timeout=60)
    assert proc.stderr.splitlines() == shown
