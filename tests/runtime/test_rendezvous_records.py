"""The records of the rendezvous checked as they are read (``runtime/rendezvous_records.py``): in-process, every
malformed record is one BadRecord line naming the key and what is wrong; against a real etcd (``etcd_url``), the
forged records a host that can reach etcd could write each end a real agent with that line and a non-zero exit,
never a traceback, never exit 0 while its workers run."""
import json
import re

import pytest
from hypothesis import given, strategies as st

from tfgpu.runtime import etcd, rendezvous, rendezvous_records as records
from tests.runtime.test_agent import _cleanup, _groups, _log, _start_agent, _wait

KEY = "/tfgpu/j/round"


def _round(**fields):
    return json.dumps({"round": 3, "members": ["10.0.0.1-11", "10.0.0.2-12"], "restarts": 1, "reason": "r",
                       "record": None, **fields})


def test_a_valid_round_passes_and_missing_optional_fields_take_their_defaults():
    data = records.round_(KEY, json.dumps({"round": 1, "members": ["a-1"]}), newest=0)
    assert (data["restarts"], data["reason"], data["record"]) == (0, "", None)
    assert records.round_(KEY, _round(), newest=3)["round"] == 3


@pytest.mark.parametrize("fields, what", [
    ({"round": "7"}, r"round is '7', not an integer"),
    ({"round": -1}, r"round is -1, not an integer in 0\.\."),
    ({"round": True}, r"round is True, not an integer"),
    ({"round": 2}, r"round went backwards from 3 to 2"),
    ({"members": []}, r"members is '\[\]', not a non-empty list"),
    ({"members": "a-1"}, r"members is 'a-1', not a non-empty list"),
    ({"members": ["b-1", "a-1"]}, r"members .* are not distinct host names in sorted order"),
    ({"members": ["a-1", "a-1"]}, r"members .* are not distinct host names in sorted order"),
    ({"members": ["a/../b"]}, r"a member is 'a/\.\./b', not a host name"),
    ({"members": [7]}, r"a member is '7', not a host name"),
    ({"restarts": -2}, r"restarts is -2"),
    ({"reason": "x" * 3000}, r"reason is 'x+', not one line of at most 2000"),
    ({"reason": "ok\nerror: forged"}, r"reason is 'ok\\nerror: forged', not one line"),
    ({"record": {"reason": "\x1b[2J"}}, r"record holds a value that is no number, flag or line"),
    ({"record": "text"}, r"record is not a restart record"),
    ({"record": {"restart": 1, "pwned": "x"}}, r"record has fields \['pwned'\]"),
    ({"record": {"reason": "x" * 5000}}, r"record is not a restart record of at most 4096 bytes"),
    ({"record": {"reason": {"nested": 1}}}, r"record holds a value that is no number"),
])
def test_a_malformed_round_is_one_line_naming_the_key_and_the_field(fields, what):
    with pytest.raises(records.BadRecord, match=f"^etcd key {KEY}: {what}") as e:
        records.round_(KEY, _round(**fields), newest=3)
    assert "\n" not in str(e.value) and "--rendezvous JOB_ID" in str(e.value)


@pytest.mark.parametrize("value, workers, what", [
    ({"address": "10.0.0.1", "ports": [0]}, 1, r"a port is 0, not an integer in 1\.\.65535"),
    ({"address": "10.0.0.1", "ports": [65536]}, 1, r"a port is 65536"),
    ({"address": "10.0.0.1", "ports": ["80"]}, 1, r"a port is '80'"),
    ({"address": "10.0.0.1", "ports": [80, 81]}, 1, r"ports is .*, not a list of 1 port\(s\)"),
    ({"address": "10.0.0.1", "ports": [80, 80]}, 2, r"ports \[80, 80\] repeat a port"),
    ({"address": ["x"], "ports": [80]}, 1, r"address is \"\['x'\]\", not a host name"),
    ({"address": "evil host", "ports": [80]}, 1, r"address is 'evil host', not a host name"),
])
def test_published_ports_are_ints_in_range_one_a_worker(value, workers, what):
    key = "/tfgpu/j/rounds/1/h-1"
    with pytest.raises(records.BadRecord, match=f"^etcd key {key}: {what}"):
        records.ports(key, "h-1", json.dumps(value), workers)
    assert records.ports(key, "h-1", json.dumps({"address": "10.0.0.1", "ports": [80, 81]}), 2)["ports"] == [80, 81]


