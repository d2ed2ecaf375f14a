"""Who leads each durable partition, as the metadata quorum decides it (sans-IO).

Theory of operation (docs/durable.md, "Who leads a partition")
----------------------------------------------------------------
Durable partitions are led the way Kafka's KRaft leads them. A Raft group of a few
voter members (cluster/raft.py) keeps a log of metadata commands; every member
applies the committed ones, in order, to a ``Metadata``: for each durable partition
its ``Leadership``, the *replicas* that hold its log (the preferred leader first),
the *leader* and its *epoch*, and the *in-sync replicas* (ISR). Nothing else makes
a leader: a member leads partition ``p`` at epoch ``e`` only once it has applied a
command that says so, and the data path (cluster/partitionlog.py) fences every
fetch and answer by that epoch.

One command, ``SET``, replaces a partition's leadership, and only if the version it
names is the partition's version when it is applied (compare-and-set): two
decisions made from the same state never both apply, and every member applies the
same ones, because the check runs at apply time on the committed log. ``apply``
also refuses what would break the rules below, whoever proposed it:

- the epoch never falls, and rises whenever the leader changes (also to none);
- a leader is a member of the ISR, and a new epoch's ISR is part of the one before
  (no unclean election: a replica that may lack a committed record never leads; only
  the leader of an epoch adds to its ISR);
- the ISR is a non-empty subset of the replicas.

A put is committed when the leader and every member of its ISR have it on disk and
the ISR has at least ``min_insync`` members, so every committed record is on every
member of every later ISR: the ISR shrinks only through a ``SET`` (the leader asks
when a follower falls behind for ``isr_lag_time``, never below ``min_insync``), and
a new leader is chosen only from it. A leader that asks to add a caught-up follower
counts it at once (Kafka's "maximal ISR"): the committed ISR is then never larger
than the one the leader counts.

The controller is whichever member leads the Raft group (and holds its lease).
``decide`` is its whole policy, a pure function of the metadata, the placed members
and its own view of the live ones; what it returns it proposes, and what commits is
applied by everyone:

- a partition with no leadership gets one: its replicas are the first ``replicas``
  members of its preference list (client/clustermap.py: the same placement as the
  reliable map, so a topic's durable leader is its map primary whenever that one is
  in sync), its ISR all of them (a new log is empty everywhere);
- a leader the controller does not see live is replaced by the first live member of
  the ISR (in replica order) that is not a suspect (below); it stays in the ISR, and
  the new leader drops it once it has begun, as any follower it holds down; with no
  such member the partition gets no leader (a higher epoch fences the old one) until
  one returns;
- the controller drops nobody from the ISR itself: a leader that has begun its epoch
  asks to drop a follower its member holds down (failure detection) or that lags for
  ``isr_lag_time``, never below ``min_insync``. Only a leader that began holds every
  committed record, so only it may say who no longer needs to;
- a live, in-sync replica ahead of the leader in replica order takes the lead back
  (preferred leader), so leadership returns to the map's primary after a restart;
- placement changes (a join or a leave) move the replicas in two steps: first the
  new ones are added (they fetch, catch up and join the ISR), then, once every new
  one is in sync, the old ones go and a leader that goes hands over.

A member restarted under ``fsync = "interval"`` or ``"never"`` may have lost records
it had written and acknowledged: it is a *suspect* replica until it has caught up
from a leader in its new life (cluster/partitionlog.py). While in the ISR it reports
so (its log's end: last epoch, offset; ``Quorum`` keeps the reports) and ``decide``
does not name it. Named the leader all the same (before its report came), it does
not lead but *declines* (``decline``), and the controller names another live ISR
member that has not reported. Once every ISR member has reported, the one whose log
is the longest (the latest last epoch, then the most records) leads, alone in the
ISR: no record that any in-sync copy kept is cut. (A suspect leads only so: named
alone in the ISR after it declined.) While an ISR member that has not reported is
down the partition waits for it (it may hold what the others lost), as it waits for
any down ISR.

Commands and snapshots come from the committed log and the quorum's disk, which a
member of the cluster wrote: they are decoded as untrusted (``decode_untrusted_command``)
so that a bug or a garbled file makes a clear error, not a wrong leader.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from roost.client import ring
from roost.client.clustermap import preference

SET = 1  # [SET, partition, version, leader | None, epoch, isr, replicas]
MAX_PARTITIONS = 65536
MAX_REPLICAS = 8
MAX_ID = 64
EPOCH_LIMIT = 1 << 62


class CommandError(ValueError):
    """A metadata command or snapshot that does not decode: names the field."""


@dataclass(frozen=True)
class Leadership:
    replicas: tuple[str, ...]  # the members holding the log, the preferred leader first
    leader: str | None  # None: no in-sync replica is live
    epoch: int  # the leader epoch: rises with every change of leader
    isr: tuple[str, ...]  # in replica order
    version: int  # rises with every change: a SET names the version it replaces


@dataclass(frozen=True)
class SetPartition:
    partition: int
    version: int  # the version this replaces (0: the partition had none)
    leader: str | None
    epoch: int
    isr: tuple[str, ...]
    replicas: tuple[str, ...]

    def encode(self) -> bytes:
        f = [SET, self.partition, self.version, self.leader, self.epoch, list(self.isr), list(self.replicas)]
        data: bytes = msgpack.packb(f, use_bin_type=True)
        return data


def _int(v: Any, what: str, limit: int) -> int:
    if v.__class__ is not int or not 0 <= v < limit:
        raise CommandError(f"{what} must be an integer in 0..{limit - 1}")
    return v  # type: ignore[no-any-return]


def _id(v: Any, what: str) -> str:
    if v.__class__ is not str or not 0 < len(v) <= MAX_ID:
        raise CommandError(f"{what} must be a member id of 1..{MAX_ID} characters")
    return v  # type: ignore[no-any-return]


def _ids(v: Any, what: str) -> tuple[str, ...]:
    if v.__class__ is not list or not 0 < len(v) <= MAX_REPLICAS:
        raise CommandError(f"{what} must be a list of 1..{MAX_REPLICAS} member ids")
    ids = tuple(_id(m, what) for m in v)
    if len(set(ids)) != len(ids):
        raise CommandError(f"{what} names a member twice")
    return ids


def _set_fields(f: Any, what: str) -> SetPartition:
    if f.__class__ is not list or len(f) != 7 or f[0] != SET or f[0].__class__ is not int:
        raise CommandError(f"{what} must be [SET, partition, version, leader, epoch, isr, replicas]")
    leader = None if f[3] is None else _id(f[3], f"{what} leader")
    return SetPartition(_int(f[1], f"{what} partition", MAX_PARTITIONS), _int(f[2], f"{what} version", EPOCH_LIMIT),
                        leader, _int(f[4], f"{what} epoch", EPOCH_LIMIT), _ids(f[5], f"{what} isr"),
                        _ids(f[6], f"{what} replicas"))  # fmt: skip


def decode_untrusted_command(data: bytes) -> SetPartition:
    """A committed command's bytes, every field checked."""
    try:
        f = msgpack.unpackb(data, raw=False, strict_map_key=True, max_bin_len=0, max_ext_len=0)
    except Exception as exc:  # (msgpack raises several kinds for garbage)
        raise CommandError(f"command is not msgpack: {exc}") from None
    return _set_fields(f, "command")


