"""The client's connection: the names it was given, the router they became, the sockets of its
sessions, the closed state, and one I/O turn.

A component :class:`roost.client.api.ClientAPI` holds (its ``_conn``), beside the shell that
provides the loop (client/shell.py's :class:`Shell`): the connection resolves the node names
into the router's first session (``connect``), looks them up again when the node goes quiet
(``noticed``), says goodbye, and makes ``exchange``, one turn of a session's socket (drain, feed
the router, fire the due timers, send), the same in every shell, which each shell's I/O loop
calls when the socket is readable or a deadline passed. The shell is given to it once both are
made (``shell``): what the connection needs of the loop (the clock, a wait, a task, a lookup)
it asks of it.
"""

from __future__ import annotations

import functools
import math
import numbers
import os
import socket
import time
from collections.abc import Callable
from typing import Any

from roost.client import addresses
from roost.client.addresses import Addr, NodeSpec
from roost.client.offsets import OffsetFile
from roost.client.router import Router
from roost.client.session import ClientConfig, ClientSession
from roost.client.shell import Shell
from roost.client.udp import drain, open_client_socket, send_now


class NodeLost(ConnectionError):
    """No node answered within ``node_timeout`` (or none could be resolved)."""


class ClientClosed(ConnectionError):
    """A call on a client that was closed (or whose I/O failed), or that waited while it closed."""


def check_timeout(timeout: object, *, zero: bool = False, none: bool = True) -> float | None:
    """``timeout`` as seconds (None: no limit), or a ValueError that says what came, raised
    before the call changes anything: a bad one publishes, subscribes or moves nothing.

    ``zero``: the call can finish without an answer from the cluster (take what is queued, find
    room in the window, see whether all is acknowledged), so 0 means "do not wait", as
    ``queue.Queue.get`` takes it. A call that needs an answer could never have one within 0 s,
    and would only fail after it had asked: there 0 is refused. ``none`` False: a call whose wait
    only its timeout can end refuses None."""
    if timeout is None and none:
        return None
    if isinstance(timeout, numbers.Real) and not isinstance(timeout, bool):
        try:
            seconds = float(timeout)
        except (OverflowError, ValueError):  # (an int past a float's range)
            seconds = math.nan
        if seconds > 0 or (zero and seconds == 0):
            return seconds
    allowed = f"a number of seconds {'>= 0' if zero else '> 0'}"
    raise ValueError(f"timeout must be {'None or ' if none else ''}{allowed}, not {timeout!r}")


