"""tools/bench_resume.py: where it resumes, which startup record it reads, and how it compares each resume with
the fresh run on its own topology (in-process; the measurement itself is the tool's run, not a test)."""
import json

from tests.tools import load

bench = load("bench_resume")


def test_mid_epoch_and_end_of_epoch_steps_keep_their_records_in_the_first_epoch():
    mid, end = bench.steps_of(1_000_000, 1024)
    assert (mid, end) == (488, 976)
    assert end * 1024 <= 1_000_000 < (end + 1) * 1024  # the step after the end crosses into epoch 2
    assert bench.steps_of(900_000, 1024) == (439, 878)  # the 0.9 of 1M: its step 439


def test_the_startup_record_read_is_the_last_run_in_a_copied_model_dir(tmp_path):
    lines = [{"kind": "startup", "step": 0, "first_loop_s": 9.0}, {"kind": "loop", "step": 488},
             {"kind": "startup", "step": 488, "first_loop_s": 3.5}, {"kind": "loop", "step": 498}]
    (tmp_path / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert bench.startup_record(str(tmp_path))["first_loop_s"] == 3.5


def test_each_resume_is_compared_with_the_fresh_run_on_its_own_number_of_workers():
    def runs(*values):
        return [{"first_loop_s": v, "cpu_s": 10 * v} for v in values]

    rows = bench.summarize({"fresh": runs(3.0, 5.0, 4.0), "mid": runs(4.5, 4.0, 9.0), "fresh_2w": runs(8.0),
                            "end_2w": runs(7.0)})
    assert rows["mid"]["first_loop_s"] == 4.5 and rows["mid"]["vs_fresh_s"] == 0.5
    assert rows["mid"]["cpu_vs_fresh_s"] == 5.0
    assert rows["end_2w"]["vs_fresh_s"] == -1.0
    assert "vs_fresh_s" not in rows["fresh"]
    text = bench.table(rows, {"mid": {"epochs": [{"epoch": 1, "missing": 0, "duplicated": 0}]}})
    assert "| mid | 4.50 | +0.50 | 45.0 | +5.0 |" in text and "epoch 1: 0 / 0" in text