class Metadata:
    """The state machine of the quorum's log: every member holds one and applies every committed
    command to it, in order (``apply``); the quorum's snapshots are ``snapshot`` / ``restore``."""

    def __init__(self) -> None:
        self.partitions: dict[int, Leadership] = {}
        self.applied = 0  # the index of the last command applied
        self.refused = 0  # committed commands that did not apply (a stale compare-and-set, or a bad one)

    def apply(self, index: int, command: bytes) -> int | None:
        """Apply the committed command at ``index``; the partition it changed, or None (an empty
        command, as a new Raft leader's first entry, or one refused)."""
        self.applied = max(self.applied, index)
        if not command:
            return None
        try:
            c = decode_untrusted_command(command)
        except CommandError:
            self.refused += 1
            return None
        if not self.allows(c):
            self.refused += 1
            return None
        self.partitions[c.partition] = Leadership(c.replicas, c.leader, c.epoch, c.isr, c.version + 1)
        return c.partition

    def allows(self, c: SetPartition) -> bool:
        """Whether ``c`` applies to the current state (the rules of the theory of operation)."""
        now = self.partitions.get(c.partition)
        if c.version != (now.version if now is not None else 0):
            return False
        if now is not None and (c.epoch < now.epoch or (c.leader != now.leader and c.epoch == now.epoch)):
            return False
        if now is not None and (c.epoch > now.epoch or c.leader is None) and not set(c.isr) <= set(now.isr):
            return False  # (a new leader comes from the ISR, and only a leader adds to it: no unclean election)
        if c.leader is not None and c.leader not in c.isr:
            return False
        return set(c.isr) <= set(c.replicas)

    def snapshot(self) -> bytes:
        rows = [[p, lead.version, lead.leader, lead.epoch, list(lead.isr), list(lead.replicas)]
                for p, lead in sorted(self.partitions.items())]  # fmt: skip
        data: bytes = msgpack.packb([self.applied, rows], use_bin_type=True)
        return data

    @classmethod
    def restore_untrusted(cls, data: bytes) -> Metadata:
        """A snapshot's bytes (from the quorum's disk or its leader), every field checked."""
        try:
            f = msgpack.unpackb(data, raw=False, strict_map_key=True, max_bin_len=0, max_ext_len=0)
        except Exception as exc:
            raise CommandError(f"snapshot is not msgpack: {exc}") from None
        if f.__class__ is not list or len(f) != 2 or f[1].__class__ is not list or len(f[1]) > MAX_PARTITIONS:
            raise CommandError("snapshot must be [applied, [partition rows]]")
        meta = cls()
        meta.applied = _int(f[0], "snapshot applied", EPOCH_LIMIT)
        for row in f[1]:
            if row.__class__ is not list or len(row) != 6:
                raise CommandError("snapshot row must be [partition, version, leader, epoch, isr, replicas]")
            c = _set_fields([SET, row[0], row[1], *row[2:]], "snapshot row")
            if c.partition in meta.partitions or c.version == 0:
                raise CommandError(f"snapshot row of partition {c.partition} is twice there or has version 0")
            if (c.leader is not None and c.leader not in c.isr) or not set(c.isr) <= set(c.replicas):
                raise CommandError(f"snapshot row of partition {c.partition}: its leader or isr break the rules")
            meta.partitions[c.partition] = Leadership(c.replicas, c.leader, c.epoch, c.isr, c.version)
        return meta


