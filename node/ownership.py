"""Which partitions this member owns in partitioned mode, as the broker core sees it.

Theory of operation. In partitioned mode (docs/cluster.md) a topic belongs to
partition ``mmh3(topic) mod P``; the cluster map names each partition's owners,
primary first. The member core (cluster/member.py) computes the map and hands
the broker core this table; the broker consults it on three paths:

* the subscription index holds only registers of partitions this member owns
  (the registers of the clients it is home to are kept for their sessions in
  any partition, but are not indexed: delivery is the owners' job);
* a published message whose partition has another primary is not delivered
  here but forwarded to that primary (``forward_to``);
* anti-entropy digests are per partition (the bucket of a register is the
  partition of its topic), so two owners compare exactly what they share.

The table is replaced as a whole when the map changes (``update``); the
partition of a topic is memoised, since the same few topics come again and
again on the hot path.

Subscriptions to filters (client/subjects.py) belong to the partition of their
pattern; a wildcard pattern spans every partition, so its registers are in
one more partition, number ``partitions`` (``spanning``), which every member
owns and is primary of: every member holds every wildcard subscription, as in
replicated mode, and the primary of a message's partition matches them
(docs/cluster.md, "Wildcards in partitioned mode").
"""

from __future__ import annotations

from collections.abc import Sequence

from roost.client.ring import partition_of
from roost.client.subjects import partition_topic

_MEMO_MAX = 100_000


class Ownership:
    __slots__ = ("me", "partitions", "spanning", "owned", "primaries", "epoch", "_memo")

    def __init__(self, me: str, partitions: int) -> None:
        self.me = me
        self.partitions = partitions
        self.spanning = partitions  # the partition of wildcard subscriptions: everybody's
        self.owned = bytearray(partitions + 1)  # 1 where this member is primary or a replica
        self.owned[partitions] = 1
        self.primaries: list[str | None] = [None] * partitions + [me]
        self.epoch = 0
        self._memo: dict[str, int] = {}

    def partition(self, topic: str) -> int:
        p = self._memo.get(topic)
        if p is None:
            t = partition_topic(topic)
            p = self.spanning if t is None else partition_of(t, self.partitions)
            if len(self._memo) >= _MEMO_MAX:
                self._memo.clear()
            self._memo[topic] = p
        return p

    def owns(self, topic: str) -> bool:
        return bool(self.owned[self.partition(topic)])

    def forward_to(self, topic: str) -> str | None:
        """The primary to forward a message of ``topic`` to; None: deliver here.

        A member that owns the partition as a replica delivers too when it
        has no live primary in its view (it is about to become primary)."""
        p = self.partition(topic)
        primary = self.primaries[p]
        if primary is None or primary == self.me:
            return None
        return primary

    def unowned(self, topic: str) -> bool:
        """No live owner in our map: only a member outside the placement (a leaver) that
        hears no placed member sees that."""
        return self.primaries[self.partition(topic)] is None

    def update(self, epoch: int, owners: Sequence[Sequence[str]]) -> tuple[set[int], set[int]]:
        """Install a new map's owners; returns (partitions gained, partitions lost)."""
        gained, lost = set(), set()
        for p, who in enumerate(owners):
            mine = self.me in who
            if mine and not self.owned[p]:
                gained.add(p)
            elif not mine and self.owned[p]:
                lost.add(p)
            self.owned[p] = mine
            self.primaries[p] = who[0] if who else None
        self.epoch = epoch
        return gained, lost
