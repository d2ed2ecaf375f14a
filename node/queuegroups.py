"""Queue groups: which member of a group gets a message, and where a message goes when the
member it was given to cannot take it any more.

Theory of operation. A queue group's subscriptions are filters (client/subjects.py) in the
subscription index, each group one ``FilterSubs`` entry. For each message the fan-out
(node/fanout.py) asks ``filtered`` which filters it passes: subscribers of wildcards and queries
are added to those of the bare topic, and each queue group contributes one member (``pick``:
round robin, passing over members whose mailbox already holds ``send_window`` messages; every
fragment of a large message to one member by rendezvous hashing, ``_pick_part``). The copy that
member gets carries the group's mark id, so its mailbox knows it holds a group's messages
(``Mailbox.queued``). When such a mailbox is dropped with messages not acknowledged (its client
timed out, overflowed, left, restarted: ``discarded``), or the client leaves one group
(``leave_group``), those messages go to another member of their group (``requeue_one``;
docs/guarantees.md, "Queue groups").
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Container
from typing import Any

import msgpack

from roost.client import wire
from roost.client.decoding import MSG_SEQ, MSG_TAGS, MSG_TOPIC
from roost.node.clients import ClientState
from roost.node.config import NodeConfig
from roost.node.mailbox import Mailbox
from roost.node.outbox import Outbox
from roost.node.subscriptions import FilterSubs, SubscriptionIndex

_NOBODY: frozenset[Any] = frozenset()  # (a pick that excludes no one)
_NO_GROUP: tuple[FilterSubs | None, None] = (None, None)


class QueueGroups:
    def __init__(
        self, config: NodeConfig, metrics: Counter[str], outbox: Outbox, clients: dict[Any, ClientState],
        index: SubscriptionIndex, dirty: list[ClientState],
    ) -> None:  # fmt: skip
        self.cfg = config
        self.metrics = metrics
        self.outbox = outbox
        self.clients = clients
        self.index = index
        self.dirty = dirty  # (node/delivery.py's: the clients with something to send this batch)

    def filtered(
        self, topic: str, key: str | None, tags: dict[str, str] | None, subs: dict[Any, int] | None
    ) -> tuple[dict[Any, int] | None, dict[Any, list[Any]] | None]:
        """Add the subscribers of wildcard and query filters the message passes (each once,
        in its strongest mode) to those of its bare topic; of a queue group, one member,
        which is told so. Returns (the others, ``picks``: subscriber -> [mode, the mark ids
        of the group subscriptions it was picked for]); a subscriber is in one of the two,
        not both. Every fragment of one large message goes to the same member (``pick``)."""
        found = self.index.matching_filters(topic, tags)
        if not found:
            return subs, None
        merged = dict(subs) if subs else {}
        picks: dict[Any, list[Any]] | None = None
        part = tags.get(wire.PART_TAG) if tags else None
        for fs in found:
            if fs.keys.get(None) or (key is not None and fs.keys.get(key)):
                fs.matched += 1  # (as for a bare topic: a message some subscriber of the filter takes)
            for k in (None, key) if key is not None else (None,):
                group = fs.keys.get(k)
                if not group:
                    continue
                if fs.filter.queue is None:
                    for who, mode in group.items():
                        if mode > merged.get(who, -1):
                            merged[who] = mode
                    continue
                who = self.pick(fs, k, group, _NOBODY, part)
                if who is None:
                    continue
                if picks is None:
                    picks = {}
                pick = picks.get(who)
                if pick is not None and len(pick[1]) >= wire.MAX_MARKS:
                    # (picked for as many groups of this message as one copy can say: another member)
                    crowded = {w for w, p in picks.items() if len(p[1]) >= wire.MAX_MARKS}
                    who = self.pick(fs, k, group, crowded, part)
                    if who is None:
                        self.metrics["queue_undeliverable"] += 1
                        continue
                    pick = picks.get(who)
                if pick is None:
                    picks[who] = [group[who], [fs.marks[k]]]
                else:
                    pick[0] = max(pick[0], group[who])
                    pick[1].append(fs.marks[k])
        if picks:
            for who, pick in picks.items():  # (one copy each: the marked one, in the stronger mode)
                mode = merged.pop(who, -1)
                if mode > pick[0]:
                    pick[0] = mode
        return merged, picks

    def pick(
        self, fs: FilterSubs, k: str | None, group: dict[Any, int], exclude: Container[Any], part: str | None
    ) -> Any:
        """The member of a queue group that gets the next message: round robin over the
        group but ``exclude``, passing over members whose mailbox already holds ``send_window``
        messages (a slow or paused consumer) while another has room; None if there is nobody.
        A fragment of a large message (``part``: its ``roost.part`` tag) goes where its id
        hashes highest with the member (rendezvous hashing): every fragment to one member,
        also from another cluster member after a failover, with no state to keep."""
        if part is not None:
            return self._pick_part(group, exclude, part)
        members = fs.members.get(k)
        if members is None:  # (kept until the group changes: not a copy per message)
            members = fs.members[k] = list(group)
        n = len(members)
        start = fs.turn % n
        fs.turn += 1
        window = self.cfg.send_window
        clients = self.clients
        best, best_load = None, 1 << 62
        for i in range(n):
            who = members[(start + i) - n if start + i >= n else start + i]
            c = clients.get(who)
            if c is None or who in exclude:
                continue
            if not group[who]:
                return who  # (a fire member: no mailbox to weigh)
            mb = c.mailbox
            if mb is None:
                continue  # (being dropped)
            load = len(mb)
            if load < window:
                return who
            if load < best_load:
                best, best_load = who, load
        return best

    def _pick_part(self, group: dict[Any, int], exclude: Container[Any], part: str) -> Any:
        ident = part.split(" ", 1)[0].encode()
        clients = self.clients
        best, best_score = None, b""
        for who, mode in group.items():
            c = clients.get(who)
            if c is None or who in exclude or (mode and c.mailbox is None):
                continue
            name = who if who.__class__ is bytes else repr(who).encode()
            score = hashlib.blake2b(name, digest_size=8, key=ident[:64]).digest()
            if score > best_score:
                best, best_score = who, score
        return best

    def discarded(self, c: ClientState, mailbox: Mailbox) -> None:
        """A mailbox is dropped (its client timed out, overflowed, left, moved to a new process)
        with messages it never acknowledged: each a queue group picked this client for goes to
        another member of that group (docs/guarantees.md, "Queue groups")."""
        if not mailbox.queued:
            return
        for packed in mailbox.buf[mailbox.base :]:
            if packed[0] == 0x95 or packed[0] == 0x97:  # (a message with queue marks: 5 or 7 elements)
                self.requeue_one(msgpack.unpackb(packed), c.cid)

    def leave_group(self, c: ClientState, mailbox: Mailbox, mark: bytes) -> None:
        """Hand on what the mailbox holds for one group the client left, and take that group's
        mark off those messages here (the client drops them; a later discard must not hand
        them on again)."""
        buf = mailbox.buf
        for i in range(mailbox.base, len(buf)):
            packed = buf[i]
            if packed[0] != 0x95 and packed[0] != 0x97:
                continue
            m = msgpack.unpackb(packed)
            if mark not in m[-1]:
                continue
            self.requeue_one(m, c.cid, only=mark)
            rest = [x for x in m[-1] if x != mark]
            base = wire.pack(m[:-1])
            buf[i] = wire.mark_delivery(base, rest) if rest else base
            mailbox.nbytes += len(buf[i]) - len(packed)
            if i - mailbox.base < mailbox.sent - mailbox.acked:  # (sent: in flight)
                mailbox.inflight += len(buf[i]) - len(packed)

    def requeue_one(self, m: list[Any], exclude: Any, only: bytes | None = None) -> None:
        """Give a marked message (unpacked, its marks last) to other members of its groups
        (``only``: of that one group, by mark id)."""
        marks = m[-1]
        base = wire.pack(m[:-1])
        pseq = m[MSG_SEQ] if len(m) == 7 else None
        tags = m[MSG_TAGS]
        part = tags.get(wire.PART_TAG) if tags else None
        groups = self.index.groups
        for mark in marks:
            if only is not None and mark != only:
                continue
            fs, k = groups.get(mark, _NO_GROUP)
            group = fs.keys.get(k) if fs is not None else None
            tried = {exclude}
            while True:  # (a member whose mailbox is full is passed over for the next)
                who = self.pick(fs, k, group, tried, part) if fs is not None and group else None
                c = self.clients.get(who) if who is not None else None
                if c is None:
                    break
                mine = wire.mark_delivery(base, [mark])
                mb = c.mailbox
                if mb is None:
                    c.fire.append(mine)
                elif mb.push(mine):
                    mb.queued = True
                else:
                    tried.add(who)
                    continue
                break
            if c is None:
                self.metrics["queue_undeliverable"] += 1
                self.outbox.log("warning", "queue_undeliverable", filter=fs.filter.text if fs else mark,
                                topic=m[MSG_TOPIC], seq=pseq)  # fmt: skip
                continue
            self.metrics["queue_redelivered"] += 1
            if not c.dirty:
                c.dirty = True
                self.dirty.append(c)
