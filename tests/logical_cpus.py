"""One TensorFlow import for the test scripts that need logical CPU devices. Each such script used to start its own
Python, whose ``import tensorflow`` alone is the most of its time (13 s of CPU on this 2-core host); logical devices
can only be set before TensorFlow's runtime starts, so one process imports TensorFlow, Keras and tfgpu once and
forks a child per script, in which the script sets up its devices and runs as in a Python of its own (its own
runtime, collectives and patches; nothing it does reaches the next script).

A script is a test module's ``SCRIPT`` (the modules named in ``SCRIPTS``), run with ``sys.argv[1]`` a directory of
its own; it prints its results last as ``RESULT <json>`` or ``RESULTS <json>``. One script's failure is its own: its
tests fail with its output and traceback, the other scripts' tests do not.

    python -m tests.logical_cpus DIRECTORY   # prints one ``PART <module> <json>`` line per script
"""
import contextlib
import fcntl
import importlib
import io
import json
import os
import subprocess
import sys
import traceback

SCRIPTS = ("tests.runtime.test_keras_variables", "tests.runtime.test_allreduce_dtype",
           "tests.training.fit.test_batch_norm", "tests.training.test_replica_local",
           "tests.runtime.test_replica_batches")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def results(tmp_path_factory, module: str) -> dict:
    """``module``'s script's results. The scripts run once per test session: under pytest-xdist the first worker to
    ask runs them all and the other reads what it wrote (a lock file in the session's shared temporary directory)."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # shared by this session's xdist workers
    done = root / "logical_cpus.json"
    with open(root / "logical_cpus.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            directory = root / "logical_cpus"
            directory.mkdir(exist_ok=True)
            temporary = root / "logical_cpus.json.tmp"
            temporary.write_text(json.dumps(_run_all(directory)))
            temporary.rename(done)
    part = json.loads(done.read_text())[module]
    assert "results" in part, f"{module}'s script failed:\n{part['failed']}"
    return part["results"]


def _run_all(directory) -> dict:
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "TF_CPP_MIN_LOG_LEVEL": "2", "TFGPU_NO_JOB_STRATEGY": "1", "CUDA_VISIBLE_DEVICES": ""}
    env.pop("TF_CONFIG", None)
    proc = subprocess.run([sys.executable, "-m", "tests.logical_cpus", str(directory)], cwd=directory, env=env,
                          capture_output=True, text=True, timeout=900)
    parts = {line.split(" ", 2)[1]: json.loads(line.split(" ", 2)[2])
             for line in proc.stdout.splitlines() if line.startswith("PART ")}
    whole = f"exit {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return {module: parts.get(module, {"failed": whole}) for module in SCRIPTS}


def _run_one(module: str, directory: str) -> dict:
    """Runs ``module``'s SCRIPT in this (forked) process; its results or its failure."""
    source = importlib.import_module(module).SCRIPT
    output = io.StringIO()
    sys.argv = [module, os.path.join(directory, module.rsplit(".", 1)[1])]
    try:
        with contextlib.redirect_stdout(output):
            exec(compile(source, module + ".SCRIPT", "exec"), {"__name__": "__main__"})
    except BaseException:  # SystemExit too: the script's failure is its own tests' failure
        return {"failed": output.getvalue()[-3000:] + "\n" + traceback.format_exc()}
    lines = [line.split(" ", 1)[1] for line in output.getvalue().splitlines()
             if line.startswith(("RESULT ", "RESULTS "))]
    if not lines:
        return {"failed": output.getvalue()[-3000:] + "\nno RESULT line"}
    return {"results": json.loads(lines[-1])}


def _forked(module: str, directory: str) -> dict:
    """``_run_one`` in a child of this process (TensorFlow imported, its runtime not started)."""
    answer = os.path.join(directory, module + ".json")
    pid = os.fork()
    if pid == 0:
        try:
            with open(answer, "w") as f:
                json.dump(_run_one(module, directory), f)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    if not os.path.exists(answer):
        return {"failed": f"the script's process ended ({status}) without an answer"}
    with open(answer) as f:
        return json.load(f)


def main(directory: str) -> None:
    import keras  # noqa: F401 (with TensorFlow: the start-up every child shares)
    import tensorflow  # noqa: F401

    import tfgpu  # noqa: F401

    for module in SCRIPTS:
        importlib.import_module(module)
    for module in SCRIPTS:
        print(f"PART {module} {json.dumps(_forked(module, directory))}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
