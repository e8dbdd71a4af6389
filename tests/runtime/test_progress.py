"""tfgpu.runtime.progress: one progress mechanism for the converter and the trainer (a Keras bar on a terminal,
plain lines elsewhere), and log lines that start on a line of their own while a bar is drawn."""
import io
import logging
import re

import pytest

from tfgpu.data.conversion import workers
from tfgpu.runtime import logs, progress


class Terminal(io.StringIO):
    """A stream that says it is a terminal, standing for the user's screen (stdout and stderr both)."""

    def isatty(self):
        return True


@pytest.fixture
def tfgpu_logger():
    logger = logging.getLogger("tfgpu")
    saved = logger.handlers[:], logger.level, logger.propagate
    yield logger
    logger.handlers[:], logger.level, logger.propagate = saved


@pytest.mark.parametrize("make", [
    lambda screen: progress.Progress(10, screen, label="step "),  # the trainer's (history.Progress)
    lambda screen: workers.conversion_progress(10, screen),  # the converter's
])
def test_a_log_line_while_a_bar_is_drawn_starts_on_its_own_line(make, tfgpu_logger, monkeypatch):
    screen = Terminal()
    monkeypatch.setattr("sys.stderr", screen)
    logs.setup()
    bar = make(screen)
    assert bar.bar is not None  # a terminal gets the bar
    bar.update(3)
    tfgpu_logger.info("saved checkpoint at step 3")
    bar.update(10)
    bar.close()
    tfgpu_logger.info("done")
    lines = screen.getvalue().split("\n")
    logged = [line for line in lines if "tfgpu]" in line]
    assert len(logged) == 2 and all(re.fullmatch(r"\d\d:\d\d:\d\d I tfgpu\] (saved checkpoint at step 3|done)",
                                                 line) for line in logged), lines
    assert "10/10" in lines[lines.index(logged[0]) + 1]  # the bar goes on below the log line


def test_plain_lines_count_rate_and_eta_and_the_last_one_is_always_shown(monkeypatch):
    clock = iter([100.0, 101.0, 104.0, 106.0, 112.0])  # start; then one update each
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    out = io.StringIO()
    shown = workers.conversion_progress(12, out)  # not a terminal: a line every 10 s, and the last
    assert shown.bar is None
    shown.update(2)  # the first line at once
    shown.update(5)  # 3 s later: held back
    shown.update(7)
    shown.close()  # the last update is written, whenever it came
    shown.update(12)  # 11 s after the first line
    assert out.getvalue().splitlines() == [
        "convert: images 2/12 images_per_sec=2.0 elapsed=1s eta=5s",
        "convert: images 7/12 images_per_sec=1.0 elapsed=6s eta=5s",
        "convert: images 12/12 images_per_sec=0.9 elapsed=12s eta=0s"]


def test_durations_read_at_a_glance():
    assert [progress.duration(s) for s in (0.4, 59.6, 61, 3599, 3600 * 25 + 61, float("nan"), -1)] == \
        ["0s", "1m00s", "1m01s", "59m59s", "25h01m", "?", "?"]
