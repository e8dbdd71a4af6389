"""metrics.json through its one owner: what is written reads back, files of the previous format (no version)
read the same, a file that is not tfgpu's stops in one line naming it, and renaming a key is an edit of
``results.py`` alone (every reader still answers the same)."""
import ast
import dataclasses
import json
import math
import os
import pathlib
import tempfile

import pytest
from hypothesis import given, settings, strategies as st

from tests.conftest import REPO
from tfgpu.config import ConfigError
from tfgpu.metrics import results
from tfgpu.runtime import run_dir

# A version-1 file as tfgpu wrote it before format_version (a --target classification run with
# --skip_corrupt_records, --unfreeze_at_step), keys and values as they were on users' disks.
VERSION_1 = {"step": 440, "train_loss": 0.081, "train_accuracy": 0.98, "learning_rate": 0.0125,
             "examples_per_sec": 5203.4, "parameters": 19562, "trainable_parameters": 19562,
             "trainable_parameters_before_unfreeze": 19210, "model_output": "logits", "loss_from": "logits",
             "val_loss": 0.1, "val_accuracy": 0.971, "skipped_records": {"train": 2, "validation": 0},
             "target": "val_accuracy:0.97", "target_reached": True, "time_to_target_s": 62.0,
             "step_at_target": 440, "epochs_at_target": 19.57, "task": "classification", "model": "resnet20",
             "precision": "mixed_bfloat16", "strategy": "mirrored", "num_replicas": 8, "num_workers": 1,
             "global_batch_size": 1024, "wall_time_s": 640.2}


def _write_raw(directory, content) -> str:
    path = os.path.join(directory, "metrics.json")
    with open(path, "w" if isinstance(content, str) else "wb") as f:
        f.write(content)
    return path


def test_a_file_of_the_previous_format_reads_with_every_value_in_its_place(tmp_path):
    _write_raw(tmp_path, json.dumps(VERSION_1))
    result = results.read(str(tmp_path))
    assert result.version == 1 and result.step == 440 and result.examples_per_sec == 5203.4
    assert result.target == results.TargetOutcome("val_accuracy:0.97", True, 62.0, 440, 19.57)
    assert result.facts == results.RunFacts("classification", "resnet20", "mixed_bfloat16", "mirrored", 8, 1, 1024)
    assert result.parameters == results.ParameterCounts(19562, 19562, 19210)
    assert result.skipped_records == {"train": 2, "validation": 0} and result.wall_time_s == 640.2
    assert result.values["val_accuracy"] == 0.971 and result.values["model_output"] == "logits"
    # Written again, it is in this version's layout and reads back the same.
    results.write(str(tmp_path), result)
    assert results.read(str(tmp_path)) == dataclasses.replace(result, version=results.VERSION)


_value = st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40), st.text(max_size=8),
                   st.floats(allow_nan=False))
_maybe = lambda strategy: st.one_of(st.none(), strategy)  # noqa: E731
_count = st.integers(0, 2**40)
_finite = st.floats(allow_nan=False, allow_infinity=False)


@st.composite
def run_results(draw):
    own = {key.name for key in results.KEYS}
    values = draw(st.dictionaries(st.text(min_size=1, max_size=12).filter(lambda k: k not in own), _value,
                                  max_size=6))
    target = draw(_maybe(st.builds(results.TargetOutcome, st.text(max_size=12), st.booleans(), _maybe(_finite),
                                   _maybe(_count), _maybe(_finite))))
    facts = draw(_maybe(st.builds(results.RunFacts, _maybe(st.text(max_size=8)), _maybe(st.text(max_size=8)),
                                  _maybe(st.text(max_size=8)), _maybe(st.text(max_size=8)), _maybe(_count),
                                  _maybe(_count), _maybe(_count))))
    parameters = draw(_maybe(st.builds(results.ParameterCounts, _maybe(_count), _maybe(_count), _maybe(_count))))
    if facts == results.RunFacts():
        facts = None  # a section with nothing set is not written: it reads back as absent
    if parameters == results.ParameterCounts():
        parameters = None
    return results.RunResult(
        step=draw(_maybe(_count)), examples_per_sec=draw(_maybe(_finite)), values=values,
        skipped_records=draw(_maybe(st.dictionaries(st.text(max_size=8), _count, max_size=3))), target=target,
        facts=facts, parameters=parameters, wall_time_s=draw(_maybe(_finite)), trained=draw(_maybe(st.booleans())),
        untrained_reason=draw(_maybe(st.text(max_size=8))))


@settings(max_examples=40, deadline=None)
@given(result=run_results())
def test_what_is_written_reads_back_the_same(result):
    with tempfile.TemporaryDirectory() as directory:
        results.write(directory, result)
        assert results.read(directory) == result
        assert os.listdir(directory) == ["metrics.json"]  # atomic: no temporary left beside it


def test_a_target_not_reached_still_writes_each_of_its_keys():
    """Null where not reached, so a user's script reading the time to target gets null, not a KeyError."""
    written = results.RunResult(target=results.TargetOutcome("val_accuracy:0.9", False)).to_dict()
    target_keys = [key.name for key in results.KEYS if key.section == "target"]
    assert list(written)[:len(target_keys)] == target_keys and len(written) == len(target_keys) + 1  # + version
    assert [written[name] for name in target_keys[2:]] == [None, None, None]


def test_a_missing_file_is_no_result(tmp_path):
    assert results.read(str(tmp_path)) is None