def _ordered(members: Iterable[str], replicas: Sequence[str]) -> tuple[str, ...]:
    chosen = set(members)
    return tuple(m for m in replicas if m in chosen)


@functools.lru_cache(maxsize=8)
def _targets(ids: tuple[str, ...], partitions: int, replicas: int, placement: str) -> tuple[tuple[str, ...], ...]:
    if not ids:
        return tuple(() for _ in range(partitions))
    owners = ring.assign(list(ids), partitions, min(replicas, len(ids)), placement)
    return tuple(tuple(preference(owners, list(ids), p)[:replicas]) for p in range(partitions))


def targets(placed: Sequence[str], partitions: int, replicas: int,
            placement: str = ring.DEFAULT_PLACEMENT) -> tuple[tuple[str, ...], ...]:  # fmt: skip
    """Each partition's target replicas: the first ``replicas`` of its preference list (placing is
    work: the controller asks at every round, for the same members, so the last few are kept)."""
    return _targets(tuple(sorted(placed)), partitions, replicas, placement)


def decide_one(p: int, now: Leadership | None, target: tuple[str, ...], live: frozenset[str],
               reports: Mapping[str, tuple[int, int]] | None = None) -> SetPartition | None:  # fmt: skip
    """The controller's decision for partition ``p`` (the theory of operation), or None. A member
    in ``reports`` (a suspect: its log's end) is not made its leader, unless every ISR member is
    one and there is no leader: then the longest log leads alone (``decline``'s rule)."""
    reports = reports or {}
    if not target:
        return None
    if now is None:
        leader = next((m for m in target if m in live), None)
        return SetPartition(p, 0, leader, 1, target, target)
    replicas, isr, leader, epoch = now.replicas, now.isr, now.leader, now.epoch
    if set(target) != set(replicas):
        if not set(target) <= set(replicas):  # (first step: the new replicas join, and fetch)
            replicas = (*target, *(m for m in replicas if m not in target))
        elif set(target) <= set(isr):  # (second: every new one is in sync, the old ones go)
            replicas = target
            isr = _ordered(isr, target)
    candidates = [m for m in replicas if m in isr and m in live and m not in reports]
    best = candidates[0] if candidates else None
    if leader is None or leader not in live or leader not in isr or leader not in replicas:
        # (none, dead, or it left with its replica; a dead one stays in the ISR: the new leader, once
        # it has begun, drops it as any follower it holds down, never below min_insync)
        leader = best
        if leader is None and isr and all(m in reports for m in isr):
            leader = _longest(isr, reports, replicas)
            isr = (leader,)
    elif best is not None and replicas.index(best) < replicas.index(leader):
        leader = best  # (the preferred replica is back in sync)
    if leader != now.leader:
        epoch += 1
    change = SetPartition(p, now.version, leader, epoch, _ordered(isr, replicas), replicas)
    same = (change.leader, change.epoch, change.isr, change.replicas) == (now.leader, now.epoch, now.isr, now.replicas)
    return None if same else change


