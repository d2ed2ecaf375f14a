"""The metadata quorum's consensus: one member's Raft core (sans-IO).

Theory of operation
-------------------
A Raft group of a few *voters* (3 or 5) keeps a replicated log of opaque
commands; every other member of the cluster is a *learner*, which gets the
committed log like a voter but never votes, never campaigns, and whose
acknowledgements count toward nothing. This object is one member's core: it is
told what happened (``tick``, ``receive``, ``propose``, ``persisted``,
``snapshot_taken``, ``set_learners``) with the time ``now``, and answers with
actions its shell runs in order (``RaftSend``, ``RaftPersist``, ``RaftApply``,
``RaftRestore``, ``RaftSnapshotWanted``, ``RaftRoleChanged``). Randomness
comes only from the injected ``rng``; it reads no clock and does no I/O. The
messages and their validation are cluster/raftwire.py's, the log in memory
cluster/raftlog.py's.

Elections (the paper's section 5.2 with the thesis' PreVote, section 9.6). A
voter that heard no leader for a random time in ``[election_timeout,
2*election_timeout)`` first asks the voters whether they WOULD vote for it in
the next term (``RequestVote(prevote=True)``), without raising its own term; only
with a majority of yeses does it raise its term, vote for itself and ask for
real. So a member cut off from the others does not come back with a term that
deposes a healthy leader. A voter refuses (pre)votes for ``election_timeout``
after it last heard a leader (leader stickiness), and for ``election_timeout``
after it started (it may have heard one just before it crashed); a leader
refuses them while it leads. A voter votes
once per term, for a candidate whose log is at least as up to date as its own.

Persist before act. Term, vote and log live on the shell's disk: a change asks
for a ``RaftPersist`` (one per event, tokens rising) and counts only once the
shell says ``persisted(token)``. Every reply (a vote, an AppendEntries or
InstallSnapshot answer) and every real RequestVote is held back until the
persists issued before it are synced, and leaves from ``persisted()``; a
candidate counts its own vote, and a leader its own log, only from what is
synced. A crash between a persist and its ``persisted`` loses it (the shell
rebuilds ``Stored`` from what was synced) and nothing has been promised from it.
Only a leader's AppendEntries go out before its own write: a follower's copy
counts as soon as the follower has it on disk.

Replication (section 5.3). A leader writes a no-op entry (an empty command)
when it begins, so that it can commit: it commits an index once a majority of
voters (itself by its synced log) hold it, and only if the entry there is of its
own term; earlier entries are committed with it by log matching. Per peer it
keeps ``match`` (known to be replicated) and ``next`` (what to send next, sent
ahead optimistically); every ``heartbeat_interval`` it sends each peer what it
has not acknowledged, from ``match + 1`` (a peer that has not answered yet is
probed from ``next``). A follower refusing an AppendEntries gives a ``hint``
where to retry: its end + 1, or the first index of the term that conflicts.
Committed entries are handed to the host in order (``RaftApply``), once per life
of the core. Once ``snapshot_entries`` are applied past the last snapshot the
core asks for a new one (``RaftSnapshotWanted``); the host answers with
``snapshot_taken`` and the log is cut there. A peer that needs an entry the log
no longer holds gets the snapshot in one ``InstallSnapshot`` (``RaftRestore`` on
its host; its persist installs it and cuts every entry after it); a
core started from a stored snapshot emits ``RaftRestore`` for it from its first
event (``next_deadline`` is due at once).

CheckQuorum and the lease. A leader that has not heard from a majority of voters
(itself included) within ``election_timeout`` steps down. ``lease_valid(now)``
is True while a majority of voters acknowledged AppendEntries the leader SENT
after ``now - election_timeout`` (each carries a ``seq``, echoed in the reply).
Such a voter received it after it was sent, so it refuses votes until at least
``election_timeout`` after the send: no other leader can be elected before the
lease runs out, if the members' clocks run at the same rate (etcd's lease read
makes the same assumption). ``propose`` returns None without the lease.

Deliberate breaks (``breaks``, for the tests' campaign to show it catches them):
``raft-no-persist-wait`` answers and counts before ``persisted``;
``raft-count-old-term`` commits an earlier term's entry by counting its copies.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from roost.cluster.raftactions import (
    RaftAction,
    RaftApply,
    RaftPersist,
    RaftRestore,
    RaftRoleChanged,
    RaftSend,
    RaftSettings,
    RaftSnapshotWanted,
    Stored,
)
from roost.cluster.raftlog import RaftLog
from roost.cluster.raftwire import (
    AppendEntries,
    AppendReply,
    InstallSnapshot,
    RaftMessage,
    RequestVote,
    SnapshotReply,
    VoteReply,
)

FOLLOWER = "follower"
PRECANDIDATE = "precandidate"
CANDIDATE = "candidate"
LEADER = "leader"

__all__ = [
    "CANDIDATE", "FOLLOWER", "LEADER", "PRECANDIDATE", "Raft", "RaftAction", "RaftApply", "RaftPersist",
    "RaftRestore", "RaftRoleChanged", "RaftSend", "RaftSettings", "RaftSnapshotWanted", "Stored",
]  # fmt: skip


@dataclass(slots=True)
class Progress:
    """A leader's view of one peer."""

    next: int  # the next index to send (ahead of what is acknowledged while messages are in flight)
    match: int = 0  # the peer's log matches ours up to here
    heard: float = -math.inf  # when it last answered in our term (CheckQuorum)
    acked: float = -math.inf  # when we sent the latest AppendEntries it acknowledged (the lease)
    snapshot_sent: float = -math.inf


