"""The trio client: :class:`Client`, the client API (client/api.py) over :class:`TrioShell`, the
I/O primitives (client/shell.py) on trio.

Per session of the router: one UDP socket (its own source port, so MSGS for a session's client
id reach that session alone) and one background task that drains it, feeds the router, fires
the session's timers and sends what it produces. API calls (client/api.py) change the router and
wake those tasks; awaiting callers sleep on a single "something changed" event. Two shortcuts
cut a hop's latency where no batching is lost, as client/turns.py's policy decides (the asyncio
shell's too): on a quiet path an API call makes the loop's turn itself (``_turn_here``), and
on a sparse one a waiting task drives the socket while the loop's task parks
(``_until_driving``).

    async with Client("127.0.0.1:7400") as c:
        async with c.subscribe("prices", mode="reliable") as sub:
            await c.publish("prices", b"42")
            msg = await sub.next()
"""

from __future__ import annotations

import math
import socket
from collections.abc import Callable
from typing import Any

import trio

from roost.client.api import ClientAPI, ClientClosed, LogRead, NodeLost, Request, Subscription, durable_id
from roost.client.connection import Connection
from roost.client.receive import Message
from roost.client.router import Router
from roost.client.session import ClientConfig, ClientSession
from roost.client.shell import Shell
from roost.client.turns import CALLER, LOOP, WAITER, TurnPolicy
from roost.client.udp import open_client_socket, yield_cpu

Addr = tuple[str, int]

__all__ = ["Client", "ClientClosed", "ClientConfig", "LogRead", "Message", "NodeLost", "Request", "Subscription",
           "durable_id"]  # fmt: skip