def decide(meta: Metadata, placed: Sequence[str], live: frozenset[str], partitions: int, replicas: int,
           placement: str = ring.DEFAULT_PLACEMENT,
           reports: Mapping[int, Mapping[str, tuple[int, int]]] | None = None) -> list[SetPartition]:  # fmt: skip
    """Every change the controller proposes now (it proposes them again while they do not apply)."""
    out = []
    for p, target in enumerate(targets(placed, partitions, replicas, placement)):
        c = decide_one(p, meta.partitions.get(p), target, live, reports.get(p) if reports else None)
        if c is not None and meta.allows(c):
            out.append(c)
    return out


def alter_isr(meta: Metadata, p: int, leader: str, epoch: int, isr: Sequence[str],
              version: int | None = None) -> SetPartition | None:  # fmt: skip
    """A leader's request to change its ISR (shrink past a lagging follower, or add a caught-up
    one), as the controller turns it into a command; None if it no longer applies (the requester
    does not lead ``p`` at ``epoch``, it asked against another ``version`` than the current one, or
    the ISR would lose its leader or leave the replicas). A stale add must not apply: the leader
    stops counting a member it asked to add once a newer version comes, and the quorum's ISR
    would then hold a member the leader does not wait for."""
    now = meta.partitions.get(p)
    if now is None or now.leader != leader or now.epoch != epoch or version not in (None, now.version):
        return None
    c = SetPartition(p, now.version, leader, epoch, _ordered(isr, now.replicas), now.replicas)
    if len(c.isr) != len(set(isr)) or c.isr == now.isr or not meta.allows(c):
        return None
    return c


def reelect(meta: Metadata, p: int, leader: str, epoch: int, at_least: int = 0) -> SetPartition | None:
    """A leader's request for a new epoch of its own, at least ``at_least`` (it may not begin
    ``epoch``: it led it before a restart, or its log holds records of a later epoch, such as a log
    written before the quorum); None if it no longer leads ``p`` at ``epoch``."""
    now = meta.partitions.get(p)
    if now is None or now.leader != leader or now.epoch != epoch:
        return None
    return SetPartition(p, now.version, leader, min(max(epoch + 1, at_least), EPOCH_LIMIT - 1), now.isr, now.replicas)


def _longest(isr: Sequence[str], reports: Mapping[str, tuple[int, int]], replicas: Sequence[str]) -> str:
    """The member of ``isr`` (all reported) whose log is the longest: the latest last epoch, then
    the most records, then the first in replica order."""
    return max(isr, key=lambda m: (*reports[m], -replicas.index(m)))


def decline(meta: Metadata, p: int, member: str, reports: Mapping[str, tuple[int, int]],
            live: frozenset[str]) -> SetPartition | None:  # fmt: skip
    """A suspect leader's refusal to lead ``p`` (the theory of operation). ``reports`` holds the
    log ends (last epoch, end offset) of the members that declined ``p``, ``member`` among them.
    Another live ISR member that has not declined is named (the ISR stays: it will decline in its
    turn if it is suspect too); once every ISR member has declined, the longest log leads alone in
    the ISR (the others catch up from it and are added again). None: ``member`` does not lead ``p``,
    or an ISR member that has not declined is down (the partition waits for it)."""
    now = meta.partitions.get(p)
    if now is None or now.leader != member or member not in reports:
        return None
    others = [m for m in now.replicas if m in now.isr and m != member]
    fresh = [m for m in others if m in live and m not in reports]
    if fresh:
        leader, isr = fresh[0], now.isr
    elif all(m in reports for m in others):
        leader = _longest(now.isr, reports, now.replicas)
        isr = (leader,)
    else:
        return None
    c = SetPartition(p, now.version, leader, min(now.epoch + 1, EPOCH_LIMIT - 1), isr, now.replicas)
    return c if meta.allows(c) else None
