"""Admission of new clients and producers: node-wide and per-source-host limits, fair shares.

Every client record and producer costs the node memory until it times out,
and a datagram with a valid cookie is cheap to send. So a new one is admitted
only while its source host is under ``max_per_host`` for both kinds together
(one host cannot take every slot) and the node is under its limit for that
kind (``max_clients``, ``max_producers``). The count for a host is released
when the record or producer it admitted goes away.

A node-wide limit is still a pool that a few hosts together can empty, each
under its own cap. So when the pool is full, a host with fewer than the
largest holder may take a slot from it (``largest``: the caller frees one of
that host's, its oldest producer, then admits): the parties over their share
are refused or lose their oldest, not everyone. The largest holder is found in
O(1): hosts are bucketed by their count, and counts move by one.

Client records cannot be taken from a host that way (a record holds subscriptions), so for
them the fair share works as for subscriptions (node/budgets.py): above ``admission_share`` of
``max_clients``, only a host holding less than its share of the pool gets a new one
(``over_fair_share``).
"""

from __future__ import annotations

import ipaddress
from collections import Counter

from roost.client.wire import ErrorCode, WireError

_HOSTS: dict[str, str] = {}


def host_key(host: str) -> str:
    """The source "host" limits count against: an IPv4 address, or an IPv6 address's /64 (one
    machine's share of addresses: an IPv6 host may have all of a /64 to itself); memoised."""
    key = _HOSTS.get(host)
    if key is None:
        key = host
        if ":" in host:
            try:
                ip = ipaddress.IPv6Address(host.partition("%")[0])
                v4 = ip.ipv4_mapped
                key = str(v4) if v4 is not None else str(ipaddress.IPv6Network((ip, 64), strict=False))
            except ValueError:
                pass  # (not an IPv6 address, e.g. a test's name: counted as itself)
        if len(_HOSTS) >= 65536:
            _HOSTS.clear()
        _HOSTS[host] = key
    return key


def over_fair_share(held: int, holders: int, pool: float) -> bool:
    """Whether a host holding ``held`` of a pool (``pool``: the part of a limit above which
    shares count, admission_share x the limit) already holds its fair share of it: the pool
    over the ``holders`` hosts holding any, and over one more when it holds none (a newcomer
    counts too, so it is always under its share)."""
    return held >= pool / (holders + (held == 0))


class Admission:
    __slots__ = ("by_count", "max_per_host", "metrics", "per_host", "top", "total")

    def __init__(self, max_per_host: int, metrics: Counter[str] | None = None) -> None:
        self.max_per_host = max_per_host
        self.metrics = metrics if metrics is not None else Counter()  # refused_<setting>
        self.per_host: dict[str, int] = {}  # producers + binary clients per source host
        self.by_count: dict[int, dict[str, None]] = {}  # count -> the hosts holding that many
        self.top = 0  # the largest count any host holds
        self.total = 0  # of every host

    def admit(self, host: str, count: int, limit: int, what: str, setting: str) -> None:
        """Room for one more of ``what`` (``count`` exist, at most ``limit``, the setting
        ``setting``), node-wide and from ``host``? Counts it against the host, or raises
        ``OVERLOADED`` naming the limit and counts nothing."""
        self.check_host(host)
        if count >= limit:
            self.metrics[f"refused_{setting}"] += 1
            raise WireError(ErrorCode.OVERLOADED, f"too many {what} on this node ({setting} = {limit})")
        n = self.per_host.get(host, 0)
        self._move(host, n, n + 1)

    def check_host(self, host: str) -> None:
        """Raises ``OVERLOADED`` if ``host`` holds ``max_per_host`` already."""
        if self.per_host.get(host, 0) >= self.max_per_host:
            self.metrics["refused_max_per_host"] += 1
            raise WireError(ErrorCode.OVERLOADED, f"too many producers and clients from this host (max_per_host = "
                            f"{self.max_per_host})")  # fmt: skip

    def add(self, host: str) -> None:
        """Count one more against ``host`` whatever the limits: a client this node adopts (its
        home failed over here) is not refused, but counts from now on."""
        n = self.per_host.get(host, 0)
        self._move(host, n, n + 1)

    def largest(self, host: str) -> str | None:
        """The host holding the most, when it holds at least two more than ``host`` (so taking
        one of its slots for ``host`` leaves it no poorer than ``host``), else None."""
        if self.top < self.per_host.get(host, 0) + 2:
            return None
        return next(iter(self.by_count[self.top]))

    def release(self, host: str) -> None:
        """One client or producer admitted from ``host`` is gone."""
        n = self.per_host.get(host, 0)
        if n > 0:
            self._move(host, n, n - 1)

    def _move(self, host: str, old: int, new: int) -> None:
        self.total += new - old
        if old:
            hosts = self.by_count[old]
            del hosts[host]
            if not hosts:
                del self.by_count[old]
                if old == self.top:
                    self.top = new  # (the host moved down from the top: its new count is the top now)
        if new:
            self.per_host[host] = new
            self.by_count.setdefault(new, {})[host] = None
            if new > self.top:
                self.top = new
        else:
            del self.per_host[host]
