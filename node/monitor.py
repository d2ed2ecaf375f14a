"""What the monitoring endpoint shows: the documents behind /healthz, /varz, /connz, /subsz,
/clusterz and /metrics (node/monitorhttp.py serves them over HTTP).

The paths and their shapes follow NATS's monitoring port (8222), which operators already
script against; /clusterz is ours (members, states, the map epoch, peer queues) and /metrics is
the Prometheus text format from ``prometheus_client``.

Every document is a function of the broker core (and, in a cluster, the member core) taken on
the event loop between two core calls, so it is consistent, plus what the shell measured of
the process (CPU, memory). Nothing here does I/O or reads a clock: ``now`` (the core's
monotonic time) and ``wall`` come in as arguments, as for the cores themselves.

The cluster secret and the monitor's token are never shown: ``config`` lists every setting but
them.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from roost.client.wire import WireError, check_topic
from roost.node.config import SETTINGS, attr_of
from roost.node.core import BrokerCore

#: /connz and /subsz return at most this many entries per page (NATS's default limit is 1024).
MAX_LIMIT = 1024
MAX_OFFSET = 1_000_000_000  # (beyond any table a node holds; islice refuses past sys.maxsize)
DEFAULT_LIMIT = 100


class BadQuery(ValueError):
    """A query parameter that cannot be used: answered 400 with this text."""


@dataclass
class Info:
    """What the shell knows and the cores do not: identity, start, the process's figures."""

    node_id: str
    version: str
    mode: str  # single, replicated, partitioned
    started_wall: float  # Unix seconds
    started: float  # the core clock at start
    config: dict[str, Any]
    monitor_addr: str = ""
    process: dict[str, float] = field(default_factory=dict)  # cpu_seconds, rss_bytes, max_rss_bytes
    http: dict[str, int] = field(default_factory=dict)  # the endpoint's own connections (node/monitorslots.py)


