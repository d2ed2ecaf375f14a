"""The roster: which members a cluster has, beyond its config (docs/cluster.md, "Dynamic membership").

Theory of operation
-------------------
The ``[[members]]`` of the config file are the *base*. ``roost cluster join`` and ``leave``
change the membership at run time; each change is an *entry* of the roster, and the roster is
replicated state like the registers: every member holds all of it, sends it to each peer when a
link comes up and on every change (ROSTER frames), and keeps it in its snapshot, so joins and
leaves survive restarts of any member.

An entry ``(id, version, joined, index, client address, peer address)`` says member ``id`` is in
(``joined``) or out (left) as of ``version``. Entries merge as last-writer-wins registers, per
member id: the greater ``(version, joined, index, addresses)`` wins, so merging commutes and
two members that saw the same entries hold the same roster, whatever the order. A member that
proposes a change gives it ``version`` = one past every version it knows. ``index`` is the
member's tie-break bits in register versions (node/versions.py: 8 bits); a joiner gets the
lowest index no entry or base member uses.

The members of a roster (:meth:`Roster.members`) are the base, plus entries joined, minus entries
left; :meth:`Roster.digest` names a roster in 8 bytes (the same entries, the same digest), which
members report in their heartbeats: cluster/joining.py moves the map to a new roster only once
every live member reports that digest, that is, once each has pulled the partitions it gains.

Pure data, no I/O: the member core, the simulator and the CLI share it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgpack

from roost.client.wire import WireError, _ip, _node_id, _port

if TYPE_CHECKING:
    from roost.cluster.config import Member

Addr = tuple[str, int]
MAX_ENTRIES = 1024
MAX_INDEX = 255  # (node/versions.py: 8 bits)
MEMBER_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")  # (as cluster/config.py allows)


class RosterError(ValueError):
    """A roster entry or frame that is malformed, or a change the roster refuses."""


@dataclass(frozen=True, order=True)
class Entry:
    version: int
    joined: bool
    index: int
    client: Addr
    peer: Addr

    def wire(self, member: str) -> list[Any]:
        return [member, self.version, self.joined, self.index, *self.client, *self.peer]


class Roster:
    def __init__(self, base: Mapping[str, tuple[Addr, Addr]]) -> None:
        self.base = dict(base)
        self.base_index = {m: i for i, m in enumerate(sorted(base))}  # (cluster/config.py: index_of)
        self.entries: dict[str, Entry] = {}
        self._digest: int | None = None  # (asked at every heartbeat: kept until an entry changes)

    @classmethod
    def of(cls, config_members: Iterable[Member], entries: list[tuple[str, Entry]]) -> Roster:
        """The roster of a config's members and these entries. A member that joined is not
        part of the base even where its own config lists it (``roost node --join``)."""
        joined = {m for m, e in entries if e.joined}
        r = cls({m.id: (m.advertised, m.peer_addr) for m in config_members if m.id not in joined})
        r.merge(entries)
        return r

    # ------------------------------------------------------------ reading

    def members(self) -> dict[str, tuple[Addr, Addr]]:
        """Member id -> (client address, peer address): the base, plus joined, minus left."""
        out = dict(self.base)
        for m, e in self.entries.items():
            if e.joined:
                out[m] = (e.client, e.peer)
            else:
                out.pop(m, None)
        return dict(sorted(out.items()))

    def known(self) -> dict[str, tuple[Addr, Addr]]:
        """Every member ever: those of :meth:`members` and those that left. A member that left
        may still be draining and dial us: it must be let in (and told), not refused."""
        out = dict(self.base)
        out.update((m, (e.client, e.peer)) for m, e in self.entries.items())
        return dict(sorted(out.items()))

    def index_of(self, member: str) -> int:
        e = self.entries.get(member)
        return e.index if e is not None else self.base_index[member]

    def left(self, member: str) -> bool:
        e = self.entries.get(member)
        return e is not None and not e.joined

    @property
    def version(self) -> int:
        return max((e.version for e in self.entries.values()), default=0)

    def digest(self) -> int:
        """8 bytes naming this roster (0 for the base alone)."""
        if self._digest is None:
            data = msgpack.packb(self.encode(), use_bin_type=True)
            self._digest = int.from_bytes(hashlib.blake2b(data, digest_size=8, person=b"roost.roster").digest(),
                                          "big") if self.entries else 0  # fmt: skip
        return self._digest

    def encode(self) -> list[list[Any]]:
        return [e.wire(m) for m, e in sorted(self.entries.items())]

    # ------------------------------------------------------------ changing

    def merge(self, entries: list[tuple[str, Entry]]) -> bool:
        """Take each entry newer than ours; True if anything changed."""
        changed = False
        for m, e in entries:
            old = self.entries.get(m)
            if old is None or e > old:
                self.entries[m] = e
                self._digest = None
                changed = True
        return changed

    def propose_join(self, member: str, client: Addr, peer: Addr) -> Entry:
        """A new member: refused when its id, client or peer address is taken by a member."""
        current = self.members()
        if member in current:
            raise RosterError(f"{member} is already a member")
        for other, (c, p) in current.items():
            if {client, peer} & {c, p}:
                raise RosterError(f"an address of {member} is taken by {other}: client {c[0]}:{c[1]}, "
                                  f"peer {p[0]}:{p[1]}")  # fmt: skip
        used = set(self.base_index.values()) | {e.index for e in self.entries.values()}
        free = [i for i in range(MAX_INDEX + 1) if i not in used]
        old = self.entries.get(member)
        if old is not None and old.index not in set(self.base_index.values()):
            free.insert(0, old.index)  # (a member that left and comes back keeps its index)
        if not free:
            raise RosterError(f"no free member index: at most {MAX_INDEX + 1} members have ever been in the roster")
        e = Entry(self.version + 1, True, free[0], client, peer)
        self.entries[member] = e
        self._digest = None
        return e

    def propose_leave(self, member: str) -> Entry:
        current = self.members()
        if member not in current:
            raise RosterError(f"{member} is not a member")
        if len(current) == 1:
            raise RosterError(f"{member} is the last member")
        client, peer = current[member]
        e = Entry(self.version + 1, False, self.index_of(member), client, peer)
        self.entries[member] = e
        self._digest = None
        return e


def decode_untrusted_roster(v: Any) -> list[tuple[str, Entry]]:
    """Entries from a peer or a snapshot, every field checked; RosterError names the first bad one."""
    if v.__class__ is not list or len(v) > MAX_ENTRIES:
        raise RosterError(f"roster must be a list of at most {MAX_ENTRIES} entries")
    out = []
    for row in v:
        if row.__class__ is not list or len(row) != 8:
            raise RosterError("roster entry must be [id, version, joined, index, host, port, peer host, peer port]")
        try:
            member = _node_id(row[0], "roster member id")
            if not MEMBER_ID.match(member):
                raise RosterError(f"roster member id {member[:64]!r} is not 1-64 letters, digits, '_', '.' or '-'")
            client = (_ip(row[4], "roster client host"), _port(row[5], "roster client port"))
            peer = (_ip(row[6], "roster peer host"), _port(row[7], "roster peer port"))
        except WireError as exc:
            raise RosterError(str(exc)) from None
        version, joined, index = row[1], row[2], row[3]
        if version.__class__ is not int or not 0 < version < 2**62 or joined.__class__ is not bool \
                or index.__class__ is not int or not 0 <= index <= MAX_INDEX:  # fmt: skip
            raise RosterError(f"roster entry of {member}: version, joined or index malformed")
        out.append((member, Entry(version, joined, index, client, peer)))
    return out
