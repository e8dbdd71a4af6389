"""One host's agent of a job across hosts (``tfgpu.launch --rendezvous=etcd://HOST:PORT/JOB``): it joins the
job's rounds (``runtime/rendezvous.py``), starts this host's workers of each round with the round's TF_CONFIGs
and supervises them like the one-host launcher (``runtime/supervisor.py``). Whatever ends a round (a local worker
failed or hung, a member host's lease expired, a host joined, another agent started a new round) stops this
host's workers (SIGTERM, SIGKILL after --stop_grace_s) and the agents form the next round on the hosts alive; the
new group resumes from the newest checkpoint in the shared --model_dir, exactly, on its topology. A round a failure
started carries its ``restart`` record, which the new chief writes to history.jsonl with the step it restored
(``restarts.RECORD_ENV``), whatever the --model_dir (local or ``gs://``) and whichever host it runs on.
"""
import contextlib
import dataclasses
import os
import signal
import time

from tfgpu.runtime import rendezvous, restarts
from tfgpu.runtime.launcher import LaunchError, free_ports
from tfgpu.runtime.supervisor import Launcher
from tfgpu.runtime import failures as exit_codes


@dataclasses.dataclass(frozen=True)
class RoundChanged:
    """Another agent started a new round while this host's workers ran."""
    number: int


@dataclasses.dataclass(frozen=True)
class HostsLost:
    """Member hosts whose registration vanished (lease expired) while the round ran."""
    hosts: tuple


