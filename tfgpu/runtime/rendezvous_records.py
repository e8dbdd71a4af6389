"""The records of a job's rendezvous (``runtime/rendezvous.py``) checked for type and range as they are read from
etcd: whoever else can write under the job's prefix must not be able to crash an agent with a traceback, hand its
workers a port outside 1..65535, or end a launch with exit 0 before its workers finished. A record that fails a
check is ``BadRecord``: one line naming the etcd key and what is wrong, never retried (it stays until someone
removes it), and the agent ends with a non-zero exit."""
import json
import re

from tfgpu.runtime import restarts
from tfgpu.runtime.etcd import RendezvousError

MAX_TEXT = 2000  # characters of a reason or an outcome's line: a line, not a file
MAX_RECORD_BYTES = 4096  # a restart record as JSON (restarts.restart_record's is about 400 bytes)
MAX_WORKERS = 4096  # of one host
RESTART_FIELDS = frozenset(restarts.restart_record(
    1, restarts.Failure(0, 0, 129, ""), 1, 1, None, 0.0))
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
NAME = re.compile(r"[A-Za-z0-9._:%\[\]-]{1,200}")  # a host id (runtime/agent.host_id: ADDRESS-PID) or an address


class BadRecord(RendezvousError):
    """A key under the job's prefix that holds no valid tfgpu record."""


def _fail(key, what):
    raise BadRecord(f"etcd key {key}: {what}; someone else writes under this job id (use another --rendezvous "
                    f"JOB_ID, and see docs/healing.md, 'Security')")


def _load(key: str, value: str, fields) -> dict:
    try:
        data = json.loads(value)
    except ValueError:
        data = None
    if not isinstance(data, dict) or any(f not in data for f in fields):
        raise BadRecord(f"etcd key {key} holds {value[:80]!r}, not a tfgpu rendezvous record (another program's "
                        "keys under this job id?): use another --rendezvous JOB_ID")
    return data


def _int(key, field, value, low, high):
    if type(value) is not int or not low <= value <= high:
        _fail(key, f"{field} is {value!r}, not an integer in {low}..{high}")
    return value


def _text(key, field, value, pattern=None):
    """``value`` when it is one line of text (no control characters: it is printed and logged) or, with
    ``pattern``, a name of that form."""
    if not isinstance(value, str) or len(value) > MAX_TEXT or (pattern is not None and not pattern.fullmatch(value)) \
            or _CONTROL.search(value):
        _fail(key, f"{field} is {str(value)[:80]!r}, not " + ("a host name or address" if pattern else
                                                               f"one line of at most {MAX_TEXT} characters"))
    return value


def host(key: str, name: str, value: str) -> dict:
    """``hosts/<name>``: {"address": str, "workers": int}."""
    _text(key, "the host name", name, NAME)
    data = _load(key, value, ("address", "workers"))
    _text(key, "address", data["address"], NAME)
    _int(key, "workers", data["workers"], 1, MAX_WORKERS)
    return data


def round_(key: str, value: str, newest: int) -> dict:
    """``round``: its number a non-negative int no lower than ``newest`` (the highest read before), members a
    non-empty sorted list of distinct host names, restarts a non-negative int, reason a line, record None or a
    restart record of bounded size."""
    data = _load(key, value, ("round", "members"))
    number = _int(key, "round", data["round"], 0, 2 ** 62)
    if number < newest:
        _fail(key, f"round went backwards from {newest} to {number}")
    members = data["members"]
    if not isinstance(members, list) or not members or len(members) > MAX_WORKERS:
        _fail(key, f"members is {str(members)[:80]!r}, not a non-empty list of host names")
    for m in members:
        _text(key, "a member", m, NAME)
    if members != sorted(set(members)):
        _fail(key, f"members {str(members)[:80]} are not distinct host names in sorted order")
    data.setdefault("restarts", 0)
    data.setdefault("reason", "")
    data.setdefault("record", None)
    _int(key, "restarts", data["restarts"], 0, 2 ** 31)
    _text(key, "reason", data["reason"])
    record = data["record"]
    if record is not None:
        if not isinstance(record, dict) or len(json.dumps(record)) > MAX_RECORD_BYTES:
            _fail(key, f"record is not a restart record of at most {MAX_RECORD_BYTES} bytes")
        if set(record) - RESTART_FIELDS:
            _fail(key, f"record has fields {sorted(set(record) - RESTART_FIELDS)} no restart record has")
        if any(not isinstance(v, (str, int, float, bool, type(None)))
               or (isinstance(v, str) and (len(v) > MAX_TEXT or _CONTROL.search(v))) for v in record.values()):
            _fail(key, "record holds a value that is no number, flag or line")
    return data


def ports(key: str, name: str, value: str, workers: int) -> dict:
    """``rounds/<n>/<name>``: {"address": str, "ports": [``workers`` distinct ints in 1..65535]}."""
    _text(key, "the host name", name, NAME)
    data = _load(key, value, ("address", "ports"))
    _text(key, "address", data["address"], NAME)
    listed = data["ports"]
    if not isinstance(listed, list) or len(listed) != workers:
        _fail(key, f"ports is {str(listed)[:80]!r}, not a list of {workers} port(s) (one a worker of the host)")
    for port in listed:
        _int(key, "a port", port, 1, 65535)
    if len(set(listed)) != len(listed):
        _fail(key, f"ports {listed} repeat a port")
    return data


def done(key: str, name: str, value: str, members) -> bool:
    """``done/<n>/<name>``: "1", written by a member of round n."""
    if value != "1" or name not in members:
        _fail(key, f"a finish mark {value[:20]!r} from {name[:80]!r}, which is no member of the round")
    return True


def outcome(key: str, value: str) -> dict:
    """``outcome``: {"code": a failure's exit code (1..255; 0 is never written: a job that finished has none),
    "line": str}."""
    data = _load(key, value, ("code", "line"))
    _int(key, "code", data["code"], 1, 255)
    _text(key, "line", data["line"])
    return data
