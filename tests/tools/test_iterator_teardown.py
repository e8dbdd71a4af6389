"""tools/iterator_teardown.py: the measurement of how long destroying a tf.data iterator keeps its caller."""
import importlib.util
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_spec = importlib.util.spec_from_file_location("iterator_teardown", os.path.join(REPO, "tools", "iterator_teardown.py"))
iterator_teardown = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(iterator_teardown)


def test_each_mode_prints_its_count_of_deletions_that_waited(capsys):
    assert iterator_teardown.main(["--deletions=2", "--age_s=0.2", "--modes=Feed.release,autotune off"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("Feed.release: 0 of 2 deletions waited over 0.05 s")  # the caller never waits
    assert lines[1].startswith("autotune off: ") and " of 2 deletions " in lines[1]


def test_an_unknown_mode_is_named(capsys):
    with pytest.raises(SystemExit):
        iterator_teardown.main(["--modes=autotune maybe"])
    assert "--modes: 'autotune maybe' is not one of autotune on, autotune off, Feed.release" in capsys.readouterr().err
