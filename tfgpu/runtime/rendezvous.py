"""The membership of a job that spans hosts, agreed through etcd: which hosts form each worker group ("round"), and
the TF_CONFIG every worker of the round gets. One ``tfgpu.launch --rendezvous=etcd://HOST:PORT/JOB`` agent per host
uses it (``runtime/agent.py``); etcd is spoken through its v3 JSON gateway, over TLS with client certificates and
with etcd's auth when the endpoint says so (``runtime/etcd.py``). Every record read is checked before use
(``runtime/rendezvous_records.py``).

Keys under ``/tfgpu/<job>/`` (values JSON):

- ``hosts/<host>``: ``{"address", "workers"}``, attached to the host's lease: an agent that dies (a lost host, a
  ``kill -9``) disappears when its lease expires (``ttl_s``), a live agent renews it.
- ``round``: ``{"round", "members", "restarts", "reason", "record"}``: the current group (``record``: the
  restart record its chief writes to history.jsonl once it restored, for a round a failure started). A new round
  is only ever written with a compare-and-swap on the revision of the round its proposer read, so concurrent
  proposals (every agent sees the same failure) produce one round, not several.
- ``rounds/<n>/<host>``: the ports a member of round n opened for its workers; once every member has written its
  own, each computes the same TF_CONFIGs (members sorted, then local worker index: the first member's first worker
  is the chief).
- ``done/<n>``: a member whose workers all finished round n; a member that leaves after it is not a failure.
- ``outcome``: ``{"code", "line"}``: the job ended without finishing (below --min_workers, --max_restarts spent);
  every agent exits with that code.
"""
import dataclasses
import json
import threading
import time

from tfgpu.runtime import rendezvous_records as records
from tfgpu.runtime.etcd import Etcd, Endpoint, RendezvousError, parse  # noqa: F401 - the rendezvous's etcd

ForeignRecord = records.BadRecord  # a key under the job's prefix that is no valid tfgpu record: never retried


def parse_endpoint(text: str, environ=None) -> tuple:
    """``etcd://HOST:PORT/JOB[?options]`` -> (``http(s)://HOST:PORT``, JOB); ValueError naming --rendezvous (or
    the TFGPU_ETCD_* variable) otherwise. ``endpoint`` gives the TLS and auth options too."""
    endpoint = parse(text, environ)
    return endpoint.url, endpoint.job


@dataclasses.dataclass(frozen=True)
class Round:
    """One worker group: its number, member hosts (sorted), failures restarted so far, and why it was formed."""
    number: int
    members: tuple
    restarts: int = 0
    reason: str = ""
    record: dict | None = None  # the restart record this round's chief writes once it restored (a failure's)
    revision: int = 0  # etcd's mod_revision of the round key: what the next proposal compares against

    def to_json(self) -> str:
        return json.dumps({"round": self.number, "members": list(self.members), "restarts": self.restarts,
                           "reason": self.reason, "record": self.record})


def choose_members(alive: dict, workers_per_host: int, min_workers: int, max_workers: int, fits=lambda n: True):
    """(members, why not): the alive hosts (sorted) the next round takes, as many as ``max_workers`` allows and the
    global batch divides (``fits``); ([], reason) when fewer than ``min_workers`` workers would be left."""
    hosts = sorted(alive)
    for count in range(min(len(hosts), max_workers // workers_per_host), 0, -1):
        workers = count * workers_per_host
        if workers >= min_workers and fits(workers):
            return tuple(hosts[:count]), ""
    have = len(hosts) * workers_per_host
    if have < min_workers:
        return (), f"{len(hosts)} host(s) x {workers_per_host} worker(s) left, fewer than --min_workers={min_workers}"
    return (), f"no group of {min_workers}..{have} workers divides the global batch"


def tf_configs(members, published: dict) -> dict:
    """{host: [TF_CONFIG of each of its workers]}: every member's ports in member order, the first one's first
    worker the chief; ``published``: host -> {"address", "ports"}."""
    addresses = [f"{published[h]['address']}:{p}" for h in members for p in published[h]["ports"]]
    cluster = {"worker": addresses}
    configs, index = {}, 0
    for host in members:
        configs[host] = []
        for _ in published[host]["ports"]:
            configs[host].append(json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}}))
            index += 1
    return configs


