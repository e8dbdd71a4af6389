"""Real Keras scripts as tests (issue 46, item 5): the corpus in ``corpus/`` ported to tfgpu by two edits.

Each script in ``corpus/`` is a plain Keras 3 script after one keras-io example (its header names it), ending
with one ``CORPUS_RESULT <json>`` line (``corpus/corpus_report.py``) and stating a module-level ``TOLERANCE``: which
History or after-fit value a ported run must match and how closely. A script is ported by exactly the two edits a
user makes (``port``): ``import tfgpu`` as its first statement and ``X.fit(`` -> ``tfgpu.fit(X, ``. Each script
runs three ways, every one a child process in its own temporary directory with a bounded timeout:

- ``plain``: ``python script.py``; it must end with a falling loss and a sane after-fit report;
- ``ported``: ``python ported.py`` on one device; it must land within TOLERANCE of plain Keras, and its after-fit
  report must have plain Keras' keys, shapes, counts and flags (its numbers finite);
- ``ported_2_workers``: ``python -m tfgpu.launch --num_workers=2 -- python ported.py``; both workers must report,
  with equal weight digests (one model), each within TOLERANCE of plain Keras, after-fit as above;
- ``ported_2_replicas``: ``TFGPU_CPU_REPLICAS=2 python ported.py``, the dry run of a host of 2 GPUs (a
  MirroredStrategy over 2 logical CPUs); within TOLERANCE of plain Keras, after-fit as above.

The plain run of a script is made once per session (``plain_results``) and shared by its three cases. The whole
matrix is ``slow`` (``pytest -m slow``): a case is a Keras start-up and training, about a minute on a loaded 2-core
host (``ported_2_workers`` two more start-ups). What it proves is in the default suite more cheaply, in-process or in
one subprocess: tfgpu.fit against model.fit on one device (tests/training/fit/test_arrays.py, test_datasets.py,
test_inputs.py); on 2 workers, tests/training/fit/test_run.py::
test_two_workers_train_one_model_and_the_scripts_objects_work_after_fit (one model on both workers, within a
hundredth of one device's, History, a callback's batches, a metric and evaluate after fit); on 2 replicas against one
device, with a script's own train_step, class weights and stop_training, tests/training/fit/test_mirrored.py; a
script under ``TFGPU_CPU_REPLICAS=2``, tests/runtime/test_job_strategy.py::
test_cpu_replicas_dry_run_the_gpu_path_on_logical_cpus. (Issue 54: the three quickest scripts' ``ported_2_workers``
and the convnet's ``ported_2_replicas``, 1-1.6 min each of the default suite's 2 cores, were default before.)
"""
import ast
import functools
import json
import math
import os
import re
import signal
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
SCRIPTS = sorted(f[:-3] for f in os.listdir(CORPUS) if f.endswith(".py") and f != "corpus_report.py")
WAYS = ("plain", "ported", "ported_2_workers", "ported_2_replicas")
RESULT = "CORPUS_RESULT "
TIMEOUT_S = {"plain": 300, "ported": 300, "ported_2_workers": 600, "ported_2_replicas": 400}

FIT_CALL = re.compile(r"(\w+)\.fit\(")


def port(source: str) -> str:
    """``source`` ported by the two edits: ``import tfgpu`` inserted as the first statement (after a module
    docstring and ``from __future__`` imports, which must come first) and every ``X.fit(`` made
    ``tfgpu.fit(X, ``. Raises ValueError unless exactly one fit call was rewritten: a script with none is not a
    fit script, one with several is not a two-edit port."""
    ported, count = FIT_CALL.subn(r"tfgpu.fit(\1, ", source)
    if count != 1:
        raise ValueError(f"port: expected exactly one `X.fit(` call, found {count}")
    lines = ported.splitlines(keepends=True)
    after = 0  # lines before the insertion point
    for node in ast.parse(ported).body:
        docstring = (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                     and isinstance(node.value.value, str) and after == 0)
        future = isinstance(node, ast.ImportFrom) and node.module == "__future__"
        if not (docstring or future):
            break
        after = node.end_lineno
    if after and not lines[after - 1].endswith("\n"):
        lines[after - 1] += "\n"
    return "".join(lines[:after] + ["import tfgpu\n"] + lines[after:])


