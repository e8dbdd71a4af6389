"""The rendezvous across hosts: the pure rules (members of a round, TF_CONFIGs, the endpoint) in-process, and the
rounds and registrations against a real etcd (``etcd_url``: tests/runtime/conftest.py)."""
import json
import threading
import time

import pytest
from hypothesis import given, strategies as st

from tfgpu.runtime import rendezvous
from tfgpu.runtime.cluster import resolve_cluster


def test_endpoint_is_parsed_and_a_bad_one_names_the_flag():
    assert rendezvous.parse_endpoint("etcd://10.0.0.1:2379/run7") == ("http://10.0.0.1:2379", "run7")
    assert rendezvous.parse_endpoint("etcd://node1/run7") == ("http://node1:2379", "run7")
    for bad in ("http://node1:2379/run7", "etcd://node1:2379", "etcd://node1:2379/a/b"):
        with pytest.raises(ValueError, match="--rendezvous"):
            rendezvous.parse_endpoint(bad)


def test_members_are_the_alive_hosts_sorted_cut_to_the_most_workers_and_what_the_batch_divides():
    alive = {h: {} for h in ("c", "a", "b", "d")}
    assert rendezvous.choose_members(alive, 1, 2, 3) == (("a", "b", "c"), "")
    assert rendezvous.choose_members(alive, 2, 2, 8, fits=lambda n: n % 3 == 0) == (("a", "b", "c"), "")
    members, why = rendezvous.choose_members({"a": {}}, 1, 2, 3)
    assert members == () and "fewer than --min_workers=2" in why
    members, why = rendezvous.choose_members(alive, 1, 2, 4, fits=lambda n: n == 5)
    assert members == () and "divides the global batch" in why


@given(ports=st.lists(st.lists(st.integers(1024, 65535), min_size=1, max_size=3, unique=True), min_size=1,
                      max_size=4))
def test_every_member_computes_one_cluster_with_each_worker_once_and_one_chief(ports):
    members = tuple(f"h{i}" for i in range(len(ports)))
    published = {h: {"address": f"10.0.0.{i}", "ports": p} for i, (h, p) in enumerate(zip(members, ports))}
    configs = rendezvous.tf_configs(members, published)
    descs = [resolve_cluster("tf_config", {"TF_CONFIG": c}) for h in members for c in configs[h]]
    total = sum(map(len, ports))
    if total == 1:
        assert descs == [None]  # one worker trains alone
        return
    assert [d["task_id"] for d in descs] == list(range(total))
    assert len({json.dumps(d["cluster_spec"]) for d in descs}) == 1
    assert [d["is_chief"] for d in descs].count(True) == 1 and descs[0]["is_chief"]


def _agent(url, host, ttl_s=5.0):
    return rendezvous.Rendezvous(url, "job1", host, f"addr-{host}", 1, ttl_s=ttl_s)


def test_concurrent_proposals_write_one_round_and_the_loser_reads_it(etcd_url):
    a, b = _agent(etcd_url, "a"), _agent(etcd_url, "b")
    for r in (a, b):
        r.register()
    try:
        assert set(a.alive()) == {"a", "b"} and a.alive()["b"]["address"] == "addr-b"
        assert a.current() is None
        results = {}
        barrier = threading.Barrier(2)

        def propose(r, members):
            barrier.wait()
            results[r.host] = r.propose(None, members, 0, f"by {r.host}")

        threads = [threading.Thread(target=propose, args=(a, ("a", "b"))), threading.Thread(target=propose,
                                                                                            args=(b, ("b",)))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(won for _, won in results.values()) == [False, True]
        first = a.current()
        assert first.number == 1 and results["a"][0] == results["b"][0] == first
        # A proposal made from a round that is no longer current is refused: round 2 is written once.
        second, won = b.propose(first, ("a", "b"), 1, "restart 1")
        assert won and second.number == 2 and second.restarts == 1
        stale, won = a.propose(first, ("a",), 1, "late")
        assert not won and stale == second
    finally:
        a.leave()
        b.leave()


def test_members_publish_their_ports_and_a_member_that_leaves_stops_the_wait(etcd_url):
    a, b = _agent(etcd_url, "a"), _agent(etcd_url, "b")
    a.register()
    b.register()
    try:
        current, _ = a.propose(None, ("a", "b"), 0, "first")
        a.publish(1, [1111])
        b.publish(1, [2222])
        published = rendezvous.wait_for_members(a, current, timeout_s=5)
        assert published == {"a": {"address": "addr-a", "ports": [1111]}, "b": {"address": "addr-b", "ports": [2222]}}
        second, _ = a.propose(current, ("a", "b"), 1, "again")
        a.publish(2, [3333])
        b.leave()  # its registration and its published ports go with its lease
        assert "b" not in a.alive()
        started = time.monotonic()
        assert rendezvous.wait_for_members(a, second, timeout_s=10) is None
        assert time.monotonic() - started < 2
    finally:
        a.leave()
        b.leave()


def test_a_host_whose_agent_stops_renewing_its_lease_is_gone_after_the_ttl(etcd_url):
    a, b = _agent(etcd_url, "a", ttl_s=2), _agent(etcd_url, "b", ttl_s=2)
    a.register()
    b.register()
    try:
        b._stop.set()  # b's agent freezes (or its host dies): no more keepalives, no revoke
        b._keeper.join()
        time.sleep(1.5)
        assert set(a.alive()) == {"a", "b"}  # a's own renewals keep it in, b is still within its TTL
        deadline = time.monotonic() + 6
        while "b" in a.alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert set(a.alive()) == {"a"}
    finally:
        a.leave()


def test_the_first_outcome_stays_and_done_is_per_round(etcd_url):
    a = _agent(etcd_url, "a")
    a.register()
    try:
        assert a.outcome() is None and not a.done(1)
        a.propose(None, ("a",), 0, "first")
        a.mark_done(1)
        assert a.done(1) and not a.done(2)
        a.end(129, "first")
        a.end(1, "second")
        assert a.outcome() == {"code": 129, "line": "first"}
    finally:
        a.leave()


def test_an_unreachable_etcd_is_one_line_naming_it():
    r = rendezvous.Rendezvous("http://127.0.0.1:9", "job1", "a", "addr", 1)
    with pytest.raises(rendezvous.RendezvousError, match=r"etcd at http://127.0.0.1:9 cannot be reached"):
        r.register()


def test_a_key_another_program_wrote_under_the_job_is_one_line_naming_it(etcd_url):
    a = _agent(etcd_url, "a")
    a.register()
    try:
        a.etcd.put(a.key("round"), "not json")
        with pytest.raises(rendezvous.ForeignRecord, match=r"etcd key .*round holds 'not json', not a tfgpu"):
            a.current()
        a.etcd.put(a.key("outcome"), json.dumps({"code": 1}))
        with pytest.raises(rendezvous.ForeignRecord, match=r"outcome holds .* use another --rendezvous JOB_ID"):
            a.outcome()
    finally:
        a.leave()