class TrioShell(Shell):
    """The I/O primitives on trio (see the module): the tasks that drive ``conn``'s sessions, as
    ``turns`` decides."""

    def __init__(self, conn: Connection, turns: TurnPolicy) -> None:
        self.conn = conn
        self.socks = conn.socks  # (the connection's, never rebound: id(session) -> its socket)
        self._turns = turns  # (quiet path, bursts, sparse path, held sends)
        self._nursery: trio.Nursery | None = None
        self._changed = trio.Event()
        self._wait_scopes: dict[int, trio.CancelScope] = {}
        # (the loops waiting, or a task driving a socket: a kick wakes these; never rebound)
        self.kick_wakes = self._wait_scopes
        # A waiting task that drives a session's socket itself (_until_driving): the session's
        # id while it does, and the event its parked I/O loop waits on until it gives it back.
        self._driver: int | None = None
        self._handed_back = trio.Event()

    # ------------------------------------------------------------ primitives (client/shell.py)

    def now(self) -> float:
        return trio.current_time()

    async def until(self, cond: Callable[[], bool], deadline: float = math.inf) -> bool:
        if cond():
            return True
        r, start = self.conn._router, trio.current_time()
        try:
            s = self._drivable(r) if r is not None and self._turns.drives() else None
            if s is not None:
                return await self._until_driving(cond, deadline, s)
            with trio.move_on_at(deadline):
                while not cond():
                    if self.conn.closed:
                        raise self.conn.closed_error()
                    await self._changed.wait()
                return True
            return False
        finally:
            self._turns.waited(start, trio.current_time())

    def _drivable(self, r: Router) -> ClientSession | None:
        """The session whose socket a waiting task may drive itself: an open client with one
        session, its socket open (and no new one due), and nobody driving it yet. Its loop
        parks wherever it is: waiting on the socket (the wait is cancelled) or about to turn
        (it looks at ``_driver`` first)."""
        if self.conn.closed or self._driver is not None or len(r.sessions) != 1:
            return None
        s = r.sessions[0]
        return s if self.conn.socket_fits(s) else None

    async def _until_driving(self, cond: Callable[[], bool], deadline: float, s: ClientSession) -> bool:
        """``until`` on a sparse path: the waiting task makes the I/O loop's turns itself while
        its loop is parked, so a datagram that satisfies ``cond`` is handled and taken by the
        task that waits for it, with no hand-off from the loop's task in between (W3's last
        hop ~25 us sooner: docs/performance.md). Sparse: the last wait lasted ``idle_gap`` or
        more, so a busy subscriber (whose waits are short) keeps the loop's task and pays
        nothing for the parking (W1). Anything the loop would do happens here: timers, sends
        kicked by other tasks (a kick cancels this task's wait, as it would the loop's, or
        makes a quiet turn of its own, which ends the wait when it changed anything), waking
        the other waiters; the loop, woken as this wait ends, takes its socket back once this
        task yields. The turn that satisfies ``cond`` holds what it would send (a message's
        ACK) for that next turn of the loop, so the subscriber has its message first (W3
        reliable ~20 us): an application that works long without an await delays that ACK as
        it delays every turn of the loop's (the node resends after its retransmit_timeout)."""
        key, r = id(s), self.conn.router
        hold = TurnPolicy.holds(cond)  # (cond inside the turn: it holds the turn's sends)
        self._driver = key
        scope = self._wait_scopes.pop(key, None)
        if scope is not None:
            scope.cancel()  # (the loop's wait_readable ends at once: the socket is free)
        try:
            with trio.move_on_at(deadline):
                while True:
                    if self.conn.closed:
                        raise self.conn.closed_error()
                    try:
                        came, busy = self._turn(s, hold, WAITER)
                    except Exception as exc:  # (as in the loop: the client ends, its waiters hear why)
                        self._broke(exc)
                        raise self.conn.closed_error() from exc
                    if busy:
                        self._wake()
                    if cond():
                        return True
                    if len(r.sessions) != 1 or not self.conn.socket_fits(s):
                        break  # (a map opened sessions, or a new socket is due: the loop's work)
                    if came:
                        await trio.lowlevel.checkpoint()
                    else:
                        await self._wait_socket(s)
            if trio.current_time() >= deadline:
                return False
        finally:
            self._driver = None
            self._handed_back.set()
            self._handed_back = trio.Event()
        return await self.until(cond, deadline)  # (the sessions changed: wait as the loop's task drives)

    def kick(self) -> None:
        """Make the I/O loops flush now instead of at their next deadline (and start the
        loop of any session the router just opened): on a quiet path by a turn made here
        (:meth:`_turn_here`), else by waking them."""
        r = self.conn._router
        if r is not None and len(r.sessions) > len(self.socks):
            self.spawn()
        if self._wait_scopes and not (r is not None and self._turn_here(r)):
            for scope in self._wait_scopes.values():  # (once per wait: trio's cancel costs a few us)
                scope.cancel()
            self._wait_scopes.clear()

    def _turn_here(self, r: Router) -> bool:
        """On a quiet path, make the I/O loop's turn in the calling task (drain, feed the router,
        send) while the loop goes on waiting, its deadline moved, then yield the CPU: a
        publish's datagram leaves before ``publish`` returns instead of after the I/O task was
        woken and scheduled (with the shells' CPU yields, W3 p50 ~50 us sooner: docs/performance.md).
        Quiet: an open client, one session, its loop (or a task driving it: _until_driving)
        waiting on the same socket, and nothing sent or received for ``ClientConfig.idle_gap``;
        then a burst of ``idle_burst`` calls (and as many reliable publishes in flight) within
        idle_gap of each other each makes its turn here. What comes after them, while the path
        stays busy, wakes the loop and goes out together at its turn, so a busy caller's
        publishes share datagrams (the decision: ``TurnPolicy.turn_here``). False when the path
        is not quiet or its burst is spent."""
        if self.conn.closed or len(r.sessions) != 1:
            return False  # (closed or closing: no turn after BYE, none on a closed socket)
        s = r.sessions[0]
        scope = self._wait_scopes.get(id(s))
        if scope is None or not self.conn.socket_fits(s):
            return False  # (not waiting, or a new socket is due: the loop's own turn opens it)
        if not self._turns.turn_here(r, trio.current_time()):
            return False
        try:
            busy = self._turn(s, None, CALLER)[1]
        except Exception as exc:  # (as in the loop: the client ends, its waiters hear why)
            self._broke(exc)
            return True
        if busy:
            self._wake()
        if busy and self._driver is not None:  # (a task that waits on the socket, for what this
            # turn took or changed: its wait ends and it looks again, as _wake's waiters do)
            scope.cancel()
            self._wait_scopes.pop(id(s), None)
        else:
            scope.deadline = min(s.next_deadline(), r.put_deadline())
        if busy:
            yield_cpu()  # (the node, woken on this core by the datagram, runs now: see udp.send_all)
        return True

    async def sleep_until(self, deadline: float) -> None:
        await trio.sleep_until(deadline)

    async def checkpoint(self) -> None:
        await trio.lowlevel.checkpoint()

    async def in_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await trio.to_thread.run_sync(fn, *args)

    async def resolve(self, host: str, port: int) -> list[tuple[Any, ...]]:
        return await trio.socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)

    async def open(self) -> None:
        self._nursery_cm = trio.open_nursery()
        self._nursery = await self._nursery_cm.__aenter__()

    def background(self, fn: Callable[[], Any]) -> None:
        if self._nursery is not None and not self.conn.closed:
            self._nursery.start_soon(fn)

    async def shutdown(self) -> None:
        """Stop the I/O tasks; the caller's own exception, if any, propagates unwrapped."""
        self.conn.closed = True
        self._wake()  # (tasks waiting on the client, outside its block too, hear it closed)
        for scope in list(self._wait_scopes.values()):  # (and a task driving a socket as it waits)
            scope.cancel()
        assert self._nursery is not None
        self._nursery.cancel_scope.cancel()
        try:
            await self._nursery_cm.__aexit__(None, None, None)
        finally:
            for sock in self.socks.values():
                sock.close()

    def spawn(self) -> None:
        """A socket and an I/O task for every session the router opened since we last looked."""
        if self._nursery is None or self.conn.closed or self.conn._router is None:
            return
        for s in self.conn._router.sessions:
            if id(s) not in self.socks:
                self.socks[id(s)] = open_client_socket(s.node, self.conn.config.socket_buffer)
                self._nursery.start_soon(self._run, s)

    # ------------------------------------------------------------ the I/O loop

    async def _run(self, s: ClientSession) -> None:
        try:
            await self._io(s)
        except Exception as exc:  # (a socket that broke: the client ends, its waiters hear why)
            self._broke(exc)

    def _broke(self, exc: Exception) -> None:
        """The I/O failed (a socket broke): the client ends and every waiter hears why."""
        self.conn.fail(exc)
        self._wake()
        for scope in self._wait_scopes.values():  # (the other sessions' loops end too)
            scope.cancel()

    async def _io(self, s: ClientSession) -> None:
        key = id(s)
        while not self.conn.closed:
            if self._driver == key:  # (a waiting task drives this socket: _until_driving)
                await self._handed_back.wait()
                continue
            came, busy = self._turn(s)
            if busy:
                self._wake()
            if came:
                await trio.lowlevel.checkpoint()
                continue
            await self._wait_socket(s)

    async def _wait_socket(self, s: ClientSession) -> None:
        """Wait until the socket of ``s`` is readable or its next deadline; a ``kick`` ends
        the wait early (it cancels the scope kept in ``_wait_scopes``)."""
        key, r = id(s), self.conn.router
        with trio.CancelScope(deadline=min(s.next_deadline(), r.put_deadline())) as scope:
            self._wait_scopes[key] = scope
            try:
                await trio.lowlevel.wait_readable(self.socks[key])
            finally:  # (also when the nursery is cancelled: a closed client keeps no waiting loop)
                if self._wait_scopes.get(key) is scope:
                    del self._wait_scopes[key]

    def _turn(self, s: ClientSession, hold: Callable[[], bool] | None = None, by: str = LOOP) -> tuple[int, bool]:
        """One turn of session ``s``'s socket (the connection's ``exchange``), on a new socket first when it
        failed over to an address of the other family; ``by``: who makes it (the loop, a caller
        on a quiet path, a waiting task), for the turn policy."""
        key = id(s)
        sock = self.socks[key]
        new = self.conn.socket_for(s, sock)
        if new is not None:
            sock.close()
            sock = self.socks[key] = new
        came, busy = self.conn.exchange(s, sock, hold)
        if busy:
            self._turns.turned(came, trio.current_time(), by)
        return came, busy

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()


class Client(ClientAPI):
    """The client for trio programs: ``async with Client(...) as c`` (see ClientAPI for the API)."""

    _shell_class = TrioShell