class Rendezvous:
    """One host's view of the job's membership in etcd: its registration (kept alive by a thread), the current
    round, proposals of the next one, the ports of a round's members, and the job's outcome."""

    def __init__(self, url, job: str, host: str, address: str, workers: int, ttl_s: float = 5.0):
        self.etcd = Etcd(url)  # url: an etcd.Endpoint (TLS, auth) or a plain http://HOST:PORT
        self.prefix = f"/tfgpu/{job}/"
        self.host, self.address, self.workers = host, address, workers
        self.ttl_s = ttl_s
        self.lease = None
        self.newest = 0  # the highest round number read so far: a round never goes backwards
        self._stop = threading.Event()
        self._keeper = None

    def key(self, *parts) -> str:
        return self.prefix + "/".join(str(p) for p in parts)

    def register(self) -> None:
        """Puts this host under ``hosts/`` with a lease renewed every third of its TTL until ``leave``."""
        self.lease = self.etcd.grant(max(2, round(self.ttl_s)))
        self.etcd.put(self.key("hosts", self.host), json.dumps({"address": self.address, "workers": self.workers}),
                      lease=self.lease)
        self._stop.clear()
        self._keeper = threading.Thread(target=self._keep_alive, daemon=True)
        self._keeper.start()

    def _keep_alive(self):
        while not self._stop.wait(max(self.ttl_s / 3, 0.3)):
            try:
                if not self.etcd.keepalive(self.lease):  # expired (e.g. this host was frozen): register again
                    self.lease = self.etcd.grant(max(2, round(self.ttl_s)))
                    self.etcd.put(self.key("hosts", self.host), json.dumps(
                        {"address": self.address, "workers": self.workers}), lease=self.lease)
            except RendezvousError:
                pass  # etcd briefly unreachable: try again; the lease outlives a few misses

    def leave(self) -> None:
        """Stops renewing and removes this host's registration (its keys go with the lease)."""
        self._stop.set()
        if self._keeper is not None:
            self._keeper.join(5)
        if self.lease is not None:
            try:
                self.etcd.revoke(self.lease)
            except RendezvousError:
                pass
            self.lease = None

    def alive(self) -> dict:
        """{host: {"address", "workers"}} of every registered host."""
        start = len(self.key("hosts", ""))
        found = self.etcd.get_prefix(self.key("hosts", ""))
        return {k[start:]: records.host(k, k[start:], v) for k, v in found.items()}

    def current(self):
        """The current Round, or None before the first."""
        value, revision = self.etcd.get(self.key("round"))
        if value is None:
            if self.newest:
                raise records.BadRecord(f"etcd key {self.key('round')} vanished after round {self.newest} (a round "
                                        "is never deleted while its job runs): someone else writes under this job id")
            return None
        data = records.round_(self.key("round"), value, self.newest)
        self.newest = data["round"]
        return Round(data["round"], tuple(data["members"]), data["restarts"], data["reason"], data["record"],
                     revision)

    def propose(self, after, members, restarts: int, reason: str, record=None):
        """Writes round ``after.number + 1`` (1 when ``after`` is None) with ``members`` unless another agent
        wrote a round since ``after`` was read: (the current round, whether it is this proposal)."""
        number = after.number + 1 if after else 1
        proposal = Round(number, tuple(members), restarts, reason, record)
        won = self.etcd.put_if(self.key("round"), proposal.to_json(), after.revision if after else 0)
        return self.current(), won

    def publish(self, number: int, ports: list) -> None:
        self.etcd.put(self.key("rounds", number, self.host), json.dumps({"address": self.address, "ports": ports}),
                      lease=self.lease)

    def published(self, number: int) -> dict:
        """{host: {"address", "ports"}} of the members of round ``number`` that published their ports, each as many
        as the host registered workers."""
        start = len(self.key("rounds", number, ""))
        found = self.etcd.get_prefix(self.key("rounds", number, ""))
        workers = {h: r["workers"] for h, r in self.alive().items()} if found else {}
        return {k[start:]: records.ports(k, k[start:], v, workers.get(k[start:], self.workers))
                for k, v in found.items()}

    def mark_done(self, number: int) -> None:
        self.etcd.put(self.key("done", number, self.host), "1")

    def done(self, number: int, members=None) -> bool:
        """Whether a member of round ``number`` finished it; ``members``: the round's (default: the current one's),
        a mark from any other name is a forged record."""
        marks = self.etcd.get_prefix(self.key("done", number, ""))
        if marks and members is None:
            current = self.current()
            members = current.members if current and current.number == number else ()
        start = len(self.key("done", number, ""))
        return any(records.done(k, k[start:], v, members) for k, v in marks.items())

    def end(self, code: int, line: str) -> None:
        """Records that the job stops unfinished; the first outcome written stays."""
        self.etcd.put_if(self.key("outcome"), json.dumps({"code": code, "line": line}), 0)

    def outcome(self):
        value, _ = self.etcd.get(self.key("outcome"))
        return records.outcome(self.key("outcome"), value) if value is not None else None


def wait_for_members(rdzv: Rendezvous, current: Round, timeout_s: float, poll_s: float = 0.2):
    """The ports every member of ``current`` published, or None when the round changed, a member's registration
    vanished or ``timeout_s`` passed first (the caller forms another round)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        published = rdzv.published(current.number)
        if all(m in published for m in current.members):
            return published
        latest = rdzv.current()
        if latest is None or latest.number != current.number:
            return None
        alive = rdzv.alive()
        if any(m not in alive for m in current.members):
            return None
        time.sleep(poll_s)
    return None

