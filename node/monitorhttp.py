"""The monitoring endpoint's HTTP server: h11 (a sans-IO HTTP/1.1 parser) over trio streams.

A handful of GET paths answered from the live cores on the event loop (node/monitor.py builds
each document), so a scrape never sees a core half-way through a call. The server is small on
purpose: GET and HEAD only, keep-alive, and the limits of ``[monitor]`` (docs/security.md):

- a request must be read and its answer sent within ``request_timeout`` of its first byte
  (slowloris), and a connection with no request under way is closed after ``idle_timeout``;
- at most ``max_connections`` at once, ``max_per_host`` per source address: a new connection
  past them takes the place of an idle one (node/monitorslots.py) and is refused, closed at once
  without a task, only when every connection has a request under way; idle clients can never
  shut out a health check;
- with a token set, every path but /healthz needs ``Authorization: Bearer TOKEN`` (else 401), and
  a listener on anything but loopback without one is logged at start (``monitor_unprotected``).
"""

from __future__ import annotations

import contextlib
import errno
import hmac
import ipaddress
import json
import os
import resource
import socket
import urllib.parse
from collections.abc import Callable, Iterable
from http import HTTPStatus
from typing import Any

import h11
import trio

from roost.node import monitor
from roost.node.admission import host_key
from roost.node.config import NodeConfig
from roost.node.core import BrokerCore
from roost.node.logs import EventLog
from roost.node.monitorslots import Slots

PATHS = {
    "/healthz": "200 when the node serves (a cluster member: synced), 503 otherwise",
    "/varz": "identity, uptime, CPU, memory, traffic, drops by reason, config",
    "/connz": "clients: address, age, subscriptions, mailbox, in flight, last seen (?offset=&limit=&subs=1)",
    "/subsz": "subscriptions by filter and key (?topic=T: those a message on T matches; ?offset=&limit=)",
    "/clusterz": "members and their states, map epoch, peer queues, digest",
    "/metrics": "Prometheus text format",
}

#: The one path open without the token: load balancers and container healthchecks have none.
OPEN_PATH = "/healthz"

Response = tuple[int, str, bytes]
_GONE = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)
#: accept() errors that concern one connection only (gone before it was taken, a firewall's
#: refusal): the next one is taken. As trio's SocketListener.accept skips them.
_ONE_LOST = frozenset(getattr(errno, n) for n in (
    "ECONNABORTED", "ECONNRESET", "EPERM", "EPROTO", "ETIMEDOUT", "ENETDOWN", "ENETUNREACH", "EHOSTDOWN",
    "EHOSTUNREACH", "ENONET", "ENOPROTOOPT", "EOPNOTSUPP", "ENOSR", "ESOCKTNOSUPPORT", "EPROTONOSUPPORT",
) if hasattr(errno, n))  # fmt: skip
_ACCEPT_BATCH = 256  # (connections taken per wake-up before other tasks run)
_BUSY_BODY = b'{"error": "busy: every monitoring connection has a request under way"}\n'
#: What a refused connection is told, sent without blocking as it is closed.
BUSY = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
        b"retry-after: 1\r\nconnection: close\r\n\r\n%s") % (len(_BUSY_BODY), _BUSY_BODY)  # fmt: skip


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
        self.http: Callable[[], dict[str, int]] = dict  # (the server's connection figures, once it serves)

    def get(self, path: str, query: dict[str, str]) -> Response:
        if path == OPEN_PATH:
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
        self.info.http = self.http()
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
    """Serve the endpoint on ``listeners`` until cancelled (they are closed then)."""
    server = _Server(documents, log, cfg)
    documents.http = server.slots.figures
    for listener in listeners:
        host, port = listener.socket.getsockname()[:2]
        if not cfg.monitor_token and not ipaddress.ip_address(host).is_loopback:
            log("warning", "monitor_unprotected", addr=f"{host}:{port}",
                hint="every path is open to whoever reaches this address: set [monitor] token or token_file "
                     "(or ROOST_MONITOR_TOKEN), or bind loopback")  # fmt: skip
    async with trio.open_nursery() as nursery:
        for listener in listeners:
            nursery.start_soon(server.accept, listener, nursery)


