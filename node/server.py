"""The trio shell around :class:`node.core.BrokerCore` for one node.

All it does: drain the UDP socket, hand the batch and the time to the core,
send what the core returns, sleep until the next datagram or timer, and stop
cleanly on SIGINT/SIGTERM or cancellation.
"""

from __future__ import annotations

import math
import os
import random
import signal
import time
from collections.abc import Callable
from typing import Any

import trio

from roost import __version__
from roost.client import wire
from roost.client.addresses import hostport
from roost.client.udp import drain, open_udp, send_all
from roost.node import monitor, monitorhttp
from roost.node.config import NodeConfig, parse_hostport
from roost.node.core import BrokerCore, Log, Send, StatusQuery
from roost.node.logs import EventLog


class NodeServer:
    def __init__(self, cfg: NodeConfig, log: EventLog | None = None, core: BrokerCore | None = None) -> None:
        self.cfg = cfg
        self.log = log or EventLog(cfg.id, cfg.log_level, fmt=cfg.log_format)
        try:
            self.sock = open_udp(*cfg.client_addr, cfg.socket_buffer)
        except OSError as exc:
            host, port = cfg.client_addr
            raise CannotBind(f"cannot bind {host}:{port} (client port): {exc.strerror or exc}") from None
        self.addr = self.sock.getsockname()[:2]
        self.stopping = False
        self.listeners: list[trio.SocketListener] | None = None
        advertised = parse_hostport(cfg.advertise_addr) if cfg.advertise_addr else self.addr
        # The cluster map in WELCOME names the port actually bound: with port 0
        # in the config it is only known now, and clients refuse a map with port 0.
        self.core = core or BrokerCore(
            cfg, random.SystemRandom(), int(time.time() * 1000),  # (the cookie keys are drawn from it)
            members=[[cfg.id, *advertised]],
        )  # fmt: skip
        self.core.pid = os.getpid()
        # Actions beyond Send and Log (a cluster member handles Replicate and
        # adds its view to StatusQuery); returns what to send instead.
        self.on_action: Callable[[Any], list[tuple[Any, bytes]]] | None = None

    def perform(self, actions: list[Any]) -> list[tuple[Any, bytes]]:
        """Log the Log actions; return the Sends in order."""
        sends: list[tuple[Any, bytes]] = []
        for a in actions:
            if a.__class__ is Send:
                sends.append(a)
            elif isinstance(a, Log):
                self.log(a.level, a.event, **a.fields)
            elif self.on_action is not None:
                sends += self.on_action(a)
            elif isinstance(a, StatusQuery):
                sends.append(Send(a.addr, wire.encode_status_reply(a.status)))
        return sends

    def documents(self) -> monitorhttp.Documents:
        """What the monitoring endpoint shows of this node."""
        info = monitor.Info(self.cfg.id, __version__, "single", time.time(), trio.current_time(),
                            monitor.node_settings(self.cfg), self.cfg.monitor_addr)  # fmt: skip
        return monitorhttp.Documents(info, lambda: self.core, self._health)

    def _health(self) -> tuple[bool, str]:
        return (False, "stopping") if self.stopping else (True, "ready")

    async def open(self) -> None:
        """Bind the monitoring port, if any (CannotBind). ``run`` does it when nobody did: a
        caller that wants the error plain, outside any nursery, calls this first."""
        self.listeners = await open_monitor(self.cfg)

    async def run(self, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        if self.listeners is None:
            await self.open()
        async with trio.open_nursery() as nursery:
            if self.listeners:
                nursery.start_soon(monitorhttp.serve, self.listeners, self.documents(), self.log, self.cfg)
            await self._serve(task_status)
            nursery.cancel_scope.cancel()

    async def _serve(self, task_status: Any) -> None:
        core, sock = self.core, self.sock
        bufsize = self.cfg.max_datagram + 1  # one more byte tells "too large" apart
        self.log("info", "node_started", addr=f"{self.addr[0]}:{self.addr[1]}",
                 config=self.cfg.source)  # fmt: skip
        task_status.started(self.addr)
        try:
            while True:
                batch = drain(sock, bufsize)
                now = trio.current_time()
                actions = core.handle_datagrams(batch, now) if batch else []
                deadline = core.next_deadline()
                if deadline is not None and deadline <= now:
                    actions += core.tick(now)
                    deadline = core.next_deadline()
                if actions:
                    await send_all(sock, self.perform(actions), core.metrics)
                if batch:
                    await trio.lowlevel.checkpoint()
                else:
                    with trio.move_on_at(deadline if deadline is not None else math.inf):
                        await trio.lowlevel.wait_readable(sock)
        finally:
            self.stopping = True
            sock.close()
            self.log("info", "node_stopped", **_summary(core))


class CannotBind(Exception):
    """A port this node needs is taken or not ours to bind: the message says which, in one line."""


async def open_monitor(cfg: NodeConfig) -> list[trio.SocketListener]:
    """The monitoring endpoint's listeners ([monitor] addr), or none when it is off."""
    if not cfg.monitor_addr:
        return []
    host, port = parse_hostport(cfg.monitor_addr)
    try:
        listeners = await monitorhttp.open_listeners((host, port))
    except OSError as exc:
        raise CannotBind(f"cannot bind {cfg.monitor_addr} (monitor port): {exc.strerror or exc}") from None
    if port == 0:  # (STATUS and /varz name the port bound, which roost status and top then read)
        cfg.monitor_addr = hostport(host, listeners[0].socket.getsockname()[1])
    return listeners


def _summary(core: BrokerCore) -> dict[str, Any]:
    m = core.metrics
    return {
        "clients": len(core.clients),
        "subscriptions": core.index.count,
        "published": m["published"],
        "errors": m["errors"],
    }


async def wait_for_signal(log: EventLog) -> None:
    """Return at the first SIGINT or SIGTERM (logged)."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            log("info", "signal", name=signal.Signals(signum).name)
            return


async def run_until_signal(make: Callable[[], NodeServer]) -> None:
    """Run a node until SIGINT or SIGTERM, then shut it down cleanly."""
    server = make()
    try:
        await server.open()
    except CannotBind:
        server.sock.close()
        raise
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)
        await wait_for_signal(server.log)
        nursery.cancel_scope.cancel()