@given(code=st.one_of(st.integers(-300, 300), st.text(max_size=3), st.none(), st.booleans(), st.floats()))
def test_an_outcome_is_a_failure_code_never_zero(code):
    key = "/tfgpu/j/outcome"
    value = json.dumps({"code": code, "line": "x"})
    if type(code) is int and 1 <= code <= 255:
        assert records.outcome(key, value)["code"] == code
    else:
        with pytest.raises(records.BadRecord, match=f"^etcd key {key}: code is .*, not an integer in 1..255"):
            records.outcome(key, value)


JSON = st.recursive(st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70) | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                    max_leaves=8)


@given(kind=st.sampled_from(["host", "round", "ports", "outcome", "done"]),
       fields=st.dictionaries(st.sampled_from(["round", "members", "restarts", "reason", "record", "address",
                                               "workers", "ports", "code", "line"]), JSON, max_size=10),
       raw=st.one_of(st.none(), st.text(max_size=12)))
def test_whatever_a_key_holds_the_check_accepts_it_or_says_one_line_never_another_exception(kind, fields, raw):
    """The invariant behind 'no traceback': any value under any key is a record or a BadRecord naming the key."""
    value = raw if raw is not None else json.dumps(fields)
    key = f"/tfgpu/j/{kind}"
    check = {"host": lambda: records.host(key, "h-1", value), "round": lambda: records.round_(key, value, 0),
             "ports": lambda: records.ports(key, "h-1", value, 1), "outcome": lambda: records.outcome(key, value),
             "done": lambda: records.done(key, "h-1", value, ("h-1",))}[kind]
    try:
        check()
    except records.BadRecord as e:
        assert str(e).startswith(f"etcd key {key}") and "\n" not in str(e)


def test_hosts_and_finish_marks_are_checked():
    with pytest.raises(records.BadRecord, match=r"workers is 0, not an integer in 1\.\.4096"):
        records.host("/tfgpu/j/hosts/a-1", "a-1", json.dumps({"address": "10.0.0.1", "workers": 0}))
    with pytest.raises(records.BadRecord, match=r"the host name is 'a b', not a host name"):
        records.host("/tfgpu/j/hosts/a b", "a b", json.dumps({"address": "10.0.0.1", "workers": 1}))
    with pytest.raises(records.BadRecord, match=r"from '0evil', which is no member of the round"):
        records.done("/tfgpu/j/done/1/0evil", "0evil", "1", ("a-1",))
    assert records.done("/tfgpu/j/done/1/a-1", "a-1", "1", ("a-1",))


def test_a_round_that_vanishes_or_goes_back_in_etcd_ends_the_reader(etcd_url):
    a = rendezvous.Rendezvous(etcd_url, "job1", "a-1", "127.0.0.1", 1)
    a.register()
    try:
        first, _ = a.propose(None, ("a-1",), 0, "first")
        a.propose(first, ("a-1",), 0, "second")
        assert a.current().number == 2
        a.etcd.put(a.key("round"), _round(round=1, members=["a-1"]))
        with pytest.raises(records.BadRecord, match=r"round went backwards from 2 to 1"):
            a.current()
        a.etcd.call("/v3/kv/deleterange", {"key": etcd.b64(a.key("round"))})
        with pytest.raises(records.BadRecord, match=r"round vanished after round 2"):
            a.current()
    finally:
        a.leave()


def _forge(etcd_url, key, value):
    rendezvous.Etcd(etcd_url).put("/tfgpu/job1/" + key, value)


@pytest.mark.parametrize("forgeries, line", [
    # the fake finish: an outcome 0 and a round bumped while the worker runs
    ([("outcome", {"code": 0, "line": "done"}), ("round", {"round": 9, "members": ["z-1"]})],
     r"etcd key /tfgpu/job1/outcome: code is 0, not an integer in 1\.\.255"),
    ([("round", {"round": "7", "members": ["z-1"]})], r"etcd key /tfgpu/job1/round: round is '7'"),
    ([("outcome", {"code": "x", "line": "stop"}), ("round", {"round": 9, "members": ["z-1"]})],
     r"etcd key /tfgpu/job1/outcome: code is 'x'"),
])
def test_a_forged_record_ends_the_agent_with_its_line_not_exit_0_and_no_traceback(etcd_url, tmp_path, forgeries,
                                                                                  line):
    out = str(tmp_path)
    a = _start_agent(etcd_url, out, "a", "--num_workers=1")
    try:
        _wait(lambda: _groups(out) == [[0]], 30, "the group of 1")
        for key, value in forgeries:
            _forge(etcd_url, key, json.dumps(value))
        code = a.wait(30)
        log = _log(out, "a")
        assert code == 1, log
        assert "Traceback" not in log
        error = [x for x in log.splitlines() if x.startswith("error: ")]
        assert len(error) == 1 and re.search(line, error[0]), log
    finally:
        _cleanup([a])
