"""One member of a replicated cluster: the trio shell around BrokerCore,
peer links, the initial PULL, anti-entropy, failure detection and snapshots.

Start-up (FASTPUSS: "pick one of the other nodes randomly and ask for a
massive data transfer in pull fashion"):
  1. listen for peers; dial every peer (outbound links carry our PUSHes,
     HEARTBEATs and DIGESTs; the peer answers on the same connection);
  2. state ``syncing``: PULL a full dump from a random live peer, merge it;
     with no live peer, load our own snapshot from the data dir, or nothing;
  3. state ``ready``: bind the client UDP port and serve.

Anything a peer sends is checked (peerwire) before it touches state; a peer
that fails the handshake or breaks the protocol is logged and disconnected.
"""

from __future__ import annotations

import contextlib
import gc
import hmac
import os
import random
import time
from typing import Any

import msgpack
import trio

from client.wire import encode_status_reply
from cluster.config import ClusterConfig, Member
from cluster.membership import Membership
from cluster.peerwire import (
    HANDSHAKE_MAX_FRAME,
    NONCE_LEN,
    PROTOCOL,
    FrameDecoder,
    P,
    PeerClosed,
    PeerProtocolError,
    check_auth,
    check_challenge,
    check_digest,
    check_entries,
    check_hello,
    encode,
    mac,
)  # fmt: skip
from cluster.replication import PeerQueue
from node.core import DIGEST_BUCKETS, BrokerCore, Log, Replicate, StatusQuery
from node.logs import EventLog
from node.server import NodeServer

SNAPSHOT = "state.msgpack"
SNAPSHOT_FORMAT = 2  # header [2, member, unix time], then msgpack arrays of entries
# What a failing peer link can raise; each ends that link, never the member.
LINK_ERRORS = (OSError, PeerProtocolError, trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError)


class PeerLink:
    """An authenticated TCP connection to a peer, with frame decoding."""

    def __init__(self, stream: trio.SocketStream, peer: str, max_frame: int) -> None:
        self.stream = stream
        self.peer = peer
        self.decoder = FrameDecoder(max_frame)
        self._frames: list[list[Any]] = []

    async def send(self, frame: list[Any]) -> None:
        await self.stream.send_all(encode(frame))

    async def receive(self) -> list[Any]:
        while not self._frames:
            data = await self.stream.receive_some(256 * 1024)
            if not data:
                raise PeerClosed("connection closed")
            self._frames = self.decoder.feed(data)
        return self._frames.pop(0)


