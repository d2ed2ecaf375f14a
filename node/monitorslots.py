"""Who may hold the monitoring endpoint's connections: the cap, and which connection gives way.

A connection is *idle* while no request is under way on it: from the moment it is accepted
until the first byte of a request arrives, and again after each answer. Idle connections cost
the node nothing but a file, and HTTP lets a server close one at any time (a keep-alive client
simply opens another), so when the endpoint is full a new connection takes the place of the one
idle the longest. Only when every connection has a request under way (each bounded by
``request_timeout``) is the newest refused. So however many connections a port scanner or a
hung client leaves open, a health check that connects and sends its request gets in (with a
plain cap, 32 silent connections kept /healthz out until idle_timeout closed them).

The same rule holds per source address (``max_per_host``): past it, that address's own idle
connection gives way, or its new one is refused. One host's slow requests then cannot take every
slot from the others.

Plain Python, no I/O: the server (node/monitorhttp.py) tells it what each connection does, and
it calls ``evict`` for a connection it has dropped.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

#: The counters of /varz "monitor" and roost_monitor_events_total.
EVENTS = ("accepted", "refused", "evicted", "idle_closed", "request_timeouts", "requests", "unauthorized")


class Slots(Generic[K]):
    """The connections held, idle ones in the order they went idle (the oldest idle first)."""

    def __init__(self, limit: int, per_host: int, evict: Callable[[K], None]) -> None:
        self.limit, self.per_host, self._evict = limit, min(per_host, limit), evict
        self._host: dict[K, str] = {}
        self._held: dict[str, int] = {}
        self._idle: OrderedDict[K, None] = OrderedDict()
        self._idle_of: dict[str, OrderedDict[K, None]] = {}
        self.counts = dict.fromkeys(EVENTS, 0)

    def admit(self, key: K, host: str, busy: bool = False) -> bool:
        """Take a new connection from ``host`` (idle, unless ``busy``: its request has begun),
        closing an idle one to make room if need be; False when there is no room (the caller
        closes it)."""
        if self._held.get(host, 0) >= self.per_host:
            mine = self._idle_of.get(host)
            if not mine:
                self.counts["refused"] += 1
                return False
            self._drop(next(iter(mine)))
        if len(self._host) >= self.limit:
            if not self._idle:
                self.counts["refused"] += 1
                return False
            self._drop(next(iter(self._idle)))
        self._host[key] = host
        self._held[host] = self._held.get(host, 0) + 1
        if not busy:
            self._idle[key] = None
            self._idle_of.setdefault(host, OrderedDict())[key] = None
        self.counts["accepted"] += 1
        return True

    def busy(self, key: K) -> None:
        """A request began on ``key``: it may not be closed to make room until it is answered."""
        self._unidle(key)

    def idle(self, key: K) -> None:
        """``key`` answered its request (or never had one): the newest idle connection."""
        if key in self._host:
            self._unidle(key)
            self._idle[key] = None
            self._idle_of.setdefault(self._host[key], OrderedDict())[key] = None

    def leave(self, key: K) -> None:
        """``key`` closed (any reason); nothing happens if it was not held."""
        host = self._host.pop(key, None)
        if host is None:
            return
        self._unidle(key, host)
        if self._held[host] == 1:
            del self._held[host]
        else:
            self._held[host] -= 1

    def figures(self) -> dict[str, int]:
        """What /varz shows: connections now, idle among them, and the counters."""
        return {"connections": len(self._host), "idle": len(self._idle), **self.counts}

    def _drop(self, key: K) -> None:
        self.leave(key)
        self.counts["evicted"] += 1
        self._evict(key)

    def _unidle(self, key: K, host: str | None = None) -> None:
        if key not in self._idle:
            return
        del self._idle[key]
        host = host or self._host[key]
        mine = self._idle_of[host]
        del mine[key]
        if not mine:
            del self._idle_of[host]
