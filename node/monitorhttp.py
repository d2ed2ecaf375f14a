"""The monitoring endpoint's HTTP server: h11 (a sans-IO HTTP/1.1 parser) over trio streams.

A handful of GET paths answered from the live cores on the event loop (node/monitor.py builds
each document), so a scrape never sees a core half-way through a call. The server is small on
purpose: GET and HEAD only, keep-alive, and the limits of ``[monitor]`` (docs/configuration.md):
a bounded request head, a connection idle or open too long closed, a bounded number at once (more
are closed at once).
It has no authentication: bind it to loopback or a private network (docs/operations.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import urllib.parse
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

import h11
import trio

from roost.node import monitor
from roost.node.config import NodeConfig
from roost.node.core import BrokerCore
from roost.node.logs import EventLog

PATHS = {
    "/healthz": "200 when the node serves (a cluster member: synced), 503 otherwise",
    "/varz": "identity, uptime, CPU, memory, traffic, drops by reason, config",
    "/connz": "clients: address, age, subscriptions, mailbox, in flight, last seen (?offset=&limit=&subs=1)",
    "/subsz": "subscriptions by filter and key (?topic=T: those a message on T matches; ?offset=&limit=)",
    "/clusterz": "members and their states, map epoch, peer queues, digest",
    "/metrics": "Prometheus text format",
}

Response = tuple[int, str, bytes]
_GONE = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)


def process_figures() -> dict[str, float]:
    """CPU seconds and memory of this process (Linux: the resident size from /proc)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    out = {"cpu_seconds": round(ru.ru_utime + ru.ru_stime, 3), "max_rss_bytes": ru.ru_maxrss * 1024.0}
    try:
        with open("/proc/self/statm", "rb") as f:
            out["rss_bytes"] = float(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, IndexError):
        out["rss_bytes"] = out["max_rss_bytes"]
    return out


class Documents:
    """Path -> response, from the cores as they are now.

    ``core`` and ``status`` are callables because a cluster member makes its cores only when it
    runs; until then every path but /healthz answers 503."""

    def __init__(
        self, info: monitor.Info, core: Callable[[], BrokerCore | None], ready: Callable[[], tuple[bool, str]],
        status: Callable[[], dict[str, Any] | None] = lambda: None,
    ) -> None:  # fmt: skip
        self.info, self.core, self.ready, self.status = info, core, ready, status

    def get(self, path: str, query: dict[str, str]) -> Response:
        if path == "/healthz":
            code, doc = monitor.health(*self.ready())
            return _json(code, doc)
        if path in ("", "/"):
            return _json(200, {"server_id": self.info.node_id, "paths": PATHS})
        if path not in PATHS:
            return _json(404, {"error": f"no such path: {path}", "paths": sorted(PATHS)})
        core = self.core()
        if core is None:
            return _json(503, {"error": "starting"})
        now = trio.current_time()
        self.info.process = process_figures()
        try:
            if path == "/varz":
                return _json(200, monitor.varz(core, self.info, now))
            if path == "/connz":
                return _json(200, monitor.connz(core, now, query))
            if path == "/subsz":
                return _json(200, monitor.subsz(core, query))
            if path == "/clusterz":
                return _json(200, monitor.clusterz(self.info, self.status()))
            return 200, "text/plain; version=0.0.4; charset=utf-8", monitor.metrics(core, self.info, now, self.status())
        except monitor.BadQuery as exc:
            return _json(400, {"error": str(exc)})


def _json(code: int, doc: dict[str, Any]) -> Response:
    return code, "application/json", json.dumps(doc, indent=2, sort_keys=True).encode() + b"\n"


async def open_listeners(addr: tuple[str, int]) -> list[trio.SocketListener]:
    """Bind the monitoring port (OSError if it cannot: the caller says so in one line)."""
    return await trio.open_tcp_listeners(addr[1], host=addr[0])


async def serve(listeners: list[trio.SocketListener], documents: Documents, log: EventLog, cfg: NodeConfig) -> None:
    limit = trio.CapacityLimiter(cfg.monitor_max_connections)

    async def handler(stream: trio.SocketStream) -> None:
        try:
            limit.acquire_nowait()
        except trio.WouldBlock:  # (full: refused at once, not queued, so files cannot pile up)
            with trio.move_on_after(1):
                await stream.aclose()
            return
        try:
            # (a slow or non-reading client lets go; one that went away ends its connection)
            with trio.move_on_after(cfg.monitor_connection_timeout), contextlib.suppress(*_GONE):
                await _connection(stream, documents, cfg)
        except Exception as exc:  # a bug must cost one scrape, never the node
            log("error", "monitor_error", error=repr(exc)[:200])
        finally:
            limit.release()
            with trio.move_on_after(1):
                await stream.aclose()

    await trio.serve_listeners(handler, listeners)


async def _connection(stream: trio.SocketStream, documents: Documents, cfg: NodeConfig) -> None:
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=cfg.monitor_max_request_head)
    idle, head = cfg.monitor_idle_timeout, cfg.monitor_max_request_head
    try:
        while True:
            event = await _next(conn, stream, idle)
            if event is None or isinstance(event, h11.ConnectionClosed):
                return
            if not isinstance(event, h11.Request):
                return
            if _head_size(event) > head:  # (h11 bounds only a head it has not seen the end of)
                raise h11.RemoteProtocolError("request head too large", error_status_hint=431)
            end = await _next(conn, stream, idle)
            while not isinstance(end, h11.EndOfMessage | None):  # (a body is read and ignored)
                end = await _next(conn, stream, idle)
            if end is None:  # (a body announced and never sent: nothing to answer)
                return
            if event.method not in (b"GET", b"HEAD"):
                code, ctype, body = _json(405, {"error": "only GET and HEAD"})
            else:
                target = event.target.decode("ascii", "replace")
                path, _, qs = target.partition("?")
                try:
                    query = dict(urllib.parse.parse_qsl(qs, max_num_fields=20))
                except ValueError:
                    code, ctype, body = _json(400, {"error": "at most 20 query fields"})
                else:
                    code, ctype, body = documents.get(path.rstrip("/") or "/", query)
            await _send(conn, stream, code, ctype, b"" if event.method == b"HEAD" else body, len(body))
            if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
                return
            conn.start_next_cycle()
    except h11.RemoteProtocolError as exc:
        if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            code, ctype, body = _json(exc.error_status_hint, {"error": str(exc)})
            await _send(conn, stream, code, ctype, body, len(body))


def _head_size(request: h11.Request) -> int:
    """The bytes of a request line and headers, as sent (give or take the spaces h11 strips)."""
    return len(request.method) + len(request.target) + 12 + sum(len(k) + len(v) + 4 for k, v in request.headers)


async def _next(conn: h11.Connection, stream: trio.SocketStream, idle: float) -> Any:
    """The next h11 event; None when the client stays silent for ``idle`` seconds."""
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        with trio.move_on_after(idle):
            conn.receive_data(await stream.receive_some(65536))
            continue
        return None


async def _send(conn: h11.Connection, stream: trio.SocketStream, code: int, ctype: str, body: bytes,
                length: int) -> None:  # fmt: skip
    headers = [("content-type", ctype), ("content-length", str(length)), ("cache-control", "no-store")]
    data = conn.send(h11.Response(status_code=code, headers=headers, reason=HTTPStatus(code).phrase))
    if body:
        data = (data or b"") + (conn.send(h11.Data(data=body)) or b"")
    data = (data or b"") + (conn.send(h11.EndOfMessage()) or b"")
    await stream.send_all(data)