class Connection:
    """A client's names, router, sockets and closed state, and its I/O turn (see the module)."""

    def __init__(
        self,
        node: NodeSpec = None,
        *,
        members: NodeSpec = None,
        client_id: bytes | None = None,
        config: ClientConfig | None = None,
        producer_id: bytes | None = None,
        offsets_dir: str | os.PathLike[str] | None = None,
        send: Callable[[socket.socket, list[tuple[Addr, bytes]]], int] = send_now,
        router: Callable[..., Router] = Router,
    ) -> None:
        """(The client's arguments: client/api.py's ClientAPI)"""
        if producer_id is not None and len(producer_id) != 16:
            raise ValueError(f"producer_id must be 16 bytes, not {len(producer_id)}")
        self._names = addresses.parse_nodes(node)
        self._names += [a for a in (addresses.parse_nodes(members) if members else []) if a not in self._names]
        self.node: Addr = self._names[0]  # (the resolved address once connected)
        self.config = config or ClientConfig()
        self.client_id = client_id or os.urandom(16)
        self.producer_id = producer_id or os.urandom(16)
        self._router: Router | None = None  # (None until connected: the shells look before they use it)
        self._send, self._make_router = send, router
        self.socks: dict[int, socket.socket] = {}  # id(session) -> its socket (the shell opens and closes them)
        self.shell: Shell  # (given once both are made: client/api.py)
        self.closed = False
        self.error: BaseException | None = None  # what stopped the I/O, if it failed
        self._resolving = False
        self._resolve_after = 0.0
        self._literal = all(addresses.is_literal(h) for h, _ in self._names)  # (nothing to look up again)
        self.send_errors = 0
        self.session_errors = 0  # datagrams the session failed on (a bug; the client carries on)
        self.last_session_error: Exception | None = None
        self.offsets = OffsetFile(offsets_dir) if offsets_dir is not None else None

    @property
    def router(self) -> Router:
        if self._router is None:
            raise RuntimeError("the client is not connected: use 'async with Client(...)' first")
        return self._router

    @property
    def session(self) -> ClientSession:
        """The first session: the user's client id, talking to ``node`` (the only one
        unless a partitioned cluster sent its map)."""
        return self.router.first

    def deadline(self, timeout: float | None, *, zero: bool = False, none: bool = True) -> float:
        """The loop-clock time ``timeout`` seconds from now (None: never); a bad ``timeout`` is
        refused (check_timeout)."""
        seconds = check_timeout(timeout, zero=zero, none=none)
        return math.inf if seconds is None else self.shell.now() + seconds

    def check_open(self) -> None:
        if self.closed:
            raise self.closed_error()

    def closed_error(self) -> ClientClosed:
        if self.error is not None:
            return ClientClosed(f"the client's I/O failed: {self.error!r}")
        return ClientClosed("the client is closed")

    def fail(self, exc: BaseException) -> None:
        """The I/O hit an error it cannot carry on from (a socket that broke): the client ends,
        and every call waiting on it raises ClientClosed instead of waiting for ever."""
        if self.error is None:
            self.error = exc
        self.closed = True

    def goodbye(self) -> None:
        """Tell every node we talk to that we are closing (BYE), so that each drops our
        subscriptions now rather than log a time-out ``subscriber_timeout`` later. Once, on
        each session's own socket; a lost BYE leaves the time-out to do it. The ACKs not sent
        yet go before it (a turn that brought what a task waited for holds them back: the
        trio shell's ``_until_driving``), so a message the application took just before it
        left is acknowledged; nothing else queued is sent."""
        if self._router is None or self.error is not None or self.closed:
            return
        for s in self._router.sessions:
            sock = self.socks.get(id(s))
            if sock is not None and sock.fileno() >= 0:
                self.send_errors += self._send(sock, s.close())

    async def connect(self) -> None:
        """Resolve the names, make the router and wait for its first session's WELCOME."""
        addrs: list[Addr] = []
        why: list[str] = []
        for host, port in self._names:
            for a in await self._addresses(host, port, why):
                if a not in addrs:
                    addrs.append(a)
        if not addrs:
            raise NodeLost(f"cannot resolve {addresses.show(self._names)}: {'; '.join(why)}")
        self.node = addrs[0]
        self._router = self._make_router(
            self.client_id, self.producer_id, os.urandom(16), self.config, self.shell.now(),
            node=addrs[0], members=addrs[1:], session=int(time.time() * 1000),
        )  # fmt: skip
        self.shell.spawn()
        await self.shell.until(lambda: self.session.connected or self.session.lost)
        if not self.session.connected:
            raise NodeLost(f"no answer from node {addresses.show(self.session.candidates)}")

    async def _addresses(self, host: str, port: int, why: list[str]) -> list[Addr]:
        if addresses.is_literal(host):
            return [(host, port)]
        try:
            return addresses.ordered(await self.shell.resolve(host, port))
        except (OSError, UnicodeError) as exc:  # (UnicodeError: a label IDNA cannot encode)
            why.append(f"{host}: {getattr(exc, 'strerror', None) or exc}")
            return []

    def _noticed(self, s: ClientSession, now: float, events: list[tuple[Any, ...]]) -> None:
        """Every I/O turn: once the user's session misses a PONG (and when it fails over), look its
        node names up again, at most once per ``node_timeout``: a container that moved has a new
        address under the same name, and the session can only fail over to addresses it has."""
        if self._resolving or now < self._resolve_after or s is not self.router.first or self._literal:
            return
        if now - s.last_heard < s.ping_interval * 1.5 and not any(e[0] == "node_silent" for e in events):
            return
        self._resolving = True
        self._resolve_after = now + self.config.node_timeout
        self.shell.background(functools.partial(self._reresolve, s))

    async def _reresolve(self, s: ClientSession) -> None:
        try:
            for host, port in self._names:
                if not addresses.is_literal(host):
                    s.add_candidates(await self._addresses(host, port, []))
        finally:
            self._resolving = False

    def exchange(self, s: ClientSession, sock: socket.socket,
                 hold: Callable[[], bool] | None = None) -> tuple[int, bool]:  # fmt: skip
        """One turn of session ``s``'s socket, the same in every shell: drain what is ready, feed
        the router, fire the session's due timers, send what it produced. Returns how many
        datagrams came and whether anything happened (the shell then wakes its waiters).
        ``hold``: when datagrams came and it holds once they are fed, the session keeps what
        it would send for the next turn (the trio shell's waiting task that drives the socket:
        its loop, woken as the wait ends, makes that turn as soon as the task yields)."""
        r = self.router
        batch = drain(sock, 65536)
        now = self.shell.now()
        if batch:
            try:
                r.handle_datagrams(s, batch, now)
            except Exception as exc:
                # The session validates every frame and ignores what it cannot use, so an
                # exception here is a bug the datagrams found. Anyone who can send from a
                # node's address could trigger it again and again, so it must not take the
                # client down: the rest of the batch is lost as UDP may lose it, and the
                # protocols' retries repair that.
                self.session_errors += 1
                self.last_session_error = exc
        if now >= min(s.next_deadline(), r.put_deadline()):
            r.tick(s, now)
        if len(r.sessions) > len(self.socks):
            self.shell.spawn()  # (the router opened a session here: a put for a new primary)
        # (a task that waits for what came takes it before the answers go: a message's ACK
        # leaves after its subscriber has it, at the next turn; W3 reliable p50 ~20 us lower)
        out = [] if batch and hold is not None and hold() else s.outgoing(now)
        if out:
            self.send_errors += self._send(sock, out)
        events = s.take_events()
        self._noticed(s, now, events)
        return len(batch), bool(batch or events or out)

    def socket_fits(self, s: ClientSession) -> bool:
        """``s`` has its socket, of its node's family (else its loop's next turn opens a new one)."""
        sock = self.socks.get(id(s))
        return sock is not None and sock.family == addresses.family(s.node)

    def socket_for(self, s: ClientSession, sock: socket.socket) -> socket.socket | None:
        """A new socket when ``s`` failed over to an address of the other family; None to keep
        ``sock`` (also when this host cannot open one: the sends fail, the session times that
        address out and moves on to the next)."""
        if sock.family == addresses.family(s.node):
            return None
        try:
            return open_client_socket(s.node, self.config.socket_buffer)
        except OSError:
            return None
