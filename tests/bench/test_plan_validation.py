"""tfgpu.bench.plan_validation: the plan's rows judged against the steps the emulated cluster measured, the term
that missed named, and a validation run's loops split by the link each ran on."""
import pytest

from tfgpu.bench import plan_validation


def _predicted(workers, bandwidth, compute, host, wire):
    """A row as the plan predicts it, before any validation run."""
    terms = {"compute": compute, "host all-reduce": host, "wire": wire}
    return {"workers": workers, "bandwidth": bandwidth, "terms_s": terms, "overlapped_s": 0.0,
            "predicted_step_s": sum(terms.values())}


def test_validation_judges_the_figure_the_user_reads_and_names_the_term_that_missed(capsys):
    # The rows' predicted_step_s (what the plan printed first) against the steps the emulated cluster measured: the
    # 1 Gbit/s row is 32 ms slower than predicted, and so were the same runs' loops with no link limit (a wire of
    # 0 ms): the miss does not follow the link, so it is the compute's (the larger of the terms the link leaves).
    rows = [_predicted(2, "100mbit", 0.050, 0.008, 0.099), _predicted(2, "1gbit", 0.050, 0.008, 0.010)]
    rows[0]["measured_step_s"], rows[1]["measured_step_s"] = 0.160, 0.100
    rows[0]["unlimited_step_s"] = rows[1]["unlimited_step_s"] = 0.088
    plan_validation.judge(rows, {2: [{**_predicted(2, "100gbit", 0.050, 0.008, 0.0), "measured_step_s": 0.088}]})
    assert [r["missed_term"] for r in rows] == ["compute", "compute"]
    assert plan_validation.print_validation(rows, 0.2, 1) == 1
    out, err = capsys.readouterr()
    assert "each worker a host of 1 core(s)" in out
    assert "| 2 | 100mbit | 50.0 ms | 8.0 ms | 99.0 ms | -0.0 ms | 157.0 ms | 160.0 ms | -2% | 88.0 ms |" in out
    assert "| 2 | 1gbit | 50.0 ms | 8.0 ms | 10.0 ms | -0.0 ms | 68.0 ms | 100.0 ms | -32% | 88.0 ms |" in out
    assert err.strip() == ("error: 2 workers at 1gbit: predicted -32% off (too fast); the term that missed: compute "
                           "(50.0 ms predicted, 32.0 ms unexplained)")
    assert plan_validation.print_validation(rows[:1], 0.2, 1) == 0 and capsys.readouterr().err == ""


def test_a_miss_that_follows_the_link_is_the_wire():
    rows = [_predicted(2, "100mbit", 0.050, 0.008, 0.099), _predicted(2, "1gbit", 0.050, 0.008, 0.010)]
    rows[0]["measured_step_s"], rows[1]["measured_step_s"] = 0.157 + 0.050, 0.068 + 0.005
    plan_validation.judge(rows, {2: [{**_predicted(2, "100gbit", 0.050, 0.008, 0.0), "measured_step_s": 0.058}]})
    assert rows[0]["missed_term"] == "wire" and rows[0]["error"] == pytest.approx(0.157 / 0.207 - 1)


def test_a_validation_run_is_split_by_the_link_each_loop_ran_on():
    # Loops end at these times (the first traces); the link was limited during 13.2-13.4 and freed during 16.1-16.3.
    records = [{"time": t, "step_time_ms": ms} for t, ms in
               [(10, 900.0), (11, 60.0), (12, 62.0), (13, 58.0), (14, 120.0), (15, 150.0), (16, 160.0),
                (17, 90.0), (18, 64.0), (19, 66.0)]]
    changes = [(13.2, 13.4, True), (16.1, 16.3, False)]
    unlimited, limited = plan_validation.split_loops(records, changes)
    assert unlimited == pytest.approx(0.062)  # 60, 62, 58, 64, 66; not the loops under a change
    assert limited == pytest.approx(0.155)  # 150, 160: the loops to 14 and to 17 ran while the link changed
    with pytest.raises(RuntimeError, match="raise --validate_steps"):
        plan_validation.split_loops(records[:4], [])