class HostAgent(Launcher):
    """``Launcher`` whose groups are the job's rounds: ``args.num_workers`` / ``args.min_workers`` count the whole
    job's workers, ``args.workers_per_host`` this host's."""

    def __init__(self, args, worker_args, rdzv: rendezvous.Rendezvous, out=None, err=None, train_batches=None):
        super().__init__(args, worker_args, out, err, train_batches)
        self.rdzv = rdzv
        self.local = args.workers_per_host
        self.round = None
        self._next_check = 0.0
        self._pending_line = None  # a restart this agent decided: its line says the step once the group restored

    def prepare(self):
        total = self.args.num_workers
        self.args.num_workers = self.local  # the slots (cores, GPUs) are this host's
        try:
            super().prepare()
        finally:
            self.args.num_workers = total

    def start(self, slots=None, configs=None):
        saved, self.args.num_workers = self.args.num_workers, self.local
        try:
            super().start(slots, configs)
        finally:
            self.args.num_workers = saved

    def run(self) -> int:
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            self.prepare()
            self._check_job_is_open()
            self.rdzv.register()
            self.say(f"registered as host {self.rdzv.host} ({self.local} worker(s)) in {self.rdzv.etcd.url} "
                     f"{self.rdzv.prefix}")
            while True:
                joined = self._join()
                if isinstance(joined, int):
                    return joined
                self.round, configs = joined
                self._handoff = restarts.handoff(self.round.record) if self.round.record else None
                self.start(range(self.local), configs)
                outcome = self._supervise()
                code = self._after(outcome)
                if code is not None:
                    return code
        finally:
            self.stop(grace_s=0.0)
            with contextlib.suppress(rendezvous.RendezvousError):
                self.rdzv.leave()
            for s, handler in previous.items():
                signal.signal(s, handler)

    def _check_job_is_open(self):
        """A job id whose job ended (finished, or stopped unfinished) in etcd cannot be joined again: its keys
        would end this agent at once. LaunchError naming --rendezvous, before anything starts."""
        outcome, current = self.rdzv.outcome(), self.rdzv.current()
        finished = current is not None and self.rdzv.done(current.number, current.members)
        ended = outcome["line"] if outcome else (f"finished in round {current.number}" if finished else None)
        if ended:
            raise LaunchError(f"--rendezvous={self.args.rendezvous}: this job id already ended ({ended}); start "
                              "every agent with a new JOB_ID (the run resumes from --model_dir all the same)")

    # -- forming a round --------------------------------------------------------------------------------------

    def _join(self):
        """(round, this host's TF_CONFIGs) of the next round that includes this host; or the job's exit code
        when it ended (finished without this host, stopped unfinished, interrupted, timed out)."""
        deadline = time.monotonic() + self.args.rendezvous_timeout_s
        enough_since = None
        while time.monotonic() < deadline:
            if self._signal is not None:
                return 128 + self._signal
            try:
                joined = self._join_step(enough_since)
            except rendezvous.ForeignRecord:
                raise
            except rendezvous.RendezvousError as e:
                self.say(f"warning: {e}; trying again")
                time.sleep(1.0)
                continue
            if joined is None or isinstance(joined, float):
                enough_since = joined
            else:
                return joined
            time.sleep(0.2)
        raise LaunchError(f"no group including this host formed within --rendezvous_timeout_s="
                          f"{self.args.rendezvous_timeout_s:g} (fewer than --min_workers={self.args.min_workers} "
                          f"workers registered in {self.rdzv.etcd.url}?)")

    def _join_step(self, enough_since):
        """One look at the rendezvous while joining: (round, TF_CONFIGs) of a round this host is in, or the job's
        exit code when it ended; else the time enough hosts for a first group were first seen (None: not yet)."""
        outcome = self.rdzv.outcome()
        if outcome:
            self.say(f"the job stopped: {outcome['line']}")
            return outcome["code"]
        current, alive = self.rdzv.current(), self.rdzv.alive()
        fresh = current is not None and (self.round is None or current.number > self.round.number)
        if fresh and self.rdzv.host in current.members:
            self.rdzv.publish(current.number, free_ports(self.local))
            published = rendezvous.wait_for_members(self.rdzv, current, self.args.rendezvous_timeout_s)
            if published is not None:
                self.say(f"round {current.number}: {len(current.members)} host(s) x {self.local} worker(s) "
                         f"({current.reason})")
                return current, rendezvous.tf_configs(current.members, published)[self.rdzv.host]
            latest = self.rdzv.current()
            if latest is not None and latest.number == current.number:  # a member left before it started
                members = self._members(self.rdzv.alive())[0]
                record = latest.record and {**latest.record, "workers_after": len(members) * self.local}
                self._propose(latest, latest.restarts, "a member left while the group formed", members, record)
            return enough_since
        if current is not None and self.rdzv.done(current.number, current.members):
            self.say(f"the job finished in round {current.number} without this host")
            return exit_codes.OK
        members, _ = self._members(alive)
        if current is None:
            if members and enough_since is None:
                enough_since = time.monotonic()
            if members and (len(alive) * self.local >= self.args.num_workers
                            or time.monotonic() - enough_since >= self.args.join_grace_s):
                self._propose(None, 0, f"first group of {len(members)} host(s)")
        elif self.rdzv.host in members and len(members) > len(current.members):
            self._propose(current, current.restarts,
                          f"host {self.rdzv.host} joined: {len(current.members)} -> {len(members)} host(s)")
        return enough_since

    def _members(self, alive):
        return rendezvous.choose_members(alive, self.local, self.args.min_workers, self.args.num_workers, self.fits)

    def _propose(self, after, restarts_so_far, reason, members=None, record=None):
        """Proposes the next round on the hosts alive; whether this agent's proposal is the one written."""
        members = members or self._members(self.rdzv.alive())[0]
        if not members:
            return False
        _, won = self.rdzv.propose(after, members, restarts_so_far, reason, record)
        return won

    # -- while a round runs -----------------------------------------------------------------------------------

    def _group_size(self) -> int:
        return len(self.round.members) * self.local

    def _membership_change(self):
        now = time.monotonic()
        if now < self._next_check:
            return None
        self._next_check = now + 0.5
        try:
            current = self.rdzv.current()
            if current is None or current.number != self.round.number:
                return RoundChanged(current.number if current else 0)
            alive = self.rdzv.alive()
            lost = tuple(m for m in self.round.members if m not in alive)
            if lost and not self.rdzv.done(self.round.number, self.round.members):
                return HostsLost(lost)
        except rendezvous.ForeignRecord:
            raise
        except rendezvous.RendezvousError as e:
            self.say(f"warning: {e}")
        return None

    def _after(self, outcome):
        """What follows a round's end: the job's exit code, or None to join the next round."""
        if outcome == exit_codes.OK:
            self.rdzv.mark_done(self.round.number)
            return exit_codes.OK
        if isinstance(outcome, RoundChanged):
            self.say(f"round {self.round.number} ended: round {outcome.number} started; stopping this host's "
                     f"{len(self.workers)} worker(s)")
            self.stop(self.args.stop_grace_s)
            return None
        if isinstance(outcome, int):  # interrupted: this host leaves, the others go on without it
            return outcome
        if isinstance(outcome, HostsLost):
            first = self.round.members.index(outcome.hosts[0]) * self.local
            failure = restarts.Failure(first, -1, exit_codes.WORKER_LOST,
                                       f"was lost with host {outcome.hosts[0]} (its etcd lease expired)",
                                       last_step=self._last_step())
            self.say(f"host(s) {', '.join(outcome.hosts)} lost; stopping this host's {len(self.workers)} worker(s)")
            self.stop(self.args.stop_grace_s)
            failure = self._stopped(failure)
        else:
            failure = dataclasses.replace(outcome, worker=self._global_index(outcome.worker))
        return self._next_round(failure)

    def _global_index(self, local_index):
        return self.round.members.index(self.rdzv.host) * self.local + local_index

    def _next_round(self, failure):
        """After ``failure`` ended this host's group: the next round proposed (None), or the job's exit code."""
        current = self._settled(failure)
        if current is None or current.number != self.round.number:
            return None  # another agent started the next round already: this failure is an echo of its cause
        alive = self.rdzv.alive()
        lost = [m for m in self.round.members if m not in alive]
        if lost and failure.code == exit_codes.WORKER_LOST:  # the peer it lost was a whole host: name that host
            failure = dataclasses.replace(failure, worker=self.round.members.index(lost[0]) * self.local,
                                          reason=f"was lost with host {lost[0]} (its etcd lease expired)")
        line = f"worker {failure.worker} {failure.reason}"
        max_restarts = self.args.max_restarts
        if not failure.retryable:
            return self._end(failure.exit_code, f"{line}; a restart would fail the same way")
        if current.restarts >= max_restarts:
            return self._end(failure.exit_code, f"{line}; no restart left (--max_restarts={max_restarts})")
        members, why = self._members(alive)
        if not members:
            return self._end(failure.exit_code, f"{line}; cannot restart: {why}")
        failed_at = time.time()
        number = current.restarts + 1
        before, after = len(current.members) * self.local, len(members) * self.local
        # The step resumed from is known once the new group restored: the members still running save a checkpoint
        # when they are stopped, after this. So the round carries the record and the new chief writes it then.
        record = restarts.restart_record(number, failure, before, after, None, failed_at)
        if self._propose(current, number, f"restart {number}: {line}", members, record):
            self.say(restarts.restart_line(number, max_restarts, failure, before, after, None))
            self._pending_line = (number, failure, after)
            self._recovering = (number, failed_at)
        return None

    def _note_recovery(self):
        """Once the new group restored its checkpoint (its first heartbeat): the step it resumed from and the steps
        lost, in a line; then the base class's line when it finished its first loop."""
        beats = [w.beat for w in self.workers if w.beat]
        if self._pending_line is not None and beats:
            number, failure, after = self._pending_line
            self._pending_line = None
            restored = [b["step"] for b in beats if b["phase"] == "restored"]
            resumed = restored[0] if restored else restarts.checkpoint_step(self._model_dir())
            lost = restarts.steps_lost(failure.last_step, resumed)
            self.say(f"restart {number}: the new group of {after} resumed from step {resumed}"
                     + (f" ({lost} step(s) lost)" if lost is not None else ""))
        super()._note_recovery()

    def _settled(self, failure):
        """The current round once the failure's cause had time to show: a worker that lost a peer (129) waits up
        to the lease TTL for the host it lost to vanish or another agent to start the next round, so the next
        round leaves the lost host out and names it."""
        deadline = time.monotonic() + (self.rdzv.ttl_s + 1.0 if failure.code == exit_codes.WORKER_LOST else 0.0)
        while True:
            current = self.rdzv.current()
            alive = self.rdzv.alive()
            if current is None or current.number != self.round.number or time.monotonic() >= deadline or any(
                    m not in alive for m in self.round.members):
                return current
            time.sleep(0.2)

    def _end(self, code, line):
        self.rdzv.end(code, line)
        self.say(f"error: {line}; exit {code}")
        return code

    def _model_dir(self):
        return next((w.beat.get("model_dir") for w in self.workers if w.beat and w.beat.get("model_dir")), "")


def host_id(address: str) -> str:
    """This agent's name in the rendezvous: its address and process id (a host that comes back is a new member)."""
    return f"{address}-{os.getpid()}"