def tolerances(path):
    """The script's TOLERANCE as a list of {"key", "abs" or "rel"} dicts, read from its source without running
    it."""
    for node in ast.parse(open(path).read()).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["TOLERANCE"]:
            value = ast.literal_eval(node.value)
            return value if isinstance(value, list) else [value]
    raise AssertionError(f"{path} has no module-level TOLERANCE")


def run(command, cwd, timeout, extra_env=None):
    """(exit code, stdout+stderr) of ``command`` in ``cwd``; the child runs in its own process group, which is
    terminated (SIGTERM, then SIGKILL) on a timeout or any other way out, so nothing it started outlives the
    test (tfgpu.launch's workers also die with the launcher)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([CORPUS, REPO]), "TF_CPP_MIN_LOG_LEVEL": "2",
           "PYTHONUNBUFFERED": "1", **(extra_env or {})}
    proc = subprocess.Popen(command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
        return proc.returncode, output
    except subprocess.TimeoutExpired:
        _stop(proc)
        output, _ = proc.communicate()
        raise AssertionError(f"{' '.join(command)} did not end within {timeout} s:\n{output[-4000:]}") from None
    finally:
        _stop(proc)


@functools.lru_cache(maxsize=1)
def onednn_loses_an_empty_batch() -> bool:
    """Whether this host's TensorFlow returns a Conv2D's input unchanged for an empty batch ("Incompatible shapes:
    [0,32,32,3] vs. [1,1,1,16]"): seen with oneDNN's kernels on a Xeon with AVX512_BF16/AMX, not on others. On two
    workers Keras' own ``predict`` of one image (a script's after-fit check) hands worker 1 an empty batch, so
    there the 2-worker runs use TensorFlow's own kernels (TF_ENABLE_ONEDNN_OPTS=0, docs/multi-node.md)."""
    import tensorflow as tf

    empty = tf.zeros([0, 8, 8, 3])
    return tuple(tf.nn.conv2d(empty, tf.zeros([3, 3, 3, 4]), strides=2, padding="SAME").shape) != (0, 4, 4, 4)


