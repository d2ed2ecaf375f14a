"""The trio shell of a cluster member: sockets, timers and files, nothing else.

Every decision is the member core's (cluster/member.py). This shell turns
what happens on the TCP links, the client UDP port, the clock and the disk into
events, hands each to the core, and performs the actions that come back:

* ``SendFrame``/``Dial``/``Close``: one task per peer link reads it and feeds
  ``LinkBytes``; a writer task drains the link's queue with ``send_all``;
* ``Send``: datagrams on the client UDP socket (bound at ``ServeClients``);
* ``ReadSnapshot``/``WriteSnapshot``: file I/O in a worker thread
  (``trio.to_thread``), fsync included, so the event loop never blocks on the
  disk; only when the write and both fsyncs are done does the core hear
  ``PersistDone``;
* ``Exit``: stop.

Bulk merges (a PULL of a million subscriptions) create many long-lived
objects; the cyclic collector is paused only around those synchronous core
calls (never across an await), and once, when the member is ready, what
survived is collected and frozen out of the collector's sight.
"""

from __future__ import annotations

import gc
import ipaddress
import math
import os
import random
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import trio

from roost import __version__
from roost.client.udp import drain, open_udp, send_all, send_ready, yield_cpu
from roost.cluster.config import CLUSTER_SETTINGS, ClusterConfig
from roost.cluster.epochstore import EpochStore, EpochStoreError
from roost.cluster.events import (
    Accepted,
    Close,
    Datagrams,
    Dial,
    EpochsPersisted,
    Event,
    Exit,
    LinkBytes,
    LinkClosed,
    LinkOpened,
    LinkSent,
    Log,
    LogsRead,
    PersistDone,
    PersistEpochs,
    RaftPersisted,
    ReadSnapshot,
    Send,
    SendFrame,
    ServeClients,
    SnapshotRead,
    Start,
    Stop,
    Tick,
    WriteSnapshot,
)  # fmt: skip
from roost.cluster.logstore import LogStore
from roost.cluster.member import MemberCore
from roost.cluster.partitionlog import (
    Append,
    Checkpoint,
    LogSettings,
    ReadLog,
    Reload,
    ResetLog,
    Retain,
    Sync,
    Truncate,
)
from roost.cluster.raftstate import RaftPersist
from roost.cluster.raftstore import QUORUM_DIR, RaftStore, RaftStoreError
from roost.cluster.roster import decode_untrusted_roster
from roost.cluster.snapshot import SNAPSHOT_FILE
from roost.node import monitor, monitorhttp
from roost.node.core import BrokerCore
from roost.node.logs import EventLog
from roost.node.segmentlog import sync_dir
from roost.node.server import CannotBind, open_monitor

T = TypeVar("T")

# (durable partition logs: cluster/logstore.py)
_LOG_ACTIONS = (Append, Sync, Checkpoint, Truncate, ResetLog, ReadLog, Retain, Reload)

# Snapshot chunks handed to one worker-thread call.
_CHUNKS_PER_WRITE = 8


class _LinkIO:
    __slots__ = ("scope", "send", "recv", "closed_by_core")

    def __init__(self) -> None:
        self.scope = trio.CancelScope()
        self.send, self.recv = trio.open_memory_channel[bytes](math.inf)
        self.closed_by_core = False


