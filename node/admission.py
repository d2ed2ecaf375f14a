"""Admission of new clients and producers: node-wide and per-source-host limits.

Every client record and producer costs the node memory until it times out,
and a datagram with a valid cookie is cheap to send. So a new one is admitted
only while the node is under its limit for that kind (``max_clients``,
``max_producers``) and its source host is under ``max_per_host`` for both
kinds together: one host cannot take every slot. The count for a host is
released when the record or producer it admitted goes away.
"""

from __future__ import annotations

from collections import Counter

from roost.client.wire import E, WireError


class Admission:
    __slots__ = ("max_per_host", "per_host")

    def __init__(self, max_per_host: int) -> None:
        self.max_per_host = max_per_host
        self.per_host: Counter[str] = Counter()  # producers + binary clients per source host

    def admit(self, host: str, count: int, limit: int, what: str) -> None:
        """Room for one more of ``what`` (``count`` exist, at most ``limit``),
        node-wide and from ``host``? Counts it against the host, or raises
        ``OVERLOADED`` and counts nothing."""
        if count >= limit:
            raise WireError(E.OVERLOADED, f"too many {what} on this node")
        if self.per_host[host] >= self.max_per_host:
            raise WireError(E.OVERLOADED, "too many producers and clients from this host")
        self.per_host[host] += 1

    def release(self, host: str) -> None:
        """One client or producer admitted from ``host`` is gone."""
        n = self.per_host[host] - 1
        if n > 0:
            self.per_host[host] = n
        else:
            del self.per_host[host]