def _stop(proc):
    """Ends ``proc``'s process group if anything of it is still running."""
    for sig, wait_s in ((signal.SIGTERM, 15), (signal.SIGKILL, 15)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return


def results_in(output, prefix=""):
    """Every ``CORPUS_RESULT`` json in ``output`` after ``prefix``, as {prefix match: dict}."""
    found = {}
    for line in output.splitlines():
        match = re.match(prefix + re.escape(RESULT) + r"(.*)$", line)
        if match:
            key = match.group(1) if match.groups()[:-1] else ""
            assert key not in found, f"more than one CORPUS_RESULT line for {key or 'the script'}"
            found[key] = json.loads(match.groups()[-1])
    return found


def run_way(name, way, workdir):
    """The CORPUS_RESULT dicts of ``name`` run ``way`` in ``workdir``: one for plain and ported, one per worker
    (worker index order) for ported_2_workers. A run that fails or prints no result fails the test with its
    output's last lines."""
    os.makedirs(workdir, exist_ok=True)
    source = open(os.path.join(CORPUS, name + ".py")).read()
    script = os.path.join(workdir, f"{name}.py" if way == "plain" else f"{name}_ported.py")
    with open(script, "w") as f:
        f.write(source if way == "plain" else port(source))
    extra_env = {}
    if way == "ported_2_workers":
        command = [sys.executable, "-m", "tfgpu.launch", "--num_workers=2", "--", sys.executable, script]
        if onednn_loses_an_empty_batch():
            extra_env["TF_ENABLE_ONEDNN_OPTS"] = "0"
    elif way == "ported_2_replicas":
        command = [sys.executable, script]
        extra_env["TFGPU_CPU_REPLICAS"] = "2"
        if onednn_loses_an_empty_batch():
            extra_env["TF_ENABLE_ONEDNN_OPTS"] = "0"
    else:
        command = [sys.executable, script]
    code, output = run(command, workdir, TIMEOUT_S[way], extra_env)
    tail = "\n".join(output.splitlines()[-40:])
    assert code == 0, f"{name} ({way}) exited {code}:\n{tail}"
    if way == "ported_2_workers":
        found = results_in(output, prefix=r"\[worker (\d+)\] ")
        assert sorted(found) == ["0", "1"], f"{name} ({way}): CORPUS_RESULT from workers {sorted(found)}:\n{tail}"
        return [found["0"], found["1"]]
    found = results_in(output)
    assert list(found) == [""], f"{name} ({way}) printed no CORPUS_RESULT line:\n{tail}"
    return [found[""]]


@pytest.fixture(scope="session")
def plain_results(tmp_path_factory):
    """name -> the plain-Keras CORPUS_RESULT of that script, run once per session on first use."""
    cache = {}
    root = tmp_path_factory.mktemp("corpus-plain")

    def get(name):
        if name not in cache:
            cache[name] = run_way(name, "plain", str(root / name))[0]
        return cache[name]

    return get


def value_of(result, key):
    """The TOLERANCE key's value in a result: from after_fit when it is there, else from history."""
    for part in ("after_fit", "history"):
        if key in result[part]:
            value = result[part][key]
            assert isinstance(value, (int, float)) and math.isfinite(value), f"{key}={value!r} is not a finite number"
            return float(value)
    raise AssertionError(f"TOLERANCE key {key!r} is in neither after_fit {sorted(result['after_fit'])} nor history "
                         f"{sorted(result['history'])}")


def within(tolerance, plain, ported, replicas=1):
    """None when ``ported`` is within ``tolerance`` of ``plain``, else the one line saying by how much not. A key
    marked ``"replica_share": True`` is a loss the script's ``train_step`` computes by calling a Keras ``Loss``,
    which Keras divides by the replicas in sync under any strategy (``model.fit`` on a MirroredStrategy too): on
    ``replicas`` replicas it is compared times ``replicas``."""
    key = tolerance["key"]
    expected, got = value_of(plain, key), value_of(ported, key)
    if tolerance.get("replica_share"):
        got *= replicas
    if "abs" in tolerance:
        allowed = tolerance["abs"]
    else:
        allowed = tolerance["rel"] * abs(expected)
    if abs(got - expected) <= allowed:
        return None
    return f"{key}: ported {got:.6g}, plain Keras {expected:.6g}, off by {abs(got - expected):.4g} > {allowed:.4g}"


def check_after_fit(plain, ported, where=""):
    """``ported``'s after-fit report is plain Keras': the same keys (nested), equal shapes, counts, flags and
    names (ints, bools, strings and lists of them), and finite numbers where plain Keras has a float."""
    if isinstance(plain, dict):
        assert isinstance(ported, dict) and sorted(ported) == sorted(plain), \
            f"after_fit{where}: keys {sorted(ported) if isinstance(ported, dict) else ported!r}, " \
            f"plain Keras has {sorted(plain)}"
        for k in plain:
            check_after_fit(plain[k], ported[k], f"{where}[{k!r}]")
    elif isinstance(plain, float):
        assert isinstance(ported, (int, float)) and not isinstance(ported, bool) and math.isfinite(ported), \
            f"after_fit{where}: {ported!r} is not a finite number (plain Keras: {plain})"
    else:
        assert ported == plain, f"after_fit{where}: {ported!r}, plain Keras gave {plain!r}"


def check_plain(name, result):
    """A plain run's own sanity: it trained (a loss fell over the epochs) and said what its objects gave."""
    assert result["after_fit"], f"{name}: empty after_fit"
    check_after_fit(result["after_fit"], result["after_fit"])
    first, last = result["history_first"], result["history"]
    keys = ["loss"] if "loss" in last else [k for k in last if k.endswith("loss") and not k.startswith("val_")]
    assert keys, f"{name}: no training loss in History ({sorted(last)})"
    assert any(last[k] < first[k] for k in keys), \
        f"{name}: the loss did not fall: " + ", ".join(f"{k} {first[k]:.4g} -> {last[k]:.4g}" for k in keys)
    for tolerance in tolerances(os.path.join(CORPUS, name + ".py")):
        value_of(result, tolerance["key"])


def _cases():
    for name in SCRIPTS:
        for way in WAYS:
            yield pytest.param(name, way, id=f"{name}-{way}", marks=pytest.mark.slow)


@pytest.mark.parametrize("name,way", list(_cases()))
def test_corpus(name, way, plain_results, tmp_path):
    """``name`` run ``way``: plain Keras trains; a ported run matches plain Keras within the script's TOLERANCE,
    with its own objects working after fit; on 2 workers, both workers end with one model."""
    plain = plain_results(name)
    check_plain(name, plain)
    if way == "plain":
        return
    ported = run_way(name, way, str(tmp_path))
    problems = []
    for index, result in enumerate(ported):
        who = f"worker {index}" if way == "ported_2_workers" else "ported"
        check_after_fit(plain["after_fit"], result["after_fit"])
        assert sorted(result["history"]) == sorted(plain["history"]), \
            f"{who}: History keys {sorted(result['history'])}, plain Keras has {sorted(plain['history'])}"
        assert result["epochs"] == plain["epochs"], f"{who}: {result['epochs']} epochs, plain Keras {plain['epochs']}"
        replicas = 2 if way in ("ported_2_workers", "ported_2_replicas") else 1
        problems += [f"{who}: {p}" for p in (within(t, plain, result, replicas) for t in tolerances(
            os.path.join(CORPUS, name + ".py"))) if p]
    assert not problems, f"{name} ({way}) is not within TOLERANCE of plain Keras:\n" + "\n".join(problems)
    if way == "ported_2_workers":
        assert ported[0]["weights_sha256"] == ported[1]["weights_sha256"], \
            f"{name}: the workers ended with different models (weights sums {ported[0]['weights_sum']!r} and " \
            f"{ported[1]['weights_sum']!r})"


# --- port() itself, in this process ---

def test_port_inserts_import_first_and_rewrites_the_fit_call():
    source = "import keras\nmodel = keras.Sequential()\nhistory = model.fit(x, y, epochs=2)\n"
    assert port(source) == ("import tfgpu\nimport keras\nmodel = keras.Sequential()\n"
                            "history = tfgpu.fit(model, x, y, epochs=2)\n")


def test_port_keeps_the_docstring_and_future_imports_first():
    source = ('"""Doc.\n\nmore doc: model.fit is named here without a call.\n"""\n'
              "from __future__ import annotations\nfrom __future__ import division\n\n"
              "import keras\nvae.fit(\n    data,\n    epochs=3,\n)\n")
    ported = port(source)
    assert ported.startswith('"""Doc.\n\nmore doc: model.fit is named here without a call.\n"""\n'
                             "from __future__ import annotations\nfrom __future__ import division\n"
                             "import tfgpu\n\nimport keras\n")
    assert "tfgpu.fit(vae, \n    data," in ported
    compile(ported, "ported.py", "exec")


def test_port_leaves_other_calls_alone():
    source = "gan.compile()\nh = gan.fit(ds)\nfit(x)\nmodel.fit_generator\nnp.polyfit(a, b, 1)\n"
    assert port(source) == "import tfgpu\ngan.compile()\nh = tfgpu.fit(gan, ds)\nfit(x)\nmodel.fit_generator\n" \
                           "np.polyfit(a, b, 1)\n"


@pytest.mark.parametrize("source,count", [("model.evaluate(x)\n", 0), ("a.fit(x)\nb.fit(y)\n", 2)])
def test_port_refuses_anything_but_one_fit_call(source, count):
    with pytest.raises(ValueError, match=f"exactly one `X.fit\\(` call, found {count}"):
        port(source)


def test_a_replica_share_is_compared_times_the_replicas():
    plain, ported = {"history": {"d_loss": 0.5}, "after_fit": {}}, {"history": {"d_loss": 0.25}, "after_fit": {}}
    share = {"key": "d_loss", "abs": 0.01, "replica_share": True}
    assert within(share, plain, ported, replicas=2) is None
    assert within(share, plain, ported, replicas=1) is not None
    assert within({"key": "d_loss", "abs": 0.01}, plain, ported, replicas=2) is not None


def test_results_in_reads_one_line_per_worker():
    output = '[worker 1] CORPUS_RESULT {"a": 1}\nnoise\n[worker 0] CORPUS_RESULT {"a": 2}\n'
    assert results_in(output, prefix=r"\[worker (\d+)\] ") == {"1": {"a": 1}, "0": {"a": 2}}
    assert results_in('CORPUS_RESULT {"a": 3}\n') == {"": {"a": 3}}
    with pytest.raises(AssertionError, match="more than one"):
        results_in('CORPUS_RESULT {}\nCORPUS_RESULT {}\n')


def test_within_and_check_after_fit_fail_when_they_should():
    plain = {"history": {"loss": 1.0}, "after_fit": {"acc": 0.9, "shape": [8, 10], "ok": True}}
    assert within({"key": "loss", "rel": 0.2}, plain, {"history": {"loss": 1.19}, "after_fit": {}}) is None
    assert "off by" in within({"key": "loss", "rel": 0.2}, plain, {"history": {"loss": 1.21}, "after_fit": {}})
    assert "off by" in within({"key": "acc", "abs": 0.05}, plain, {"history": {}, "after_fit": {"acc": 0.84}})
    with pytest.raises(AssertionError, match="not a finite number"):
        within({"key": "loss", "rel": 0.2}, plain, {"history": {"loss": float("nan")}, "after_fit": {}})
    with pytest.raises(AssertionError, match="plain Keras gave"):
        check_after_fit(plain["after_fit"], {"acc": 0.5, "shape": [8, 9], "ok": True})
    with pytest.raises(AssertionError, match="keys"):
        check_after_fit(plain["after_fit"], {"acc": 0.5, "shape": [8, 10]})


# --- the corpus as written ---

@pytest.mark.parametrize("name", SCRIPTS)
def test_script_follows_the_corpus_rules(name):
    """Every script ports by the two edits (exactly one fit call), names the keras-io file it follows, seeds Keras,
    reports through corpus_report, downloads nothing, and states a tolerance of a known form."""
    path = os.path.join(CORPUS, name + ".py")
    source = open(path).read()
    ported = port(source)
    tree = ast.parse(ported)
    docstring = ast.get_docstring(tree)
    assert docstring and re.search(r"keras-io\s+(examples|guides)/[\w/]+\.py", docstring), \
        f"{name}: the header must name the keras-io file it follows"
    first = next(node for node in tree.body if not isinstance(node, ast.Expr))
    assert isinstance(first, ast.Import) and [a.name for a in first.names] == ["tfgpu"]
    assert "keras.utils.set_random_seed(0)" in source and "corpus_report.report(" in source
    for fetcher in ("load_data(", "get_file(", "urlretrieve", "requests.", "fetch_"):
        assert fetcher not in source, f"{name}: {fetcher!r} looks like a download"
    for tolerance in tolerances(path):
        assert set(tolerance) - {"replica_share"} in ({"key", "abs"}, {"key", "rel"}), \
            f"{name}: TOLERANCE entry {tolerance}"
        assert 0 < (tolerance.get("abs") or tolerance.get("rel")), f"{name}: TOLERANCE entry {tolerance}"


def test_corpus_size_and_default_suite():
    assert len(SCRIPTS) >= 12
    # the matrix is slow (`pytest -m slow`): the module docstring names the default tests that cover it
    assert all(mark.name == "slow" for case in _cases() for mark in case.marks)