class _Conn:
    """One accepted connection: its socket (a trio stream once admitted), what it had sent by the
    time it was accepted, and the scope that ends its task when it must give way (cancelled, maybe
    before the task entered it)."""

    __slots__ = ("sock", "stream", "first", "scope")
    stream: trio.SocketStream

    def __init__(self, sock: socket.socket, first: bytes) -> None:
        self.sock, self.first, self.scope = sock, first, trio.CancelScope()


def _drop(conn: _Conn) -> None:
    """Close a connection at once, from outside its task (which then ends at its next checkpoint)."""
    conn.scope.cancel()
    conn.stream.socket.close()


class _Server:
    def __init__(self, documents: Documents, log: EventLog, cfg: NodeConfig) -> None:
        self.documents, self.log, self.cfg = documents, log, cfg
        self.slots: Slots[_Conn] = Slots(cfg.monitor_max_connections, cfg.monitor_max_per_host, _drop)
        self.token = cfg.monitor_token.encode()
        self.starved = False

    async def accept(self, listener: trio.SocketListener, nursery: trio.Nursery) -> None:
        """Take connections for as long as the server runs, as the node takes datagrams: every one
        waiting, with plain non-blocking calls (a copy of the listening socket's descriptor), and
        trio only to wait. A connection refused costs an accept, a read and a close: no task."""
        sock = socket.socket(fileno=os.dup(listener.socket.fileno()))
        try:
            async with listener:
                while True:
                    await trio.lowlevel.wait_readable(sock)
                    for _ in range(_ACCEPT_BATCH):
                        try:
                            conn, peer = sock.accept()
                        except BlockingIOError:
                            break
                        except OSError as exc:
                            if exc.errno in _ONE_LOST:
                                continue
                            if not self.starved:  # (any errno but a lost one: logged once a spell, retried)
                                self.log("warning", "monitor_accept_failed", error=os.strerror(exc.errno or 0))
                            self.starved = True
                            await trio.sleep(0.1)
                            break
                        self.starved = False
                        self._take(conn, host_key(str(peer[0])), nursery)  # (an IPv6 /64 is one host)
        finally:
            sock.close()

    def _take(self, sock: socket.socket, host: str, nursery: trio.Nursery) -> None:
        """Admit a new connection or refuse it. What it sent already is read now: a health check
        sends its request as it connects, and a connection with a request under way is never
        closed to make room, however many connections arrive before its task first runs."""
        sock.setblocking(False)
        try:
            first = sock.recv(65536)
            if not first:  # (connected and gone)
                sock.close()
                return
        except BlockingIOError:
            first = b""
        except OSError:
            sock.close()
            return
        conn = _Conn(sock, first)
        if not self.slots.admit(conn, host, busy=bool(first)):
            with contextlib.suppress(OSError):  # (what it sent is read: the close is no reset that loses this)
                sock.send(BUSY)
            sock.close()
            return
        conn.stream = trio.SocketStream(trio.socket.from_stdlib_socket(sock))
        nursery.start_soon(self.connection, conn)

    async def connection(self, conn: _Conn) -> None:
        try:
            with conn.scope, trio.move_on_after(self.cfg.monitor_connection_timeout), contextlib.suppress(*_GONE):
                await self._exchanges(conn)
        except Exception as exc:  # a bug must cost one scrape, never the node
            self.log("error", "monitor_error", error=repr(exc)[:200])
        finally:
            self.slots.leave(conn)
            conn.stream.socket.close()

    async def _exchanges(self, conn: _Conn) -> None:
        """Requests on one connection, each within request_timeout of its first byte; idle (no
        byte of a request) at most idle_timeout in between."""
        cfg, stream, counts = self.cfg, conn.stream, self.slots.counts
        h = h11.Connection(h11.SERVER, max_incomplete_event_size=cfg.monitor_max_request_head)
        if conn.first:  # (b"" would tell h11 the client closed)
            h.receive_data(conn.first)
        while True:
            if not h.trailing_data[0]:  # (no byte of the next request yet: idle)
                self.slots.idle(conn)
                data = None
                with trio.move_on_after(cfg.monitor_idle_timeout):
                    data = await stream.receive_some(65536)
                if data is None:
                    counts["idle_closed"] += 1
                    return
                if not data:
                    return
                h.receive_data(data)
            self.slots.busy(conn)
            with trio.move_on_after(cfg.monitor_request_timeout) as limit:
                again = await self._exchange(h, stream)
            if limit.cancelled_caught:
                counts["request_timeouts"] += 1
                return
            if not again:
                return
            h.start_next_cycle()

    async def _exchange(self, h: h11.Connection, stream: trio.SocketStream) -> bool:
        """Read one request and answer it; whether the connection may carry another."""
        head = self.cfg.monitor_max_request_head
        try:
            request = await _next(h, stream)
            if not isinstance(request, h11.Request):  # (ConnectionClosed: the client is done)
                return False
            if _head_size(request) > head:  # (h11 bounds only a head it has not seen the end of)
                raise h11.RemoteProtocolError("request head too large", error_status_hint=431)
            event, body = request, 0
            while not isinstance(event, h11.EndOfMessage):  # (a body is read and ignored, up to a head's size)
                event = await _next(h, stream)
                if isinstance(event, h11.ConnectionClosed):
                    return False
                if isinstance(event, h11.Data) and (body := body + len(event.data)) > head:
                    raise h11.RemoteProtocolError("request body too large", error_status_hint=413)
            self.slots.counts["requests"] += 1
            code, ctype, data, extra = self._answer(request)
            await _send(h, stream, code, ctype, b"" if request.method == b"HEAD" else data, len(data), extra)
            return h.our_state is not h11.MUST_CLOSE and h.their_state is not h11.MUST_CLOSE
        except h11.RemoteProtocolError as exc:
            if h.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                code, ctype, data = _json(exc.error_status_hint, {"error": str(exc)})
                await _send(h, stream, code, ctype, data, len(data))
            return False

    def _answer(self, request: h11.Request) -> tuple[int, str, bytes, list[tuple[str, str]]]:
        path, _, qs = request.target.decode("ascii", "replace").partition("?")
        path = path.rstrip("/") or "/"
        if self.token and path != OPEN_PATH:
            denied = self._denied(request.headers)
            if denied is not None:
                self.slots.counts["unauthorized"] += 1
                return (*_json(401, {"error": "this path needs Authorization: Bearer <[monitor] token>"}),
                        [("www-authenticate", denied)])  # fmt: skip
        if request.method not in (b"GET", b"HEAD"):
            return (*_json(405, {"error": "only GET and HEAD"}), [("allow", "GET, HEAD")])
        try:
            query = dict(urllib.parse.parse_qsl(qs, max_num_fields=20))
        except ValueError:
            return (*_json(400, {"error": "at most 20 query fields"}), [])
        return (*self.documents.get(path, query), [])

    def _denied(self, headers: Iterable[tuple[bytes, bytes]]) -> str | None:
        """None when the request carries the token (one Authorization header, scheme Bearer,
        compared in constant time), else the WWW-Authenticate challenge to answer with (RFC 6750:
        ``invalid_token`` when a token was given and is wrong)."""
        given = [v for k, v in headers if k == b"authorization"]  # (h11 lowercases header names)
        if not given:
            return 'Bearer realm="roost"'
        scheme, _, value = given[0].partition(b" ")
        if len(given) == 1 and scheme.lower() == b"bearer" and hmac.compare_digest(value.strip(), self.token):
            return None
        return 'Bearer realm="roost", error="invalid_token"'


def _head_size(request: h11.Request) -> int:
    """The bytes of a request line and headers, as sent (give or take the spaces h11 strips)."""
    return len(request.method) + len(request.target) + 12 + sum(len(k) + len(v) + 4 for k, v in request.headers)


async def _next(h: h11.Connection, stream: trio.SocketStream) -> Any:
    """The next h11 event, reading as much as it takes (the caller bounds the time)."""
    while (event := h.next_event()) is h11.NEED_DATA:
        h.receive_data(await stream.receive_some(65536))
    return event


async def _send(h: h11.Connection, stream: trio.SocketStream, code: int, ctype: str, body: bytes, length: int,
                extra: list[tuple[str, str]] | None = None) -> None:  # fmt: skip
    headers = [("content-type", ctype), ("content-length", str(length)), ("cache-control", "no-store"),
               *(extra or [])]  # fmt: skip
    data = h.send(h11.Response(status_code=code, headers=headers, reason=HTTPStatus(code).phrase))
    if body:
        data = (data or b"") + (h.send(h11.Data(data=body)) or b"")
    data = (data or b"") + (h.send(h11.EndOfMessage()) or b"")
    await stream.send_all(data)
