"""Subscription budgets: what each source host holds, and whether one more may come.

Theory of operation. A subscription costs the node memory for as long as it stands, and a
stranger can make thousands. So every subscription in force is counted against the node (its
subscriptions: the index; its filter bytes: ``filter_bytes``) and against the host that
admitted the client holding it (``hosts``: [subscriptions, filter bytes]). The counts move in
one place, ``charge``, which the registers call wherever a subscription comes or goes (a SUB,
an UNSUB, a merge from a peer or a snapshot, an expiry), so they cannot drift from the index.

A client record is charged to one host, fixed from its first subscription to its last
(``ClientState.charged``): a binary client to the host that admitted it (``counted``), a text
address to itself at its home; records another member admitted are charged to no host here.
So a client that moves, or a member that adopts it, never frees what another host was charged.

``check`` decides a new subscription: refused (``overloaded``) past its client's or host's own
limits, refused (``over_capacity``) when a node-wide pool is full, and above
``admission_share`` of a pool admitted only for a host that holds less than its fair share of
it (the pool's share over the hosts that hold any): hosts that filled the pool together are
refused, a newcomer is not. Mailbox bytes are summed per host once a second (what the mailboxes
of the clients a host admitted hold) and shared the same way: one host whose subscribers never
acknowledge is refused above the share, not everyone.
Each refusal names the setting that refused it; it is counted as ``refused_<setting>`` and
logged at most every 10 s.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from roost.client.wire import ErrorCode
from roost.node import versions
from roost.node.admission import host_key, over_fair_share
from roost.node.clients import ClientState
from roost.node.config import NodeConfig


def utf8_len(text: str) -> int:
    """Bytes, not characters: what the budgets count (an emoji is 4)."""
    return len(text) if text.isascii() else len(text.encode())


class SubscriptionBudgets:
    __slots__ = ("cfg", "filter_bytes", "hosts", "log", "mailbox_bytes", "mailbox_hosts", "metrics", "tombstones",
                 "_logged", "_summed")  # fmt: skip

    def __init__(self, cfg: NodeConfig, metrics: Counter[str], log: Callable[..., None]) -> None:
        self.cfg = cfg
        self.metrics = metrics
        self.log = log  # the core's: a Log action (level, event, **fields)
        self.filter_bytes = 0  # of every subscription in force (max_filter_bytes)
        self.tombstones = 0  # registers of ended subscriptions kept until collected (max_tombstones)
        # host -> [subscriptions, their filter bytes, tombstones] its clients hold here
        self.hosts: dict[str, list[int]] = {}
        self.mailbox_bytes = 0  # of every mailbox, summed at most once a second
        self.mailbox_hosts: dict[str, int] = {}  # host -> the bytes its clients' mailboxes hold (then)
        self._summed = -1e18
        self._logged = -1e18

    def charge(self, c: ClientState, topic: str, live: int, tomb: int, node_id: str) -> None:
        """A register of ``c`` for the filter ``topic`` changed: ``live`` subscriptions in force
        and ``tomb`` tombstones more (-1, 0 or 1 each); ``c.live`` and ``c.subs`` already say
        so. Every place a register comes, changes or goes calls this (node/registers.py:
        ``_set``, and ``_collect_tombstones``), so the counts cannot drift from the registers."""
        nbytes = utf8_len(topic) if live else 0
        self.filter_bytes += live * nbytes
        self.tombstones += tomb
        if c.charged is None:
            if c.cid.__class__ is bytes:
                c.charged = c.counted or ""
            else:
                c.charged = host_key(c.cid[0]) if c.home == node_id else ""
        host = c.charged
        if host:
            held = self.hosts.get(host)
            if held is None:
                held = self.hosts[host] = [0, 0, 0]
            held[0] += live
            held[1] += live * nbytes
            held[2] += tomb
            if not held[0] and not held[2]:
                del self.hosts[host]
        if not c.subs:
            c.charged = None

    def rehome(self, c: ClientState, host: str) -> None:
        """``c``'s registers are charged to ``host`` from now on ("" to none): its home moved
        here (adoption: the host it talks from now) or away (its new home charges it)."""
        if c.charged is None or c.charged == host:
            if c.subs:
                c.charged = host
            return
        n = sum(utf8_len(t) for (t, _), v in c.subs.items() if v & versions.PRESENT)
        tombs = len(c.subs) - c.live
        for h, sign in ((c.charged, -1), (host, 1)):
            if h:
                held = self.hosts.setdefault(h, [0, 0, 0])
                held[0] += sign * c.live
                held[1] += sign * n
                held[2] += sign * tombs
                if not held[0] and not held[2]:
                    del self.hosts[h]
        c.charged = host

    def room(self, host: str, c: ClientState) -> str:
        """Would ``host`` stay within its own limits holding what ``c`` holds as well? "" or
        the setting it would pass (a client that moves to it brings its registers:
        node/sessions.py ``_may_move``)."""
        n, b, t = self.hosts.get(host) or (0, 0, 0)
        cfg = self.cfg
        if c.live and n + c.live > cfg.max_subscriptions_per_host:
            return "max_subscriptions_per_host"
        if c.live and b + sum(utf8_len(topic) for (topic, _), v in c.subs.items() if v & versions.PRESENT) \
                > cfg.max_filter_bytes_per_host:  # fmt: skip
            return "max_filter_bytes_per_host"
        if len(c.subs) > c.live and t + len(c.subs) - c.live > cfg.max_tombstones_per_host:
            return "max_tombstones_per_host"
        return ""

    def may_tombstone(self, host: str | None, now: float) -> tuple[int, str]:
        """May a client admitted from ``host`` leave one more tombstone (an UNSUB of a filter
        this member does not hold, partitioned mode: it goes to the owners all the same)?"""
        t = (self.hosts.get(host) or (0, 0, 0))[2] if host else 0
        if t >= self.cfg.max_tombstones_per_host:
            return self._refuse(ErrorCode.OVERLOADED, "max_tombstones_per_host", now, 0)
        if self.tombstones >= self.cfg.max_tombstones:
            return self._refuse(ErrorCode.OVER_CAPACITY, "max_tombstones", now, 0)
        return ErrorCode.OK, ""

    def check(self, live: int, host: str | None, nbytes: int, count: int, now: float,
              mailboxes: Callable[[], dict[str, int]], text: int = -1,
              revives: bool = False) -> tuple[int, str]:  # fmt: skip
        """May a client holding ``live`` subscriptions, admitted from ``host``, take one more of
        a filter ``nbytes`` long, the node holding ``count``? (ErrorCode.OK, "") or (the refusal, the
        setting that refused it). ``mailboxes`` sums the mailboxes' bytes per host ("": clients
        no host here admitted), called at most once a second. ``text``: the node's text
        subscriptions, for a text one (max_text_subscribers). ``revives``: the subscription
        replaces a tombstone of its own (one tombstone fewer: not refused for tombstones)."""
        cfg = self.cfg
        if live >= cfg.max_subscriptions_per_client:
            return self._refuse(ErrorCode.OVERLOADED, "max_subscriptions_per_client", now, count)
        held = self.hosts.get(host) if host else None
        n, b, t = held if held is not None else (0, 0, 0)
        if n >= cfg.max_subscriptions_per_host:
            return self._refuse(ErrorCode.OVERLOADED, "max_subscriptions_per_host", now, count)
        if b + nbytes > cfg.max_filter_bytes_per_host:
            return self._refuse(ErrorCode.OVERLOADED, "max_filter_bytes_per_host", now, count)
        if t >= cfg.max_tombstones_per_host and not revives:  # (it unsubscribed that many within tombstone_horizon)
            return self._refuse(ErrorCode.OVERLOADED, "max_tombstones_per_host", now, count)
        share = cfg.admission_share
        hosts = len(self.hosts)
        # Each node-wide pool: refused at its limit; above admission_share of it, refused for a
        # host already holding its fair share (a newcomer is under it).
        for setting, used, mine, limit, extra in (
            ("max_subscriptions", count, n, cfg.max_subscriptions, 1),
            ("max_filter_bytes", self.filter_bytes, b, cfg.max_filter_bytes, nbytes),
            ("max_tombstones", -1 if revives else self.tombstones, t, cfg.max_tombstones, 1),
            ("max_text_subscribers", text, n, cfg.max_text_subscribers, 1),
        ):
            if used < 0:
                continue
            if used + extra > limit or (used >= share * limit and (host is None or
                                        over_fair_share(mine, hosts, share * limit))):  # fmt: skip
                return self._refuse(ErrorCode.OVER_CAPACITY, setting, now, count)
        if now >= self._summed + 1.0:
            self._summed = now
            self.mailbox_hosts = mailboxes()
            self.mailbox_bytes = sum(self.mailbox_hosts.values())
        if self.mailbox_bytes >= share * cfg.max_mailbox_bytes:
            # (no refusal for everyone at the limit itself: a host's mailboxes keep growing after
            # it is refused, and it would shut everyone else out)
            holders = len(self.mailbox_hosts) - ("" in self.mailbox_hosts)
            if host is None or over_fair_share(self.mailbox_hosts.get(host, 0), holders,
                                               share * cfg.max_mailbox_bytes):  # fmt: skip
                return self._refuse(ErrorCode.OVER_CAPACITY, "max_mailbox_bytes", now, count)
        return ErrorCode.OK, ""

    def _refuse(self, code: ErrorCode, setting: str, now: float, count: int) -> tuple[int, str]:
        self.metrics["refused_over_capacity" if code is ErrorCode.OVER_CAPACITY else "refused_overloaded"] += 1
        self.metrics[f"refused_{setting}"] += 1
        if now >= self._logged + 10.0:
            self._logged = now
            value: Any = getattr(self.cfg, setting)
            self.log("warning", "subscription_refused", code=code.name.lower(), limit=setting, value=value,
                     subscriptions=count, filter_bytes=self.filter_bytes,
                     mailbox_bytes=self.mailbox_bytes)  # fmt: skip
        return int(code), setting