class ClusterNode:
    def __init__(
        self,
        cc: ClusterConfig,
        member_id: str,
        bind_host: str | None = None,
        peer_hosts: dict[str, str] | None = None,
        log: EventLog | None = None,
        roster: list[Any] | None = None,
        fsync_file: Callable[[Any], object] | None = None,
    ) -> None:
        """``fsync_file(f)`` flushes and fsyncs an open snapshot file (a test gives one that hangs)."""
        self.cc = cc
        self.id = member_id
        self.me = cc.member(member_id)
        self.bind_host = bind_host
        self.peer_hosts = peer_hosts
        self.roster = roster or []  # (a member that joined: the roster its JOIN was answered with)
        self.cfg = cc.node_config(member_id, bind_host)
        self.log = log or EventLog(member_id, self.cfg.log_level, fmt=self.cfg.log_format)
        self._fsync_file = fsync_file or _fsync_file
        self.member: MemberCore | None = None
        self.addr: tuple[str, int] | None = None
        self._links: dict[int, _LinkIO] = {}
        self._next_inbound = -1
        self._wake = trio.Event()
        self._ready = trio.Event()
        self._exit = trio.Event()
        self._sock: socket.socket | None = None
        self.bind_error: OSError | None = None
        self.fatal: str = ""  # the core's reason why this member cannot run (Exit.error)
        # Links we dial leave from our own peer address when it is a specific IP,
        # so that a peer (and a firewall rule) can tell members on one host apart.
        self._local_address = _specific_ip(bind_host or self.me.peer_addr[0])
        # Cancelled when sends are left pending by a full buffer outside the
        # UDP task (a timer or a peer link): the UDP task then sends them.
        self._udp_idle = trio.CancelScope()
        self._udp_pending: list[tuple[Any, bytes]] = []
        self._udp_draining = False  # the UDP task is sending _udp_pending, waiting for buffer room
        self._nursery: trio.Nursery | None = None
        st = cc.settings
        self._logs = LogStore(
            Path(self.me.data_dir) / "log",
            self.log,  # durable partition logs
            LogSettings.of(st),
            st.segment_bytes,
        )
        self._log_queues: dict[int, trio.MemorySendChannel[Any]] = {}  # one ordered queue per partition
        # (the metadata quorum's Raft state, partitioned mode: cluster/raftstore.py)
        self._quorum = RaftStore(Path(self.me.data_dir) / QUORUM_DIR) if st.mode == "partitioned" else None
        self._quorum_queue: trio.MemorySendChannel[RaftPersist] | None = None
        # (the map epochs' ceiling, partitioned mode: cluster/epochstore.py; the core writes one at a time)
        self._epochs = EpochStore(Path(self.me.data_dir)) if st.mode == "partitioned" else None

    # ------------------------------------------------------------ lifecycle

    async def run(self, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled or stopped; ``stop`` writes a last snapshot first."""
        now = trio.current_time()
        self.member = MemberCore(
            self.cc, self.id, rng=random.SystemRandom(), now=now, wall_offset=time.time() - now,
            incarnation=int(time.time() * 1000), bind_host=self.bind_host, peer_hosts=self.peer_hosts,
            roster=decode_untrusted_roster(self.roster),
        )  # fmt: skip
        self.member.broker.pid = os.getpid()
        if self.cc.settings.secret_from == "config":  # (allowed for tests and tries: cluster/secretfile.py)
            self.log(
                "warning",
                "secret_in_config",
                config=self.cc.source,
                hint="keep the secret out of the config: secret_file (mode 0600) or $ROOST_CLUSTER_SECRET",
            )
        host = self.bind_host or self.me.peer_addr[0]
        try:
            listeners = await trio.open_tcp_listeners(self.me.peer_addr[1], host=host)
        except OSError as exc:
            self._close_stores()
            raise CannotBind(f"cannot bind {host}:{self.me.peer_addr[1]} (peer port): {exc.strerror or exc}") from None
        try:
            monitors = await open_monitor(self.cfg)  # (the monitor answers 503 while we sync)
        except CannotBind:
            for listener in listeners:
                await listener.aclose()
            self._close_stores()
            raise
        self.member.broker.cfg.monitor_addr = self.cfg.monitor_addr  # (the port bound: STATUS names it)
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(trio.serve_listeners, self._inbound, listeners)
                if monitors:
                    nursery.start_soon(monitorhttp.serve, monitors, self.documents(), self.log, self.cfg)
                nursery.start_soon(self._timers)
                self._feed(await _in_thread(self._open_logs))  # (durable logs and the quorum's state, before Start)
                self._feed(Start())
                await self._ready.wait()  # (also set when the member exits before serving)
                if self.addr is not None:
                    task_status.started(self.addr)
                await self._exit.wait()
                nursery.cancel_scope.cancel()
        finally:
            if self._sock is not None:
                self._sock.close()
            self._close_stores()

    def documents(self) -> monitorhttp.Documents:
        """What the monitoring endpoint shows of this member."""
        settings = {s.key: getattr(self.cc.settings, s.key) for s in CLUSTER_SETTINGS}
        info = monitor.Info(self.id, __version__, self.cc.settings.mode, time.time(), trio.current_time(),
                            monitor.node_settings(self.cfg, settings), self.cfg.monitor_addr)  # fmt: skip
        return monitorhttp.Documents(info, self._broker, self._health, self._status)

    def _broker(self) -> BrokerCore | None:
        return None if self.member is None else self.member.broker

    def _health(self) -> tuple[bool, str]:
        """Ready: synced (the core's phase) and serving clients (the UDP port is bound)."""
        if self.member is None:
            return False, "starting"
        return self.member.phase == "ready" and self.addr is not None, self.member.phase

    def _status(self) -> dict[str, Any] | None:
        return None if self.member is None else self.member.status()

    async def stop(self) -> None:
        """Ask the core to stop (last snapshot), waiting at most stop_timeout."""
        if self.member is None or self._nursery is None:
            return
        self._feed(Stop())
        with trio.move_on_after(self.cc.settings.stop_timeout):
            await self._exit.wait()
        self._exit.set()

    # ------------------------------------------------------------ core calls

    def _feed(self, ev: Event) -> None:
        assert self.member is not None
        bulk = ev.__class__ is LinkBytes or ev.__class__ is SnapshotRead
        if bulk and gc.isenabled():
            gc.disable()  # synchronous: re-enabled before any other task runs
            try:
                actions = self.member.handle(ev, trio.current_time())
            finally:
                gc.enable()
        else:
            actions = self.member.handle(ev, trio.current_time())
        self._perform(actions)
        self._wake.set()

    def _perform(self, actions: list[Any]) -> None:
        nursery = self._nursery
        assert nursery is not None
        for a in actions:
            cls = a.__class__
            if cls is Send:
                self._udp_pending.append(a)
            elif cls is SendFrame:
                io = self._links.get(a.link)
                if io is not None:
                    io.send.send_nowait(a.data)
            elif cls is Log:
                self.log(a.level, a.event, **a.fields)
            elif cls is Dial:
                io = self._links[a.link] = _LinkIO()
                nursery.start_soon(self._dial, a.link, a.addr, io)
            elif cls is Close:
                io = self._links.pop(a.link, None)
                if io is not None:
                    io.closed_by_core = True
                    io.scope.cancel()
            elif cls is ServeClients:
                self._serve_clients(nursery)
                if self.bind_error is not None:
                    return  # (the member exits: no node_ready after cannot_bind, nothing more to do)
            elif cls is ReadSnapshot:
                nursery.start_soon(self._read_snapshot)
            elif cls is WriteSnapshot:
                nursery.start_soon(self._write_snapshot, a.token, a.chunks)
            elif cls in _LOG_ACTIONS:
                q = self._log_queues.get(a.partition)
                if q is None:
                    q, recv = trio.open_memory_channel[Any](math.inf)
                    self._log_queues[a.partition] = q
                    nursery.start_soon(self._log_worker, recv)
                q.send_nowait(a)
            elif cls is RaftPersist:
                if self._quorum_queue is None:
                    self._quorum_queue, recv_persists = trio.open_memory_channel[RaftPersist](math.inf)
                    nursery.start_soon(self._quorum_worker, recv_persists)
                self._quorum_queue.send_nowait(a)
            elif cls is PersistEpochs:
                nursery.start_soon(self._persist_epochs, a.ceiling)
            elif cls is Exit:
                self.fatal = a.error
                self._exit.set()
                self._ready.set()
        if self._udp_pending and self._sock is not None:
            self._flush_udp()

    async def _timers(self) -> None:
        assert self.member is not None
        while True:
            deadline = self.member.next_deadline()
            with trio.move_on_at(deadline):
                await self._wake.wait()
            self._wake = trio.Event()
            if trio.current_time() >= deadline:
                self._feed(Tick())

    # ------------------------------------------------------------ clients (UDP)

    def _serve_clients(self, nursery: trio.Nursery) -> None:
        host, port = self.cfg.client_addr
        try:
            self._sock = open_udp(host, port, self.cfg.socket_buffer)
        except OSError as exc:
            self.log("error", "cannot_bind", addr=f"{host}:{port}", reason=exc.strerror or str(exc))
            self.bind_error = exc
            self._exit.set()
            self._ready.set()
            return
        self.addr = self._sock.getsockname()[:2]
        self.log("info", "serving", addr=f"{self.addr[0]}:{self.addr[1]}", config=self.cfg.source)
        gc.collect()  # what the start-up left behind, then out of the collector's sight
        gc.freeze()
        nursery.start_soon(self._udp)
        self._ready.set()

    def _flush_udp(self) -> None:
        """Send what the core produced; what would block waits for the UDP task. While that
        task drains a full buffer, new datagrams queue behind the ones it holds (in order)."""
        sock = self._sock
        assert sock is not None and self.member is not None
        if self._udp_draining:
            return
        pending = self._udp_pending
        sent = send_ready(sock, pending, self.member.broker.metrics)
        self._udp_pending = pending[sent:] if sent < len(pending) else []
        if sent:
            yield_cpu()  # (a receiver woken on this core runs first: see udp.send_all)
        if self._udp_pending:
            self._udp_idle.cancel()  # the UDP task sends the rest once the buffer drains

    async def _udp(self) -> None:
        sock = self._sock
        assert sock is not None and self.member is not None
        bufsize = self.cfg.max_datagram + 1  # one more byte tells "too large" apart
        while True:
            if self._udp_pending:
                self._udp_draining = True
                try:  # (in place: what _perform appends meanwhile goes out after it, in order)
                    await send_all(sock, self._udp_pending, self.member.broker.metrics)
                finally:
                    self._udp_draining = False
                self._udp_pending = []
            batch = drain(sock, bufsize)
            if batch:
                self._feed(Datagrams(batch))
                await trio.lowlevel.checkpoint()
            elif not self._udp_pending:
                with self._udp_idle:
                    await trio.lowlevel.wait_readable(sock)
                self._udp_idle = trio.CancelScope()

    # ------------------------------------------------------------ peer links (TCP)

    async def _dial(self, lid: int, addr: tuple[str, int], io: _LinkIO) -> None:
        with io.scope:
            try:
                with trio.fail_after(self.cc.settings.handshake_timeout):
                    stream = await trio.open_tcp_stream(*addr, local_address=self._local_address)
            except (OSError, trio.TooSlowError) as exc:
                self._link_ended(lid, io, _why(exc))
                return
            self._feed(LinkOpened(lid))
            await self._serve_link(lid, stream, io)

    async def _inbound(self, stream: trio.SocketStream) -> None:
        lid = self._next_inbound
        self._next_inbound -= 1
        io = self._links[lid] = _LinkIO()
        try:
            host, port = stream.socket.getpeername()[:2]
            remote = f"{host}:{port}"
        except OSError:
            remote = "?"
        self._feed(Accepted(lid, remote))
        with io.scope:
            await self._serve_link(lid, stream, io)

    async def _serve_link(self, lid: int, stream: trio.SocketStream, io: _LinkIO) -> None:
        """Read into the core, write from the queue; either failing ends both.
        Each half catches its own errors: inside a nursery trio would wrap
        them in an ExceptionGroup, and a reset by a peer must end the link,
        never the member."""
        why: list[str] = []

        async def write(nursery: trio.Nursery) -> None:
            try:
                async for data in io.recv:
                    await stream.send_all(data)
                    self._feed(LinkSent(lid, len(data)))
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                why.append(_why(exc))
            nursery.cancel_scope.cancel()

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(write, nursery)
                try:
                    while True:
                        data = await stream.receive_some(256 * 1024)
                        if not data:
                            why.append("connection closed")
                            break
                        self._feed(LinkBytes(lid, data))
                        if io.closed_by_core:
                            break
                except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    why.append(_why(exc))
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await stream.aclose()
            self._link_ended(lid, io, why[0] if why else "closed")

    def _link_ended(self, lid: int, io: _LinkIO, why: str) -> None:
        if io.closed_by_core:
            return  # the core closed it and knows
        io.closed_by_core = True
        self._links.pop(lid, None)
        self._feed(LinkClosed(lid, why))

    # ------------------------------------------------------------ snapshots (files)

    def _snapshot_path(self) -> str:
        return os.path.join(self.me.data_dir, SNAPSHOT_FILE)

    async def _log_worker(self, recv: trio.MemoryReceiveChannel[Any]) -> None:
        """One partition's disk work, in the order the core asked for it, off the event loop;
        what queued while a batch was on disk goes as the next batch (group commit)."""
        async for a in recv:
            batch = [a]
            while True:  # (what queued meanwhile goes with it: one fsync for a run of appends)
                try:
                    batch.append(recv.receive_nowait())
                except trio.WouldBlock:
                    break
            for ev in await _in_thread(self._logs.perform_all, batch):
                if ev is not None:
                    self._feed(ev)

    def _close_stores(self) -> None:
        self._logs.close()
        if self._quorum is not None:
            self._quorum.close()

    def _open_logs(self) -> LogsRead:
        read = self._logs.open_all()
        if read.error:
            return read
        if self._epochs is not None:
            try:
                read = read._replace(epochs=self._epochs.read())
            except EpochStoreError as exc:
                return LogsRead({}, f"the map epochs: {exc}")
        if self._quorum is None:
            return read
        try:
            stored = self._quorum.open()
        except (RaftStoreError, OSError) as exc:
            return LogsRead({}, f"the quorum's state: {exc}")
        if self._quorum.cut_bytes or self._quorum.dropped:
            self.log("warning", "quorum_log_repaired", cut_bytes=self._quorum.cut_bytes, dropped=self._quorum.dropped)
        return read._replace(quorum=stored)

    async def _quorum_worker(self, recv: trio.MemoryReceiveChannel[RaftPersist]) -> None:
        """The quorum's state to disk, in the order the core asked, off the event loop; each is
        answered once synced (a failure stops the member: its promises are not on disk)."""
        assert self._quorum is not None
        store = self._quorum
        async for a in recv:
            try:
                await _in_thread(store.persist, a)
            except (RaftStoreError, OSError) as exc:
                self._feed(RaftPersisted(a.token, str(exc)))
                return
            self._feed(RaftPersisted(a.token))

    async def _persist_epochs(self, ceiling: int) -> None:
        """The map epochs' ceiling to disk, off the event loop (a failure stops the member)."""
        assert self._epochs is not None
        try:
            await _in_thread(self._epochs.write, ceiling)
        except EpochStoreError as exc:
            self._feed(EpochsPersisted(ceiling, str(exc)))
            return
        self._feed(EpochsPersisted(ceiling))

    async def _read_snapshot(self) -> None:
        path = self._snapshot_path()

        def read() -> SnapshotRead:
            try:
                with open(path, "rb") as f:
                    return SnapshotRead(f.read(), "")
            except FileNotFoundError:
                return SnapshotRead(None, "missing")
            except OSError as exc:
                return SnapshotRead(None, f"{path}: {exc.strerror or exc}")

        self._feed(await _in_thread(read))

    async def _write_snapshot(self, token: int, chunks: Iterator[bytes]) -> None:
        """temp file -> fsync -> rename -> fsync of the directory, off the event loop.
        Chunks are taken from live state on the loop, a few at a time."""
        d = self.me.data_dir
        path = self._snapshot_path()
        tmp = path + ".tmp"
        error: str | None = None
        try:
            await _in_thread(lambda: os.makedirs(d, exist_ok=True))
            f = await _in_thread(open, tmp, "wb")
            try:
                while True:
                    part = b"".join(c for _, c in zip(range(_CHUNKS_PER_WRITE), chunks, strict=False))
                    if not part:
                        break
                    await _in_thread(f.write, part)
                await _in_thread(self._fsync_file, f)
            finally:
                f.close()
            await _in_thread(_replace_and_sync_dir, tmp, path, d)
        except OSError as exc:
            error = f"{tmp}: {exc.strerror or exc}"
        self._feed(PersistDone(token, error))


def _specific_ip(host: str) -> str | None:
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None  # a name (resolved by the OS): let the OS choose the source too
    return None if ip.is_unspecified else host


async def _in_thread(fn: Callable[..., T], *args: Any) -> T:
    """File I/O in a worker thread that a cancel abandons: a disk that hangs
    must not hold the member past ``stop_timeout`` (the write is then lost,
    and the previous snapshot stays, as after a crash)."""
    return await trio.to_thread.run_sync(fn, *args, abandon_on_cancel=True)


def _fsync_file(f: Any) -> None:
    f.flush()
    os.fsync(f.fileno())


def _replace_and_sync_dir(tmp: str, path: str, d: str) -> None:
    os.replace(tmp, path)
    sync_dir(d)


def _why(exc: BaseException) -> str:
    if isinstance(exc, trio.TooSlowError):
        return "timeout"
    text = str(exc) or exc.__class__.__name__
    return text[:200]
