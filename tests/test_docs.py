"""The guides' commands run as written: every block of README.md and docs/from-model-fit.md marked runnable.

The marker is an HTML comment (invisible on GitHub) on the line right before a fenced block:

    <!-- runnable -->             run the block: a ```python block with `python`, any other with `bash -e`
    <!-- runnable fast -->        also in the default suite (keep these to seconds: one tiny script)
    <!-- runnable file=NAME -->   write the block to NAME for the blocks after it; not run by itself
    <!-- runnable timeout=S -->   the block's bound in seconds (default 300)

Options combine (``<!-- runnable fast timeout=60 -->``). A document's blocks run in their order in one temporary
directory (a file block feeds the commands after it), on CPU, with ``python`` this interpreter, this checkout's
tfgpu first on PYTHONPATH and a private data cache; a block that exits non-zero or outlives its bound fails the
test with the document's line and the block's last output. A block that cannot run here (real GPUs, several
hosts, a real Slurm, ``pip install``) is left unmarked, which the reader sees in the source, and the page says so.

The default suite runs the ``fast`` blocks (after writing the file blocks); ``-m slow`` runs every block.
"""
import os
import re
import signal
import subprocess
import sys

import pytest

from tests.conftest import REPO

DOCS = ("README.md", "docs/from-model-fit.md")
MARKER = re.compile(r"^<!--\s*runnable(?P<options>[^>]*?)\s*-->\n```(?P<lang>[\w-]*)\n(?P<body>.*?)^```\s*$",
                    re.M | re.S)
ANY_MARKER = re.compile(r"^<!--\s*runnable", re.M)
OPTION = re.compile(r"^(fast|file=[\w.-]+|timeout=\d+)$")
DEFAULT_TIMEOUT_S = 300
# Variables that would put a block in another job than the page says (a stray cluster, a replica count).
CLEARED = ("TF_CONFIG", "TFGPU_CPU_REPLICAS", "SLURM_JOB_ID", "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS", "SLURM_NPROCS",
           "CUDA_VISIBLE_DEVICES")


class Block:
    """One marked block: where it is, what it is and how it runs."""

    def __init__(self, doc, line, lang, body, options):
        self.doc, self.line, self.lang, self.body = doc, line, lang, body
        self.options = options.split()
        self.fast = "fast" in self.options
        self.file = next((o[5:] for o in self.options if o.startswith("file=")), None)
        self.timeout = next((int(o[8:]) for o in self.options if o.startswith("timeout=")), DEFAULT_TIMEOUT_S)

    def __repr__(self):
        return f"{self.doc}:{self.line}"


def blocks_of(doc, text=None):
    """The marked blocks of ``doc`` (a path under the repository, or ``text`` given), in order."""
    text = open(os.path.join(REPO, doc), encoding="utf-8").read() if text is None else text
    return [Block(doc, text.count("\n", 0, m.start()) + 2, m.group("lang"), m.group("body"), m.group("options"))
            for m in MARKER.finditer(text)]


def run_blocks(blocks, workdir, data_cache, only_fast=False):
    """Writes every file block into ``workdir`` and runs the others (only the fast ones with ``only_fast``) in order;
    AssertionError naming the block when one fails or times out. Returns (block, output) of each block that ran."""
    env = {k: v for k, v in os.environ.items() if k not in CLEARED}
    env.update(PATH=os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""),
               PYTHONPATH=os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p),
               TFGPU_DATA_CACHE=data_cache, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    outputs = []
    for i, block in enumerate(blocks):
        if block.file:
            with open(os.path.join(workdir, block.file), "w", encoding="utf-8") as f:
                f.write(block.body)
            continue
        if only_fast and not block.fast:
            continue
        script = os.path.join(workdir, f".block{i}.{'py' if block.lang == 'python' else 'sh'}")
        with open(script, "w", encoding="utf-8") as f:
            f.write(block.body)
        command = [sys.executable, script] if block.lang == "python" else ["bash", "-e", script]
        outputs.append((block, _run(block, command, workdir, env)))
    return outputs


def _run(block, command, workdir, env):
    proc = subprocess.Popen(command, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)  # its own group: a timeout ends the launcher's workers
    try:
        output, _ = proc.communicate(timeout=block.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        raise AssertionError(f"{block}: still running after {block.timeout} s:\n{output[-3000:]}") from None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if proc.returncode != 0:
        raise AssertionError(f"{block}: exited {proc.returncode}:\n{block.body}\n--- output ---\n{output[-3000:]}")
    return output


@pytest.mark.parametrize("doc", DOCS)
def test_every_marker_stands_right_before_a_block_and_has_known_options(doc):
    text = open(os.path.join(REPO, doc), encoding="utf-8").read()
    blocks = blocks_of(doc)
    assert len(blocks) == len(ANY_MARKER.findall(text)), f"{doc}: a runnable marker not right before a ``` fence"
    assert any(not b.file for b in blocks), f"{doc}: no runnable command"
    for block in blocks:
        assert all(OPTION.match(o) for o in block.options), f"{block}: unknown option in {block.options}"


def test_a_failing_block_fails_the_run_and_names_its_line(tmp_path, data_cache):
    text = "Intro.\n\n<!-- runnable file=ok.py -->\n```python\nprint('ok')\n```\n\n<!-- runnable -->\n```\n" \
           "python ok.py\nfalse\n```\n"
    blocks = blocks_of("fake.md", text)
    assert [b.line for b in blocks] == [4, 9] and blocks[0].file == "ok.py"
    with pytest.raises(AssertionError, match=r"fake.md:9: exited 1"):
        run_blocks(blocks, str(tmp_path), data_cache)


def test_the_fast_block_of_from_model_fit_trains_on_two_logical_replicas(tmp_path, data_cache):
    """The default suite's share: docs/from-model-fit.md's dry run on 2 logical GPUs (one TensorFlow start)."""
    blocks = blocks_of("docs/from-model-fit.md")
    assert any(b.fast for b in blocks)
    outputs = run_blocks(blocks, str(tmp_path), data_cache, only_fast=True)
    assert re.search(r"^replicas: 2 loss: ", "\n".join(out for _, out in outputs), re.M), outputs


@pytest.mark.slow
@pytest.mark.parametrize("doc", DOCS)
def test_every_runnable_block_runs(doc, tmp_path, data_cache):
    outputs = run_blocks(blocks_of(doc), str(tmp_path), data_cache)
    if doc == "docs/from-model-fit.md":  # each run of the ported convnet trains (not a resume of a finished run)
        runs = [out for block, out in outputs if "mnist_convnet.py" in block.body]
        assert len(runs) == 3, [block for block, _ in outputs]
        for out in runs:
            assert "Epoch 8/8" in out, out[-3000:]
            accuracy = float(re.search(r"Test accuracy: ([0-9.]+)", out).group(1))
            assert accuracy > 0.8, out[-3000:]