class Raft:
    def __init__(
        self,
        me: str,
        voters: tuple[str, ...],
        learners: tuple[str, ...],
        settings: RaftSettings,
        rng: random.Random,
        stored: Stored,
        now: float,
        breaks: frozenset[str] = frozenset(),  # deliberately broken rules, for the tests (module docstring)
    ) -> None:
        self.me = me
        self.voters = tuple(voters)
        self.learners = tuple(learners)
        self.s = settings
        self._rng = rng
        self._no_persist_wait = "raft-no-persist-wait" in breaks
        self._count_old_term = "raft-count-old-term" in breaks
        self._voter = me in self.voters
        self._quorum = len(self.voters) // 2 + 1
        self.term = stored.term
        self.vote = stored.vote
        self.log = RaftLog(stored.snapshot_index, stored.snapshot_term, stored.entries)
        self._snapshot = stored.snapshot
        self.commit_index = self.applied_index = stored.snapshot_index
        self.role = FOLLOWER
        self.leader: str | None = None
        self._shown: tuple[str, int, str | None] = (self.role, self.term, self.leader)
        self._start = now
        self._restore_due = stored.snapshot is not None and stored.snapshot_index > 0
        self._quiet_until = now + settings.election_timeout  # no votes: we may have heard a leader before a crash
        self._election_at = now + self._timeout()
        self._heartbeat_at = math.inf
        self._votes: set[str] = set()
        self._vote_token: int | None = None  # the persist holding our vote for ourselves
        self._vote_unflushed = False
        self._peers: dict[str, Progress] = {}
        self._seq = 0
        self._sent: dict[int, float] = {}  # seq -> when that AppendEntries was sent (within election_timeout)
        self._asked = stored.snapshot_index  # the applied index we last asked a snapshot at
        # Persistence: what this event changed, what is issued, what is synced.
        self._token = 0
        self._synced = 0
        self._durable = self.log.last_index  # our log is on disk and matches memory up to here
        self._pending: dict[int, int] = {}  # token -> what the log's synced end will be once it is synced
        self._deferred: list[tuple[int, RaftSend]] = []
        self._meta_dirty = False
        self._truncate: int | None = None
        self._new_entries: list[tuple[int, int, bytes]] = []
        self._new_snapshot: tuple[int, int, bytes] | None = None
        self._out: list[RaftAction] = []
        self._after_sync: list[RaftSend] = []

    # -- queries -------------------------------------------------------------------------------------------

    @property
    def last_index(self) -> int:
        return self.log.last_index

    def next_deadline(self) -> float:
        if self._restore_due:
            return self._start
        if self.role == LEADER:
            return self._heartbeat_at
        return self._election_at if self._voter else math.inf

    def lease_valid(self, now: float) -> bool:
        """A majority of voters acknowledged what we sent after ``now - election_timeout``: nobody else leads."""
        if self.role != LEADER:
            return False
        cutoff = now - self.s.election_timeout
        acked = 1 + sum(1 for v in self.voters if v != self.me and self._peers[v].acked > cutoff)
        return acked >= self._quorum

    # -- events ---------------------------------------------------------------------------------------------

    def tick(self, now: float) -> list[RaftAction]:
        if self.role == LEADER:
            if now >= self._heartbeat_at:
                et = self.s.election_timeout
                heard = 1 + sum(1 for v in self.voters if v != self.me and now - self._peers[v].heard < et)
                if heard < self._quorum:  # CheckQuorum
                    self._become_follower(self.term, None, now)
                else:
                    self._heartbeat(now)
        elif self._voter and now >= self._election_at:
            self._campaign(now, prevote=True)
        return self._flush()

    def propose(self, command: bytes, now: float) -> tuple[int | None, list[RaftAction]]:
        """Append ``command`` if we lead with a valid lease: its index (it may still be lost), or None."""
        if len(command) > self.s.max_command_bytes or not self.lease_valid(now):
            return None, self._flush()
        index = self._append(self.term, command)
        for peer, progress in self._peers.items():
            if progress.next == index:
                self._send_append(peer, now)
        self._maybe_commit()
        return index, self._flush()

    def persisted(self, token: int, now: float) -> list[RaftAction]:
        token = min(token, self._token)
        if token <= self._synced:
            return self._flush()
        self._synced = token
        for t in [t for t in self._pending if t <= token]:
            self._durable = max(self._durable, self._pending.pop(t))
        released = [send for t, send in self._deferred if t <= token]
        self._deferred = [(t, send) for t, send in self._deferred if t > token]
        self._out.extend(released)
        if self.role == CANDIDATE and self._vote_token is not None and self._vote_token <= token:
            self._votes.add(self.me)
            self._check_won(now)
        self._maybe_commit()
        return self._flush()

    def snapshot_taken(self, index: int, data: bytes, now: float) -> list[RaftAction]:
        """The host's state at ``index`` (<= applied): the log before it goes."""
        if self.log.base < index <= self.applied_index:
            term = self.log.term_at(index)
            assert term is not None
            self.log.compact(index)
            self._snapshot = data
            self._new_snapshot = (index, term, data)
        return self._flush()

    def set_learners(self, learners: tuple[str, ...], now: float) -> list[RaftAction]:
        self.learners = tuple(learners)
        if self.role == LEADER:
            members = set(self.voters) | set(self.learners)
            for gone in [p for p in self._peers if p not in members]:
                del self._peers[gone]
            for peer in self.learners:
                if peer != self.me and peer not in self._peers:
                    self._peers[peer] = Progress(self.log.last_index + 1, heard=now)
                    self._send_append(peer, now)
        return self._flush()

    def receive(self, src: str, msg: RaftMessage, now: float) -> list[RaftAction]:
        if src == self.me or (src not in self.voters and src not in self.learners):
            return self._flush()
        if isinstance(msg, RequestVote):
            self._on_request_vote(src, msg, now)
        elif isinstance(msg, VoteReply):
            self._on_vote_reply(src, msg, now)
        elif isinstance(msg, AppendEntries | InstallSnapshot):
            self._on_leader_message(src, msg, now)
        else:
            self._on_reply(src, msg, now)
        return self._flush()

    # -- elections ------------------------------------------------------------------------------------------

    def _timeout(self) -> float:
        return self.s.election_timeout * (1.0 + self._rng.random())

    def _campaign(self, now: float, prevote: bool) -> None:
        self._election_at = now + self._timeout()
        self.leader = None
        self._votes = {self.me} if prevote else set()
        if prevote:
            self.role = PRECANDIDATE
            term = self.term + 1
        else:
            self.role = CANDIDATE
            self.term += 1
            self.vote = self.me
            self._meta_dirty = True
            self._vote_token = None
            self._vote_unflushed = True
            term = self.term
            if self._no_persist_wait:
                self._votes.add(self.me)
        ask = RequestVote(term, self.log.last_index, self.log.last_term, prevote)
        for v in self.voters:
            if v != self.me:
                (self._out if prevote else self._after_sync).append(RaftSend(v, ask))
        self._check_won(now)

    def _check_won(self, now: float) -> None:
        if len(self._votes) < self._quorum:
            return
        if self.role == PRECANDIDATE:
            self._campaign(now, prevote=False)
        elif self.role == CANDIDATE:
            self._become_leader(now)

    def _become_leader(self, now: float) -> None:
        self.role = LEADER
        self.leader = self.me
        self._sent.clear()
        next_index = self.log.last_index + 1
        self._peers = {
            p: Progress(next_index, heard=now) for p in (*self.voters, *self.learners) if p != self.me
        }  # fmt: skip
        self._append(self.term, b"")  # the no-op: what lets this term commit
        self._heartbeat(now)

    def _become_follower(self, term: int, leader: str | None, now: float) -> None:
        if term > self.term:
            self.term = term
            self.vote = None
            self._meta_dirty = True
        self.role = FOLLOWER
        self.leader = leader
        self._peers = {}
        self._election_at = now + self._timeout()

    def _up_to_date(self, msg: RequestVote) -> bool:
        return (msg.last_term, msg.last_index) >= (self.log.last_term, self.log.last_index)

    def _on_request_vote(self, src: str, msg: RequestVote, now: float) -> None:
        if not self._voter or src not in self.voters:
            return
        free = now >= self._quiet_until and self.role != LEADER  # leader stickiness
        if msg.prevote:
            grant = msg.term > self.term and free and self._up_to_date(msg)
            self._reply(src, VoteReply(msg.term if grant else self.term, grant, True))
            return
        if msg.term < self.term:
            self._reply(src, VoteReply(self.term, False, False))
            return
        if msg.term > self.term:
            if not free:
                return  # ignored, term not raised: a live leader is not deposed
            self._become_follower(msg.term, None, now)
        grant = free and self.vote in (None, src) and self._up_to_date(msg)
        if grant:
            self.vote = src
            self._meta_dirty = True
            self._election_at = now + self._timeout()
        self._reply(src, VoteReply(self.term, grant, False))

    def _on_vote_reply(self, src: str, msg: VoteReply, now: float) -> None:
        if src not in self.voters:
            return
        if msg.prevote:
            if self.role != PRECANDIDATE:
                return
            if msg.granted and msg.term == self.term + 1:
                self._votes.add(src)
                self._check_won(now)
            elif not msg.granted and msg.term > self.term:
                self._become_follower(msg.term, None, now)
            return
        if msg.term > self.term:
            self._become_follower(msg.term, None, now)
        elif self.role == CANDIDATE and msg.term == self.term and msg.granted:
            self._votes.add(src)
            self._check_won(now)

    # -- following ------------------------------------------------------------------------------------------

    def _reply(self, to: str, msg: RaftMessage) -> None:
        """Answers leave once everything persisted so far is synced (``_flush``)."""
        self._after_sync.append(RaftSend(to, msg))

    def _on_leader_message(self, src: str, msg: AppendEntries | InstallSnapshot, now: float) -> None:
        if src not in self.voters:
            return
        if msg.term < self.term:  # a stale leader: our term makes it step down
            if isinstance(msg, AppendEntries):
                self._reply(src, AppendReply(self.term, False, 0, 0, msg.seq))
            else:
                self._reply(src, SnapshotReply(self.term, 0))
            return
        if self.role == LEADER and msg.term == self.term:
            return  # cannot happen (one leader per term)
        if msg.term > self.term or self.role != FOLLOWER or self.leader != src:
            self._become_follower(msg.term, src, now)
        self._quiet_until = now + self.s.election_timeout
        self._election_at = now + self._timeout()
        if isinstance(msg, AppendEntries):
            self._on_append(src, msg)
        else:
            self._on_snapshot(src, msg)

    def _on_append(self, src: str, msg: AppendEntries) -> None:
        prev, entries = msg.prev_index, msg.entries
        log = self.log
        if prev < log.base:  # what the snapshot covers is committed, so it matches
            skip = log.base - prev
            if skip >= len(entries):
                self._reply(src, AppendReply(self.term, True, log.base, 0, msg.seq))
                return
            prev, entries = log.base, entries[skip:]
        else:
            term = log.term_at(prev)
            if term is None:
                self._reply(src, AppendReply(self.term, False, 0, log.last_index + 1, msg.seq))
                return
            if term != msg.prev_term:
                self._reply(src, AppendReply(self.term, False, 0, log.first_of_term(prev), msg.seq))
                return
        for k, (term, _) in enumerate(entries):
            index = prev + 1 + k
            mine = log.term_at(index)
            if mine == term:
                continue
            if mine is not None:
                self._truncate_after(index - 1)
            for t, c in entries[k:]:
                self._append(t, c)
            break
        last_new = prev + len(entries)
        if msg.commit > self.commit_index and last_new > self.commit_index:
            self._commit(min(msg.commit, last_new))
        self._reply(src, AppendReply(self.term, True, last_new, 0, msg.seq))

    def _on_snapshot(self, src: str, msg: InstallSnapshot) -> None:
        # (a snapshot at or below our commit changes nothing: it is only answered)
        if msg.index > self.commit_index and self.log.term_at(msg.index) == msg.snap_term:
            self._commit(msg.index)  # (we hold its last entry: our log up to it is right)
        elif msg.index > self.commit_index:
            # Everything goes, committed entries too: the snapshot holds them. The store installs a
            # persist's snapshot before its cut (cluster/raftstate.py), so the cut is after the
            # snapshot's index: with it, nothing of the old log is left, whatever was cut before.
            old = self.log.base
            self._new_entries = []
            self._truncate = msg.index
            self._durable = min(self._durable, old)
            self._pending = {t: min(end, old) for t, end in self._pending.items()}
            self.log.reset(msg.index, msg.snap_term)
            self._snapshot = msg.data
            self._new_snapshot = (msg.index, msg.snap_term, msg.data)
            self.commit_index = self.applied_index = msg.index
            self._out.append(RaftRestore(msg.index, msg.data))
        self._reply(src, SnapshotReply(self.term, msg.index))

    # -- leading --------------------------------------------------------------------------------------------

    def _on_reply(self, src: str, msg: AppendReply | SnapshotReply, now: float) -> None:
        if msg.term > self.term:
            self._become_follower(msg.term, None, now)
            return
        peer = self._peers.get(src)
        if self.role != LEADER or msg.term != self.term or peer is None:
            return
        peer.heard = now
        if isinstance(msg, SnapshotReply):
            if peer.match < msg.index <= self.log.base:  # (only a snapshot we hold: never past our log)
                peer.match = msg.index
                peer.next = max(peer.next, msg.index + 1)
                peer.snapshot_sent = -math.inf
        else:
            sent = self._sent.get(msg.seq)
            if sent is not None:
                peer.acked = max(peer.acked, sent)
            if not msg.success:
                back = max(peer.match + 1, min(msg.hint, peer.next))
                if back < peer.next:
                    peer.next = back
                    self._send_append(src, now)
                return
            if msg.match_index > peer.match:
                peer.match = min(msg.match_index, self.log.last_index)
                peer.next = max(peer.next, peer.match + 1)
        self._maybe_commit()
        if peer.next <= self.log.last_index:
            self._send_append(src, now)

    def _heartbeat(self, now: float) -> None:
        self._heartbeat_at = now + self.s.heartbeat_interval
        cutoff = now - self.s.election_timeout
        while self._sent:
            seq, sent = next(iter(self._sent.items()))
            if sent > cutoff:
                break
            del self._sent[seq]
        for peer, progress in self._peers.items():
            if progress.match:  # resend what is not acknowledged (a peer not heard yet is probed from ``next``)
                progress.next = min(progress.next, progress.match + 1)
            self._send_append(peer, now)

    def _send_append(self, peer: str, now: float) -> None:
        progress = self._peers[peer]
        log = self.log
        if progress.next <= log.base:  # compacted away: the snapshot, again if unanswered for a while
            if self._snapshot is not None and now - progress.snapshot_sent >= self.s.election_timeout / 2:
                progress.snapshot_sent = now
                self._out.append(RaftSend(peer, InstallSnapshot(self.term, log.base, log.base_term, self._snapshot)))
            return
        entries = log.slice(progress.next, self.s.max_append_entries, self.s.max_append_bytes)
        prev = progress.next - 1
        prev_term = log.term_at(prev)
        assert prev_term is not None
        self._seq += 1
        self._sent[self._seq] = now
        self._out.append(
            RaftSend(peer, AppendEntries(self.term, prev, prev_term, entries, self.commit_index, self._seq))
        )
        progress.next = prev + len(entries) + 1

    def _maybe_commit(self) -> None:
        if self.role != LEADER:
            return
        own = self.log.last_index if self._no_persist_wait else min(self._durable, self.log.last_index)
        matches = sorted((own if v == self.me else self._peers[v].match for v in self.voters), reverse=True)
        index = matches[self._quorum - 1]
        if index > self.commit_index and (self._count_old_term or self.log.term_at(index) == self.term):
            self._commit(index)

    # -- the log and its persistence ------------------------------------------------------------------------

    def _append(self, term: int, command: bytes) -> int:
        index = self.log.append(term, command)
        self._new_entries.append((index, term, command))
        return index

    def _truncate_after(self, index: int) -> None:
        assert index >= self.commit_index, "a committed entry is never cut"
        self.log.truncate_after(index)
        self._new_entries = [e for e in self._new_entries if e[0] <= index]
        self._truncate = index if self._truncate is None else min(self._truncate, index)
        self._durable = min(self._durable, index)
        self._pending = {t: min(end, index) for t, end in self._pending.items()}

    def _commit(self, index: int) -> None:
        self.commit_index = index
        while self.applied_index < index:
            self.applied_index += 1
            self._out.append(RaftApply(self.applied_index, self.log.command(self.applied_index)))

    def _flush(self) -> list[RaftAction]:
        """This event's actions: the restore due at start, its persist, then the rest (answers held back)."""
        out: list[RaftAction] = []
        if self._restore_due:
            self._restore_due = False
            assert self._snapshot is not None
            out.append(RaftRestore(self.log.base, self._snapshot))
        if self._meta_dirty or self._truncate is not None or self._new_entries or self._new_snapshot:
            self._token += 1
            out.append(RaftPersist(self._token, self.term, self.vote, self._truncate, self._new_entries,
                                   self._new_snapshot))  # fmt: skip
            self._pending[self._token] = self.log.last_index
            self._meta_dirty, self._truncate, self._new_entries, self._new_snapshot = False, None, [], None
            if self._vote_unflushed:
                self._vote_token = self._token
        self._vote_unflushed = False
        out.extend(self._out)
        self._out = []
        if self._after_sync:
            if self._synced < self._token and not self._no_persist_wait:
                self._deferred.extend((self._token, send) for send in self._after_sync)
            else:
                out.extend(self._after_sync)
            self._after_sync = []
        if self.applied_index - max(self.log.base, self._asked) >= self.s.snapshot_entries:
            self._asked = self.applied_index
            out.append(RaftSnapshotWanted(self.applied_index))
        shown = (self.role, self.term, self.leader)
        if shown != self._shown:
            self._shown = shown
            out.append(RaftRoleChanged(*shown))
        return out