@pytest.mark.parametrize("content, reason", [
    ("[1, 2]", "it holds a list, not an object"),
    ("{\"step\": ", "not JSON"),
    (b"\x89PNG\r\n\x1a\n\x00", "not JSON"),
    ('{"format_version": 99, "step": 1}', f"has format_version 99, newer than this tfgpu reads ({results.VERSION}); "
                                          "upgrade tfgpu"),
    ('{"format_version": "2"}', "format_version '2' is not a version number"),
    ('{"step": 1.5}', "'step' is 1.5, not an integer"),
    ('{"step": true}', "'step' is True, not an integer"),
    ('{"examples_per_sec": NaN}', "'examples_per_sec' is nan, not a finite number"),
    ('{"target": "val_accuracy:0.9", "target_reached": "yes"}', "'target_reached' is 'yes', not true or false"),
    ('{"target": "val_accuracy:0.9"}', "it has target fields without 'target_reached'"),
    ('{"time_to_target_s": 3.0, "target_reached": true}', "it has target fields without 'target'"),
    ('{"skipped_records": {"train": "two"}}', "'skipped_records' is not {split: count}"),
    ('{"val_accuracy": [0.9]}', "'val_accuracy' holds a list; a task's value is a number, a string or a boolean"),
])
def test_a_file_that_is_not_tfgpus_results_is_one_line_naming_it(tmp_path, content, reason):
    path = _write_raw(tmp_path, content)
    with pytest.raises(ConfigError) as raised:
        results.read(str(tmp_path), flag="from_model_dir")
    message = str(raised.value)
    assert message.startswith(f"--from_model_dir: {path} ") and reason in message and "\n" not in message


def test_a_task_value_cannot_take_a_key_of_tfgpus_own():
    with pytest.raises(ValueError, match="the task's values step are named like tfgpu's own keys"):
        results.RunResult(values={"step": 3})


# -- one file names the keys -------------------------------------------------------------------------------------
def _readers(directory: str) -> dict:
    """What every reader of metrics.json answers about the run in ``directory``."""
    import importlib.util

    from tfgpu import plan
    from tfgpu.reporting import report
    from tfgpu.tasks.gan import fid
    from tfgpu.metrics import target

    def tool(name):
        spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, "tools", f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    result = results.read(directory)
    report.write_report(directory)
    text = pathlib.Path(directory, "report.md").read_text()
    return {"sentence": target.sentence(result),
            "report": text.splitlines(),
            "plan": plan.read_run(directory)["trainable"],
            "time_to_target": tool("time_to_target").read_outcome("tfgpu", results.path(directory)),
            "bench_scaling": tool("bench_scaling")._rate(directory),
            "fid": fid._classifier_trained(os.path.join(directory, "export", "model.keras"))}


def test_renaming_every_key_in_results_py_changes_no_readers_answer(tmp_path, monkeypatch):
    """Done when renaming a metrics.json key touches one file: with every key of ``results.KEYS`` renamed there
    (its old name kept as ``earlier``, the version raised; nothing else changed), the same run written under the
    new names reads the same to resume's target check (the outcome), the report (which shows the new names),
    plan, the tools and the GAN's FID; and a file of the previous format still reads the same."""
    result = results.parse(dict(VERSION_1, trained=False, reason="one class"))
    (tmp_path / run_dir.CONFIG_FILE).write_text("global_batch_size: 1024\ntrain_steps: 20\n")
    (tmp_path / "history.jsonl").write_text("".join(json.dumps({"kind": "train", "step": s, "step_time_ms": 40.0})
                                                    + "\n" for s in (10, 20)))
    results.write(str(tmp_path), result)
    before, previous_format = _readers(str(tmp_path)), results.parse(VERSION_1)
    monkeypatch.setattr(results, "KEYS", tuple(dataclasses.replace(key, name=f"renamed_{key.name}",
                                                                   earlier=(key.name,) + key.earlier)
                                               for key in results.KEYS))
    monkeypatch.setattr(results, "VERSION", results.VERSION + 1)
    assert results.parse(VERSION_1) == previous_format  # read by the names it had
    results.write(str(tmp_path), result)
    written = set(json.loads((tmp_path / "metrics.json").read_text())) - set(result.values)
    assert written and all(name.startswith("renamed_") for name in written)
    assert dataclasses.replace(results.read(str(tmp_path)), version=result.version) == result
    after = _readers(str(tmp_path))
    after["report"] = [line.replace("renamed_", "") for line in after["report"]]  # its key table sorts by name
    after["report"], before["report"] = sorted(after["report"]), sorted(before["report"])
    assert after == before
    assert before["sentence"] == "target val_accuracy >= 0.97 reached at step 440 (19.57 epochs) in 62.0 s"
    assert before["fid"] == (False, "one class") and before["plan"] == 19562 and before["bench_scaling"] == 5203.4
    assert before["time_to_target"]["time_to_target_s"] == 62.0
    assert "resnet20 (precision=mixed_bfloat16, strategy=mirrored, num_replicas=8" in "\n".join(before["report"])


def test_no_module_but_results_names_the_file():
    """No other module of tfgpu or tools joins "metrics.json" into a path (docstrings and messages may name it):
    every reader and writer goes through ``results.path``/``read``/``write``; run_dir.py holds the name."""
    found = []
    for root in ("tfgpu", "tools"):
        for path in pathlib.Path(REPO, root).rglob("*.py"):
            if path in (pathlib.Path(results.__file__), pathlib.Path(run_dir.__file__)):  # content and name owners
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and (
                        node.value == results.FILE or node.value.endswith("/" + results.FILE)):
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert found == []


def test_nan_in_a_task_value_is_kept():
    """A task's value may be NaN (a diverged loss): it is the task's to say, so it reads back as written."""
    assert math.isnan(results.parse({"train_loss": float("nan")}).values["train_loss"])