class ClusterNode:
    def __init__(
        self,
        cc: ClusterConfig,
        member_id: str,
        bind_host: str | None = None,
        peer_hosts: dict[str, str] | None = None,
        log: EventLog | None = None,
    ) -> None:
        self.cc = cc
        self.s = cc.settings
        self.me: Member = cc.member(member_id)
        self.cfg = cc.node_config(member_id, bind_host)
        self.bind_host = bind_host
        self.log = log or EventLog(member_id, self.cfg.log_level)
        self.secret = self.s.secret.encode()
        self.peers = [m for m in cc.members if m.id != member_id]
        hosts = peer_hosts or {}
        self.peer_addr = {m.id: (hosts.get(m.id, m.peer_addr[0]), m.peer_addr[1]) for m in self.peers}
        self.member_ids = {m.id for m in cc.members}
        self.state = "syncing"
        self.queues = {m.id: PeerQueue(self.s.max_peer_queue, self.s.chunk_subscriptions) for m in self.peers}
        self._wake = {m.id: trio.Event() for m in self.peers}
        self.links_up: set[str] = set()
        self.core: BrokerCore | None = None
        self.server: NodeServer | None = None
        self.addr: tuple[str, int] | None = None
        self._expired: set[str] = set()
        self._changes_since_snapshot = 0
        self.pulled_from: str | None = None

    # ------------------------------------------------------------ lifecycle

    async def run(self, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        now = trio.current_time()
        self.membership = Membership([m.id for m in self.peers], self.s.suspect_after, self.s.down_after, now)
        self.core = core = BrokerCore(
            self.cfg, self.secret, random.Random(), int(time.time() * 1000),
            members=[[m.id, *m.client_addr] for m in self.cc.members],
            node_idx=self.cc.index_of(self.me.id), wall_offset=time.time() - now, replicating=True,
            tombstone_horizon=self.s.tombstone_horizon,
        )  # fmt: skip
        host = self.bind_host or self.me.peer_addr[0]
        listeners = await trio.open_tcp_listeners(self.me.peer_addr[1], host=host)
        self.log("info", "node_starting", state="syncing", peer_addr=f"{host}:{self.me.peer_addr[1]}",
                 members=len(self.cc.members))  # fmt: skip
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(trio.serve_listeners, self._inbound, listeners)
                for m in self.peers:
                    nursery.start_soon(self._outbound, m.id)
                nursery.start_soon(self._housekeeping)
                await self._initial_sync()
                self.server = NodeServer(self.cfg, self.log, core=core)
                self.server.on_action = self._on_action
                self.addr = await nursery.start(self.server.run)
                self.state = "ready"
                self.log("info", "node_ready", subscriptions=core.index.count, pulled_from=self.pulled_from)
                task_status.started(self.addr)
        finally:
            self._write_snapshot()

    def status(self) -> dict[str, Any]:
        assert self.core is not None
        members = []
        for m in self.cc.members:
            if m.id == self.me.id:
                members.append({"id": m.id, "state": self.state, "subscriptions": self.core.index.count,
                                "clients": self.core.status()["clients"], "queue": 0,
                                "client_addr": f"{m.client_addr[0]}:{m.client_addr[1]}"})  # fmt: skip
                continue
            v = self.membership.peers[m.id]
            members.append({"id": m.id, "state": v.state, "subscriptions": v.subscriptions,
                            "clients": v.clients, "queue": len(self.queues[m.id]),
                            "link": m.id in self.links_up,
                            "client_addr": f"{m.client_addr[0]}:{m.client_addr[1]}"})  # fmt: skip
        return {"state": self.state, "mode": self.s.mode, "members": members}

    # ------------------------------------------------------------ start-up

    async def _initial_sync(self) -> None:
        assert self.core is not None
        order = [m.id for m in self.peers]
        random.shuffle(order)
        with _no_gc():  # a million new long-lived objects: rescanning them is wasted time
            for peer in order:
                t0 = time.monotonic()
                try:
                    with trio.fail_after(self.s.pull_timeout):
                        n = await self._pull(peer)
                except LINK_ERRORS as exc:
                    self.log("info", "pull_failed", peer=peer, reason=_why(exc))
                    continue
                self.pulled_from = peer
                self.log("info", "pulled", peer=peer, subscriptions=n, seconds=round(time.monotonic() - t0, 3))
                # Our own snapshot may hold writes the peer never got (we died
                # before pushing them); merging it is safe, newer versions win.
                self._load_snapshot()
                return
            self._load_snapshot()

    async def _pull(self, peer: str) -> int:
        """PULL a full dump from ``peer`` and merge it; returns subscriptions received."""
        assert self.core is not None
        link = await self._dial(peer)
        try:
            await link.send([P.PULL])
            n = 0
            while True:
                f = await link.receive()
                if f[0] == P.DUMP and len(f) == 2:
                    entries = check_entries(f[1])
                    self._perform(self.core.merge(entries, trio.current_time()))
                    n += sum(len(e[5]) for e in entries)
                elif f[0] == P.DUMPEND and len(f) == 2:
                    if f[1] == -1:
                        raise PeerProtocolError("peer is not ready itself")
                    return n
                else:
                    raise PeerProtocolError(f"unexpected frame {f[0]} during PULL")
        finally:
            await link.stream.aclose()

    # ------------------------------------------------------------ peer links

    async def _dial(self, peer: str) -> PeerLink:
        host, port = self.peer_addr[peer]
        with trio.fail_after(self.s.handshake_timeout):
            stream = await trio.open_tcp_stream(host, port)
            link = PeerLink(stream, peer, HANDSHAKE_MAX_FRAME)
            try:
                nonce = os.urandom(NONCE_LEN)
                await link.send([P.HELLO, PROTOCOL, self.me.id, nonce])
                pid, their_nonce, their_mac = check_challenge(await link.receive())
                want = mac(self.secret, b"L", nonce, their_nonce, peer, self.me.id)
                if pid != peer or not _same(their_mac, want):
                    raise PeerProtocolError("peer failed authentication (wrong cluster secret?)")
                await link.send([P.AUTH, mac(self.secret, b"D", their_nonce, nonce, self.me.id, peer)])
            except BaseException:
                with trio.CancelScope(shield=True):
                    await stream.aclose()
                raise
        link.decoder.max_frame = self.s.max_frame  # authenticated: full-size frames
        return link

    async def _inbound(self, stream: trio.SocketStream) -> None:
        """A peer dialled us: authenticate it, then serve its requests."""
        try:
            remote = stream.socket.getpeername()
        except OSError:
            remote = ("?", 0)
        peer = None
        link = PeerLink(stream, "?", HANDSHAKE_MAX_FRAME)
        try:
            with trio.fail_after(self.s.handshake_timeout):
                peer, nonce = check_hello(await link.receive(), self.member_ids, self.me.id)
                mine = os.urandom(NONCE_LEN)
                await link.send([P.CHALLENGE, self.me.id, mine,
                                 mac(self.secret, b"L", nonce, mine, self.me.id, peer)])  # fmt: skip
                got = check_auth(await link.receive())
                if not _same(got, mac(self.secret, b"D", mine, nonce, peer, self.me.id)):
                    raise PeerProtocolError("wrong cluster secret")
            link.peer = peer
            link.decoder.max_frame = self.s.max_frame
            await self._serve_peer(link)
        except (PeerProtocolError, trio.TooSlowError) as exc:
            self.log("warning", "peer_refused", peer=peer, remote=f"{remote[0]}:{remote[1]}", reason=_why(exc))
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the peer went away; its outbound side reconnects
        except Exception as exc:  # nothing a peer sends may stop this node
            self.log("error", "peer_error", peer=peer, remote=f"{remote[0]}:{remote[1]}", reason=repr(exc)[:200])
        finally:
            with trio.CancelScope(shield=True):
                await stream.aclose()

    async def _serve_peer(self, link: PeerLink) -> None:
        core = self.core
        assert core is not None
        idle = max(5 * self.s.down_after, 5.0)  # a dialer sends a heartbeat at least this often
        while True:
            with trio.fail_after(idle):
                f = await link.receive()
            kind = f[0]
            if kind == P.PUSH and len(f) == 3:
                entries = check_entries(f[2])
                self._changes_since_snapshot += 1
                self._perform(core.merge(entries, trio.current_time()))
                await link.send([P.PUSHACK, f[1]])
            elif kind == P.HEARTBEAT and len(f) == 4:
                state, subs, clients = f[1], f[2], f[3]
                if state not in ("syncing", "ready") or subs.__class__ is not int or clients.__class__ is not int:
                    raise PeerProtocolError("malformed HEARTBEAT")
                ch = self.membership.heard(link.peer, trio.current_time(), state, subs, clients)
                if ch:
                    self.log("info", "peer_state", peer=link.peer, old=ch[0], new=ch[1])
                    self._expired.discard(link.peer)
            elif kind == P.PULL and len(f) == 1:
                if self.state != "ready":
                    await link.send([P.DUMPEND, -1])  # "not ready": pull from someone else
                    continue
                with _no_gc():
                    n = await self._send_dump(link, P.DUMP, core.dump())
                await link.send([P.DUMPEND, n])
                self.log("info", "served_pull", peer=link.peer, subscriptions=n)
            elif kind == P.DIGEST and len(f) == 2:
                theirs = check_digest(f[1], DIGEST_BUCKETS)
                differ = [i for i, d in enumerate(core.digest) if d != theirs[i]]
                if differ:
                    await self._send_dump(link, P.DIFF, core.dump(set(differ)))
                await link.send([P.DIFFEND, differ])
            else:
                raise PeerProtocolError(f"unexpected frame type {kind}")

    async def _send_dump(self, link: PeerLink, kind: P, entries: Any) -> int:
        """Stream entries in frames of about chunk_subscriptions subscriptions."""
        batch: list[Any] = []
        n = total = 0
        for e in entries:
            batch.append(e)
            n += len(e[5]) or 1
            if n >= self.s.chunk_subscriptions:
                await link.send([kind, batch])
                total += n
                batch, n = [], 0
        if batch:
            await link.send([kind, batch])
            total += n
        return total

    async def _outbound(self, peer: str) -> None:
        """Our link to ``peer``: heartbeats, pushes and digests, forever."""
        q = self.queues[peer]
        was_up: bool | None = None
        while True:
            try:
                link = await self._dial(peer)
            except LINK_ERRORS as exc:
                if was_up is not False:
                    self.log("info", "link_down", peer=peer, reason=_why(exc))
                was_up = False
                await trio.sleep(self.s.reconnect_interval)
                continue
            self.log("info", "link_up", peer=peer)
            was_up = True
            self.links_up.add(peer)
            reasons: list[str] = []
            try:
                async with trio.open_nursery() as nursery:
                    for half in (self._outbound_receive, self._outbound_send):
                        nursery.start_soon(self._link_half, half, link, q, nursery, reasons)
            finally:
                self.links_up.discard(peer)
                q.disconnected()
                with trio.CancelScope(shield=True):
                    await link.stream.aclose()
            self.log("info", "link_down", peer=peer, reason=reasons[0] if reasons else "closed")
            was_up = False
            await trio.sleep(self.s.reconnect_interval)

    async def _link_half(
        self, half: Any, link: PeerLink, q: PeerQueue, nursery: trio.Nursery, reasons: list[str]
    ) -> None:
        """Run one direction of a link; any failure ends both directions."""
        try:
            await half(link, q)
        except (OSError, PeerProtocolError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            reasons.append(_why(exc))
        except Exception as exc:  # nothing a peer sends may stop this node
            self.log("error", "peer_error", peer=link.peer, reason=repr(exc)[:200])
            reasons.append("error")
        nursery.cancel_scope.cancel()

    async def _outbound_send(self, link: PeerLink, q: PeerQueue) -> None:
        core = self.core
        assert core is not None
        next_digest = trio.current_time() + (0 if q.overflowed else self.s.anti_entropy_interval)
        while True:
            await link.send([P.HEARTBEAT, self.state, core.index.count, core.status()["clients"]])
            while (push := q.next_push()) is not None:
                await link.send([P.PUSH, push[0], push[1]])
            peer_ready = self.membership.peers[link.peer].state == "ready"
            if trio.current_time() >= next_digest and self.state == "ready" and peer_ready:
                await link.send([P.DIGEST, list(core.digest)])
                next_digest = trio.current_time() + self.s.anti_entropy_interval
            wake = self._wake[link.peer]
            with trio.move_on_after(self.s.heartbeat_interval):
                await wake.wait()
            if wake.is_set():
                self._wake[link.peer] = trio.Event()

    async def _outbound_receive(self, link: PeerLink, q: PeerQueue) -> None:
        core = self.core
        assert core is not None
        while True:
            f = await link.receive()
            kind = f[0]
            if kind == P.PUSHACK and len(f) == 2:
                q.acked(f[1])
                self._wake[link.peer].set()
            elif kind == P.DIFF and len(f) == 2:
                self._changes_since_snapshot += 1
                self._perform(core.merge(check_entries(f[1]), trio.current_time()))
            elif kind == P.DIFFEND and len(f) == 2:
                buckets = f[1]
                if buckets.__class__ is not list or not all(b.__class__ is int for b in buckets):
                    raise PeerProtocolError("malformed DIFFEND")
                if buckets:
                    # They sent us their side of the differing buckets; send ours,
                    # in slices so that a large repair never stalls this member.
                    wanted = set(buckets)
                    for i, e in enumerate(core.dump(wanted)):
                        q.add([e])
                        if i % 500 == 499:
                            await trio.sleep(0)
                    self.log("info", "anti_entropy", peer=link.peer, buckets=len(buckets))
                    self._wake[link.peer].set()
                q.repaired()
            else:
                raise PeerProtocolError(f"unexpected frame type {kind} on outbound link")

    def _on_action(self, a: Any) -> list[tuple[Any, bytes]]:
        if isinstance(a, Replicate):
            self._distribute(a.entries)
        elif isinstance(a, StatusQuery):
            status = {**a.status, **self.status()}
            return [(a.addr, encode_status_reply(status))]
        elif isinstance(a, Log):
            self.log(a.level, a.event, **a.fields)
        return []

    def _perform(self, actions: list[Any]) -> None:
        for a in actions:
            self._on_action(a)

    def _distribute(self, entries: list[Any]) -> None:
        """Queue this node's new changes for every peer."""
        self._changes_since_snapshot += len(entries)
        for peer, q in self.queues.items():
            q.add(entries)
            self._wake[peer].set()

    # ------------------------------------------------------------ housekeeping

    async def _housekeeping(self) -> None:
        core = self.core
        assert core is not None
        next_gc = trio.current_time() + self.s.tombstone_horizon / 10
        next_snapshot = trio.current_time() + self.s.snapshot_interval
        while True:
            await trio.sleep(self.s.heartbeat_interval)
            now = trio.current_time()
            for peer, old, new in self.membership.tick(now):
                self.log("warning" if new == "down" else "info", "peer_state", peer=peer, old=old, new=new)
            if self.state == "ready":
                self._expire_lost_homes(now)
            if now >= next_gc:
                self._perform(core.collect_tombstones(now))
                next_gc = now + self.s.tombstone_horizon / 10
            if now >= next_snapshot:
                if self._changes_since_snapshot and self.state == "ready":
                    await self._write_snapshot_async()
                next_snapshot = now + self.s.snapshot_interval
                # Subscription state lives long and holds no reference cycles:
                # move it out of the collector's sight so that full collections
                # stay short however many subscriptions a node holds.
                gc.freeze()

    def _expire_lost_homes(self, now: float) -> None:
        """A member down for longer than subscriber_timeout takes its clients'
        subscriptions with it; one surviving member (the lowest ready id)
        writes the tombstones, which replicate like any change."""
        assert self.core is not None
        ready = [self.me.id] + [p for p, v in self.membership.peers.items() if v.state == "ready"]
        if min(ready) != self.me.id:
            return
        for peer in self.membership.peers:
            if peer in self._expired:
                continue
            if self.membership.down_for(peer, now) > self.cfg.subscriber_timeout:
                self._expired.add(peer)
                self._perform(self.core.expire_home(peer, now))

    # ------------------------------------------------------------ snapshots

    def _snapshot_path(self) -> str:
        return os.path.join(self.me.data_dir, SNAPSHOT)

    def _snapshot_chunks(self) -> Any:
        """The snapshot as msgpack objects: a header, then chunks of entries."""
        assert self.core is not None
        yield msgpack.packb([SNAPSHOT_FORMAT, self.me.id, time.time()], use_bin_type=True)
        batch: list[Any] = []
        n = 0
        for e in self.core.dump():
            batch.append(e)
            n += len(e[5]) or 1
            if n >= self.s.chunk_subscriptions:
                yield msgpack.packb(batch, use_bin_type=True)
                batch, n = [], 0
        if batch:
            yield msgpack.packb(batch, use_bin_type=True)

    def _write_snapshot(self) -> None:
        """Synchronous snapshot (at shutdown, when nothing else runs)."""
        if self.core is None or self.state != "ready":
            return
        try:
            with self._snapshot_file() as f:
                for chunk in self._snapshot_chunks():
                    f.write(chunk)
        except OSError as exc:
            self.log("error", "snapshot_failed", reason=_why(exc))

    async def _write_snapshot_async(self) -> None:
        """Snapshot while serving: other tasks run between chunks (the state
        may change meanwhile; a union of versions is still a valid state)."""
        try:
            with self._snapshot_file() as f:
                for chunk in self._snapshot_chunks():
                    f.write(chunk)
                    await trio.sleep(0)
        except OSError as exc:
            self.log("error", "snapshot_failed", reason=_why(exc))

    @contextlib.contextmanager
    def _snapshot_file(self) -> Any:
        """temp file -> fsync -> rename -> fsync of the directory."""
        os.makedirs(self.me.data_dir, exist_ok=True)
        path = self._snapshot_path()
        tmp = path + ".tmp"
        changes = self._changes_since_snapshot
        with open(tmp, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dfd = os.open(self.me.data_dir, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        self._changes_since_snapshot -= changes

    def _load_snapshot(self) -> None:
        assert self.core is not None
        path = self._snapshot_path()
        if not os.path.exists(path):
            if self.pulled_from is None:
                self.log("info", "started_empty", reason="no live peer and no snapshot")
            return
        now = trio.current_time()
        try:
            with open(path, "rb") as f:
                unpacker = msgpack.Unpacker(f, raw=False, strict_map_key=True, max_buffer_size=1 << 30)
                header = next(unpacker)
                if not isinstance(header, list) or header[:1] != [SNAPSHOT_FORMAT]:
                    raise ValueError(f"not a snapshot of format {SNAPSHOT_FORMAT}")
                written = header[2]
                for chunk in unpacker:
                    self._perform(self.core.merge(check_entries(chunk), now))
        except (OSError, ValueError, TypeError, PeerProtocolError, StopIteration, msgpack.UnpackException) as exc:
            self.log("error", "snapshot_unreadable", path=path, reason=_why(exc))
            return
        self.log("info", "loaded_snapshot", path=path, subscriptions=self.core.index.count,
                 age_s=round(time.time() - written, 1))  # fmt: skip


class _no_gc:
    """Pause the cyclic collector during bulk loads; freeze what survived."""

    def __enter__(self) -> None:
        self.was = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc: object) -> None:
        if self.was:
            gc.enable()
        gc.freeze()


def _same(a: bytes, b: bytes) -> bool:
    return hmac.compare_digest(a, b)


def _why(exc: BaseException) -> str:
    if isinstance(exc, trio.TooSlowError):
        return "timeout"
    text = str(exc) or exc.__class__.__name__
    return text[:200]