def node_settings(cfg: Any, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The settings a node runs with, by TOML key (addresses as HOST:PORT), for /varz."""
    out: dict[str, Any] = {}
    for s in SETTINGS:
        v = getattr(cfg, attr_of(s.section, s.key))
        out[attr_of(s.section, s.key)] = f"{v[0]}:{v[1]}" if isinstance(v, tuple) else v
    out.update(extra or {})
    out.pop("secret", None)
    out.pop("monitor_token", None)
    return out


def health(ready: bool, state: str) -> tuple[int, dict[str, Any]]:
    """/healthz: 200 only when the member serves (synced and bound), 503 otherwise, as a load
    balancer or a container healthcheck wants it."""
    if ready:
        return 200, {"status": "ok", "state": state}
    return 503, {"status": "unavailable", "state": state}


def _drops(metrics: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in sorted(metrics.items()) if v and (k.startswith(("dropped_", "error_")) or k in (
        "send_failed", "forward_dropped", "forward_overflow", "relay_dropped", "queue_undeliverable",
        "cancelled_out_of_capacity", "refused_over_capacity"))}  # fmt: skip


def varz(core: BrokerCore, info: Info, now: float) -> dict[str, Any]:
    m = core.metrics
    mailbox_bytes = sum(c.mailbox.nbytes for c in core.clients.values() if c.mailbox is not None)
    return {
        "server_id": info.node_id,
        "version": info.version,
        "mode": info.mode,
        "start": info.started_wall,
        "uptime_s": round(now - info.started, 3),
        "cpu_seconds": info.process.get("cpu_seconds", 0.0),
        "rss_bytes": int(info.process.get("rss_bytes", 0)),
        "max_rss_bytes": int(info.process.get("max_rss_bytes", 0)),
        "client_addr": f"{core.cfg.client_addr[0]}:{core.cfg.client_addr[1]}",
        "monitor_addr": info.monitor_addr,
        "clients": sum(1 for c in core.clients.values() if c.local and c.live),
        "subscriptions": core.index.count,
        "topics": len(core.index.topics),
        "filters": len(core.index.filters),
        "producers": len(core.producers),
        "mailbox_bytes": mailbox_bytes,
        "in_datagrams": m["datagrams_in"],
        "in_bytes": m["bytes_in"],
        "out_datagrams": m["datagrams_out"],
        "out_bytes": m["bytes_out"],
        "in_msgs": m["published"],
        "out_msgs": m["delivered"],
        "retransmitted": m["retransmitted"],
        "errors": m["errors"],
        "drops": _drops(m),
        "counters": {k: v for k, v in sorted(m.items()) if v},
        "monitor": info.http,
        "config": info.config,
    }


def page(query: dict[str, str]) -> tuple[int, int]:
    """``offset`` and ``limit`` of a paged document, checked."""
    try:
        offset = int(query.get("offset", "0"))
        limit = int(query.get("limit", str(DEFAULT_LIMIT)))
    except ValueError:
        raise BadQuery("offset and limit must be integers") from None
    if not 0 <= offset <= MAX_OFFSET or not 1 <= limit <= MAX_LIMIT:
        raise BadQuery(f"offset must be from 0 to {MAX_OFFSET} and limit from 1 to {MAX_LIMIT}")
    return offset, limit


def _served(core: BrokerCore) -> Iterator[Any]:
    """The clients this node serves: those whose home it is (a binary client that sent it
    subscription commands; a text client while it has a subscription here). A publisher that
    never subscribed has no record. The records other members replicate here are theirs to
    list."""
    return (c for c in core.clients.values() if c.local)


def connz(core: BrokerCore, now: float, query: dict[str, str]) -> dict[str, Any]:
    """The clients this node serves, oldest first (the order they arrived in, as NATS lists by
    connection id); ``?subs=1`` lists each one's subscriptions.

    Nothing is sorted: a page is sliced from the core's own client table, so a request costs
    one count of the table plus the page, not a sort of every client on the event loop."""
    offset, limit = page(query)
    detail = query.get("subs") in ("1", "true")
    rows = []
    for c in itertools.islice(_served(core), offset, offset + limit):
        mb = c.mailbox
        binary = c.cid.__class__ is bytes
        row: dict[str, Any] = {
            "cid": c.cid.hex() if binary else None,
            "kind": "binary" if binary else "text",
            "addr": f"{c.addr[0]}:{c.addr[1]}",
            "age_s": round(now - c.since, 3),
            "last_seen_s": round(now - c.last_seen, 3),
            "subscriptions": c.live,
            "mailbox": len(mb) if mb is not None else 0,
            "mailbox_bytes": mb.nbytes if mb is not None else 0,
            "in_flight": (mb.sent - mb.acked) if mb is not None else 0,
        }
        if detail:
            row["subs"] = sorted([t if k is None else f"{t} key={k}", "reliable" if mode else "fire"]
                                 for (t, k), mode in c.modes().items())  # fmt: skip
        rows.append(row)
    total = sum(1 for _ in _served(core))
    return {"server_id": core.node_id, "now_s": round(now, 3), "total": total, "offset": offset,
            "limit": limit, "count": len(rows), "connections": rows}  # fmt: skip


_Row = tuple[str, str | None, int, int, int]
_Filter = tuple[str, dict[str | None, dict[Any, int]], int]  # (text, key -> subscribers, messages matched)


def _rows(text: str, keys: dict[str | None, dict[Any, int]], matched: int) -> Iterator[_Row]:
    """(filter, key, subscribers, reliable ones, messages the filter matched) of each key of
    one filter."""
    for k, subs in keys.items():
        yield text, k, len(subs), sum(1 for mode in subs.values() if mode), matched


def _page_of(filters: Iterator[_Filter], offset: int, limit: int) -> list[_Row]:
    """Rows ``offset`` to ``offset + limit`` of the filters' keys: a filter before the page is
    skipped by its number of keys, without looking at its subscribers."""
    out: list[_Row] = []
    for text, keys, matched in filters:
        if offset >= len(keys):
            offset -= len(keys)
            continue
        out += itertools.islice(_rows(text, keys, matched), offset, offset + limit - len(out))
        offset = 0
        if len(out) >= limit:
            break
    return out


def subsz(core: BrokerCore, query: dict[str, str]) -> dict[str, Any]:
    """Subscriptions by filter and key with their subscriber counts, bare topics first, each in
    the order it was first subscribed; ``?topic=T`` keeps the filters a message on T would match
    (NATS's ``test``), so an operator sees who gets it.

    Like /connz, a page is sliced rather than sorted: the whole listing costs one pass over the
    filters for the total; ``?topic=`` looks up the topic and walks the pattern trie, the path a
    message takes (a filter with a query is listed by its pattern: whether a message passes it
    also depends on the message's tags).

    ``matches`` counts the messages the filter delivered to at least one of its subscribers (any
    key) since it was last created here (it starts again when its last subscriber leaves): NATS's
    per-subscription match count at the cost of one counter per message, not per subscriber. A
    message sent in parts counts per part.
    """
    offset, limit = page(query)
    topic, idx = query.get("topic"), core.index
    if topic is None:
        total = sum(len(keys) for keys in idx.topics.values()) + sum(len(fs.keys) for fs in idx.filters.values())
        every = itertools.chain(((t, keys, idx.matched.get(t, 0)) for t, keys in idx.topics.items()),
                                ((t, fs.keys, fs.matched) for t, fs in idx.filters.items()))  # fmt: skip
        rows = _page_of(every, offset, limit)
    else:
        try:
            check_topic(topic)
        except WireError as exc:
            raise BadQuery(f"topic {topic!r}: {exc.text}") from None
        filters = idx.filters
        hits = sorted([*_rows(topic, idx.topics.get(topic, {}), idx.matched.get(topic, 0)),
                       *(r for text in idx.trie.match(topic.split("."))
                         for r in _rows(text, filters[text].keys, filters[text].matched))],
                      key=lambda r: (r[0], r[1] or ""))  # fmt: skip
        total, rows = len(hits), hits[offset : offset + limit]
    items = [{"filter": f, "key": k, "subscribers": n, "reliable": rel, "matches": hits}
             for f, k, n, rel, hits in rows]  # fmt: skip
    return {
        "server_id": core.node_id, "num_subscriptions": idx.count, "num_delivered": core.metrics["delivered"],
        "topic": topic, "total": total, "offset": offset, "limit": limit, "count": len(items),
        "subscriptions": items,
    }  # fmt: skip


def clusterz(info: Info, status: dict[str, Any] | None) -> dict[str, Any]:
    """The cluster as this member sees it (what ``roost status`` prints), or ``mode: single``."""
    if status is None:
        return {"server_id": info.node_id, "mode": "single", "members": []}
    out = {"server_id": info.node_id, **status}
    out["map_epoch"] = (status.get("map") or {}).get("epoch", 0)
    return out


class _Collector(Collector):
    """The core's counters and gauges, read at scrape time (no second copy to keep in step)."""

    def __init__(self, core: BrokerCore, info: Info, now: float, status: dict[str, Any] | None) -> None:
        self.core, self.info, self.now, self.status = core, info, now, status

    def collect(self) -> Iterator[Metric]:
        core, info, node = self.core, self.info, [self.info.node_id]
        counters = CounterMetricFamily("roost_events", "Counted events of the broker core, by name "
                                       "(the keys of /varz counters)", labels=["node", "event"])  # fmt: skip
        for k, n in sorted(core.metrics.items()):
            counters.add_metric([*node, k], n)
        yield counters
        for name, doc, value in (
            ("messages_in", "Messages published at this node", core.metrics["published"]),
            ("messages_out", "Messages delivered by this node", core.metrics["delivered"]),
            ("datagrams_in", "Datagrams received on the client port", core.metrics["datagrams_in"]),
            ("datagrams_out", "Datagrams sent on the client port", core.metrics["datagrams_out"]),
            ("bytes_in", "Bytes received on the client port", core.metrics["bytes_in"]),
            ("bytes_out", "Bytes sent on the client port", core.metrics["bytes_out"]),
            ("errors", "Datagrams refused with an error", core.metrics["errors"]),
            ("cpu_seconds", "CPU time of the node process (user + system)", info.process.get("cpu_seconds", 0.0)),
        ):
            c = CounterMetricFamily(f"roost_{name}", doc, labels=["node"])
            c.add_metric(node, value)
            yield c
        http = CounterMetricFamily("roost_monitor_events", "The monitoring endpoint's connections and requests, by "
                                   "event (/varz monitor)", labels=["node", "event"])  # fmt: skip
        for k, n in info.http.items():
            if k not in ("connections", "idle"):
                http.add_metric([*node, k], n)
        yield http
        v = varz(core, info, self.now)
        for name, doc, gauge in (
            ("clients", "Clients this node serves", v["clients"]),
            ("subscriptions", "Subscriptions this node holds", v["subscriptions"]),
            ("topics", "Bare topics with subscribers", v["topics"]),
            ("producers", "Producers whose sequences are remembered", v["producers"]),
            ("mailbox_bytes", "Bytes of unacknowledged reliable messages held", v["mailbox_bytes"]),
            ("uptime_seconds", "Seconds since the node started", v["uptime_s"]),
            ("resident_memory_bytes", "Resident memory of the node process", v["rss_bytes"]),
            ("monitor_connections", "Connections open to the monitoring endpoint", info.http.get("connections", 0)),
            (
                "ready",
                "1 when /healthz says ok",
                1 if self.status is None or self.status.get("state") == "ready" else 0,
            ),
        ):
            g = GaugeMetricFamily(f"roost_{name}", doc, labels=["node"])
            g.add_metric(node, gauge)
            yield g
        if self.status is not None:
            up = GaugeMetricFamily("roost_cluster_member_up", "1 when this member sees the member ready",
                                   labels=["node", "member", "state"])  # fmt: skip
            queue = GaugeMetricFamily("roost_cluster_peer_queue", "Changes queued for a peer",
                                      labels=["node", "member"])  # fmt: skip
            for mem in self.status.get("members", []):
                up.add_metric([*node, mem["id"], mem["state"]], 1 if mem["state"] == "ready" else 0)
                queue.add_metric([*node, mem["id"]], mem["queue"])
            yield up
            yield queue
            epoch = GaugeMetricFamily("roost_cluster_map_epoch", "Epoch of the installed cluster map (partitioned)",
                                      labels=["node"])  # fmt: skip
            epoch.add_metric(node, (self.status.get("map") or {}).get("epoch", 0))
            yield epoch


def metrics(core: BrokerCore, info: Info, now: float, status: dict[str, Any] | None) -> bytes:
    """/metrics in the Prometheus text format (0.0.4)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(core, info, now, status))
    return generate_latest(registry)
