"""Peer link codec: length-prefixed msgpack frames and the authenticated handshake.

A frame is a 4-byte big-endian length and a msgpack array ``[type, ...]``.
The handshake proves both sides know the cluster secret without sending it
(HMAC-SHA256 over both fresh nonces and both ids, with a different label per
direction so a reply cannot be reflected):

    dialer   -> HELLO     [1, "roost-peer/2", dialer_id, nonce_d]
    listener -> CHALLENGE [2, listener_id, nonce_l, mac("L", nonce_d, nonce_l, listener_id, dialer_id)]
    dialer   -> AUTH      [3, mac("D", nonce_l, nonce_d, dialer_id, listener_id)]

Everything arriving here is untrusted until AUTH checked out; decoders raise
PeerProtocolError, and the shell closes the link and logs, changing no state.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import struct
from enum import IntEnum
from typing import Any

import msgpack

from roost.client import wire
from roost.client.wire import WireError

# 6: ROSTER, JOIN, LEAVE, synced roster in HEARTBEAT; 5: FWDACK lists refusals;
# 4: partitioned mode (FORWARD, RELAY, map epoch); 3: BEAT
PROTOCOL = "roost-peer/6"
NONCE_LEN = 16
HANDSHAKE_MAX_FRAME = 512  # until a peer has authenticated, no bigger frame is read
_LEN = struct.Struct(">I")


class PeerType(IntEnum):
    HELLO = 1
    CHALLENGE = 2
    AUTH = 3
    REFUSED = 4  # [reason]: the answer to a HELLO of another [cluster] shape (unauthenticated)
    PUSH = 10  # [seq, entries]: changes to merge; answered by PUSHACK
    PUSHACK = 11  # [seq]
    PULL = 12  # [] or [partitions]: send me everything, or these partitions (answered by DUMP..., DUMPEND)
    DUMP = 13  # [entries]
    DUMPEND = 14  # [subscriptions sent]
    DIGEST = 15  # [bucket digests]: answered by DIFF..., DIFFEND
    DIFF = 16  # [entries of buckets that differ]
    DIFFEND = 17  # [buckets that differ]
    HEARTBEAT = 18  # [state, subscriptions, clients, map epoch, synced roster digest, committed roster digest]
    BEAT = 19  # []: the answer to a HEARTBEAT, on the dialler's link (its liveness)
    FORWARD = 20  # [id, msgs]: messages for partitions the receiver is primary of; id 0: fire, no answer
    FWDACK = 21  # [id, refused]: indexes of the frame's messages the receiver does not own
    RELAY = 22  # [[host, port, datagram], ...]: send these to our text clients (fire, no answer)
    ROSTER = 23  # [entries]: the roster (cluster/roster.py), on link up and on every change
    JOIN = 24  # [id, [host, port], [peer host, peer port]]: admin only; answered by ADMIN_REPLY
    LEAVE = 25  # [id]: admin only; answered by ADMIN_REPLY
    ADMIN_REPLY = 26  # [ok, message, roster entries]
    LOGFETCH = 27  # [partition, epoch, end, last epoch]: durable log replication (cluster/partitionlog.py)
    LOGDATA = 28  # [partition, epoch, status, start, end, last epoch, commit, truncate, reset, [[offset, ms, body]]]
    RAFT = 29  # [message...]: the metadata quorum's Raft messages (cluster/quorum.py), one way, on the sender's link
    CONTROL = 30  # [kind, partition, epoch, version, isr, at least]: a partition leader's request to the controller


#: The id ``roost cluster join/leave`` authenticates as (no member id may contain "@").
ADMIN = "@admin"


class PeerProtocolError(Exception):
    """The other side broke the peer protocol; the link must be closed."""


class ShapeMismatch(PeerProtocolError):
    """The peer runs another mode, partition count or replica count: one of the two
    members has the wrong config (cluster/member.py: the one not yet ready stops)."""


class PeerClosed(ConnectionError):
    """The other side closed the connection (an OSError: a normal way to go)."""


def encode(frame: list[Any]) -> bytes:
    body: bytes = msgpack.packb(frame, use_bin_type=True)
    return _LEN.pack(len(body)) + body


class FrameDecoder:
    """Turns a TCP byte stream into frames; refuses oversized or garbage ones.

    Frames are taken one at a time (:meth:`next_frame_untrusted`) because the size limit
    changes mid-stream: until the handshake completes only small frames are
    accepted, and frames that arrived in the same segment as the last
    handshake frame must be judged by the limit in force when they are read.
    """

    def __init__(self, max_frame: int) -> None:
        self.max_frame = max_frame
        self._buf = bytearray()
        self._pos = 0

    def feed(self, data: bytes) -> None:
        if self._pos > 65536 and self._pos * 2 > len(self._buf):
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data

    def next_frame_untrusted(self) -> list[Any] | None:
        """The next complete frame, or None until more bytes arrive."""
        buf, pos = self._buf, self._pos
        if len(buf) - pos < 4:
            return None
        (n,) = _LEN.unpack_from(buf, pos)
        if n > self.max_frame:
            raise PeerProtocolError(f"frame of {n} bytes exceeds max_frame ({self.max_frame})")
        if len(buf) - pos - 4 < n:
            return None
        body = bytes(buf[pos + 4 : pos + 4 + n])
        self._pos = pos + 4 + n
        if self._pos == len(buf):
            buf.clear()
            self._pos = 0
        try:
            frame = msgpack.unpackb(
                body, raw=False, strict_map_key=True, max_ext_len=0,
                max_array_len=n, max_map_len=n // 2, max_str_len=n, max_bin_len=n,
            )  # fmt: skip
        except Exception as exc:  # any msgpack failure means garbage
            raise PeerProtocolError(f"undecodable frame: {exc.__class__.__name__}") from None
        if frame.__class__ is not list or not frame or frame[0].__class__ is not int:
            raise PeerProtocolError("a frame is [type, ...]")
        return frame  # type: ignore[no-any-return]


def mac(secret: bytes, label: bytes, n1: bytes, n2: bytes, id1: str, id2: str) -> bytes:
    msg = label + b"|" + n1 + n2 + id1.encode() + b"|" + id2.encode()
    return hmac.new(secret, msg, hashlib.sha256).digest()


def _check_shape(theirs: Any, ours: str) -> None:
    """Both ends must run the same mode, partition count and replicas (a cluster
    whose members disagree would compute different maps, for ever)."""
    if theirs != ours:
        raise ShapeMismatch(f"peer runs {str(theirs)[:64]!r}, this member {ours!r}: "
                                "[cluster] mode, partitions and replicas must be the same on every member")  # fmt: skip


def check_hello_untrusted(f: list[Any], members: set[str], me: str, shape: str) -> tuple[str, bytes]:
    if len(f) != 5 or f[0] != PeerType.HELLO or f[1] != PROTOCOL:
        raise PeerProtocolError("expected HELLO " + PROTOCOL)
    _, _protocol, peer, nonce, their_shape = f
    _check_shape(their_shape, shape)
    if not isinstance(peer, str) or (peer not in members and peer != ADMIN) or peer == me:
        raise PeerProtocolError(f"unknown peer id {str(peer)[:64]!r}")
    if not isinstance(nonce, bytes) or len(nonce) != NONCE_LEN:
        raise PeerProtocolError("bad nonce")
    return peer, nonce


def check_challenge_untrusted(f: list[Any], shape: str) -> tuple[str, bytes, bytes]:
    if len(f) == 2 and f[0] == PeerType.REFUSED and isinstance(f[1], str):
        raise ShapeMismatch(f"refused by the peer: {f[1][:300]}")
    if len(f) != 5 or f[0] != PeerType.CHALLENGE:
        raise PeerProtocolError("expected CHALLENGE")
    _, peer, nonce, m, their_shape = f
    _check_shape(their_shape, shape)
    if not (isinstance(peer, str) and isinstance(nonce, bytes) and isinstance(m, bytes)):
        raise PeerProtocolError("malformed CHALLENGE")
    return peer, nonce, m


def check_auth_untrusted(f: list[Any]) -> bytes:
    if len(f) != 2 or f[0] != PeerType.AUTH or not isinstance(f[1], bytes):
        raise PeerProtocolError("expected AUTH")
    return f[1]  # type: ignore[no-any-return]


def _u64(v: Any, what: str) -> int:
    if v.__class__ is not int or not 0 <= v < 2**64:
        raise PeerProtocolError(f"{what} must be an unsigned 64-bit integer")
    return v  # type: ignore[no-any-return]


def _seq(v: Any, what: str) -> int:
    """A sequence, offset, epoch or time: below 2**63, as the client frames' (``wire.SEQ_LIMIT``),
    so the counters and arithmetic a member does with them stay in msgpack's signed range."""
    if v.__class__ is not int or not 0 <= v < wire.SEQ_LIMIT:
        raise PeerProtocolError(f"{what} must be an integer in 0..2**63-1")
    return v  # type: ignore[no-any-return]


def check_entries_untrusted(entries: Any) -> list[tuple[Any, ...]]:
    """Validate replication entries ``[who, cver, host, port, home, [[t, k, v]...], session]``.

    ``who`` becomes bytes (binary client id) or a (host, port) tuple (text
    subscriber), the form BrokerCore.merge expects. Every error names the
    field it found broken.
    """
    if entries.__class__ is not list:
        raise PeerProtocolError("entries must be an array")
    out = []
    check_filter, check_key = wire.check_filter, wire.check_key
    try:
        for e in entries:
            if e.__class__ is not list or len(e) != 7:
                raise PeerProtocolError("an entry is [who, cver, host, port, home, subs, session]")
            who, cver, host, port, home, subs, session = e
            if who.__class__ is list and len(who) == 2:
                who = (_ip(who[0], "who host"), _port(who[1], "who port"))
            elif who.__class__ is not bytes or len(who) != wire.ID_LEN:
                raise PeerProtocolError("who must be a client id or [host, port]")
            _u64(cver, "cver")
            _ip(host, "host")
            _port(port, "port")
            # Any member id will do, also one this member's config does not list
            # yet: members are added one at a time.
            if not isinstance(home, str) or not 0 < len(home) <= 64:
                raise PeerProtocolError("home must be a member id")
            if subs.__class__ is not list:
                raise PeerProtocolError("subs must be an array")
            for s in subs:
                if s.__class__ is not list or len(s) != 3:
                    raise PeerProtocolError("a subscription is [topic, key, version]")
                check_filter(s[0])
                if s[1] is not None:
                    check_key(s[1])
                _u64(s[2], "subscription version")
            # (a session at or past 2**63, which an earlier build took from a client, is
            # read as the greatest one: a snapshot or peer that holds one stays readable)
            session = min(_u64(session, "session"), wire.SEQ_LIMIT - 1)
            out.append((who, cver, host, port, home, subs, session))
    except WireError as exc:
        raise PeerProtocolError(f"bad subscription: {exc.text}") from None
    return out


_known_ips: dict[str, None] = {}


def _ip(host: Any, what: str) -> str:
    """An IP address literal (memoised): never a name to resolve, never garbage."""
    if host.__class__ is str and host in _known_ips:
        return host  # type: ignore[no-any-return]
    try:
        ipaddress.ip_address(host)
    except (ValueError, TypeError):
        raise PeerProtocolError(f"{what} must be an IP address literal") from None
    if len(_known_ips) > 100_000:
        _known_ips.clear()
    _known_ips[host] = None
    return host  # type: ignore[no-any-return]


def _port(port: Any, what: str) -> int:
    if port.__class__ is not int or not 0 < port <= 65535:
        raise PeerProtocolError(f"{what} must be a port number 1..65535")
    return port  # type: ignore[no-any-return]


def check_forwarded_untrusted(msgs: Any) -> list[list[Any]]:
    """Validate FORWARD messages ``[topic, key, tags, payload, producer id, sequence]``."""
    if msgs.__class__ is not list:
        raise PeerProtocolError("forwarded messages must be an array")
    try:
        for m in msgs:
            if m.__class__ is not list or len(m) != 6:
                raise PeerProtocolError("a forwarded message is [topic, key, tags, payload, pid, seq]")
            wire.check_topic(m[0])
            wire.check_key(m[1])
            wire.check_tags(m[2])
            if m[3].__class__ is not bytes:
                raise PeerProtocolError("a forwarded payload must be bytes")
            if m[4] is None:
                if m[5] is not None:
                    raise PeerProtocolError("a fire message has no sequence")
            elif (
                m[4].__class__ is not bytes
                or len(m[4]) != wire.ID_LEN
                or m[5].__class__ is not int
                or not 0 < m[5] < wire.SEQ_LIMIT
            ):  # fmt: skip  (as the client's PUB allows)
                raise PeerProtocolError("a reliable message has a producer id and a sequence")
    except WireError as exc:
        raise PeerProtocolError(f"bad forwarded message: {exc.text}") from None
    return msgs  # type: ignore[no-any-return]


def check_relay_untrusted(sends: Any) -> list[tuple[tuple[str, int], bytes]]:
    """Validate RELAY datagrams ``[[host, port, datagram], ...]``."""
    if sends.__class__ is not list:
        raise PeerProtocolError("relayed datagrams must be an array")
    out = []
    for s in sends:
        if s.__class__ is not list or len(s) != 3 or s[2].__class__ is not bytes:
            raise PeerProtocolError("a relayed datagram is [host, port, bytes]")
        out.append(((_ip(s[0], "relay host"), _port(s[1], "relay port")), s[2]))
    return out


def check_logfetch_untrusted(f: list[Any], partitions: int) -> tuple[int, int, int, int]:
    """Validate LOGFETCH ``[type, partition, epoch, end, last epoch]``."""
    if len(f) != 5:
        raise PeerProtocolError("malformed LOGFETCH")
    _, p, epoch, end, last_epoch = f
    if p.__class__ is not int or not 0 <= p < partitions:
        raise PeerProtocolError("malformed LOGFETCH")
    return p, _seq(epoch, "an epoch"), _seq(end, "an offset"), _seq(last_epoch, "an epoch")


def check_logdata_untrusted(f: list[Any], partitions: int) -> tuple[Any, ...]:
    """Validate LOGDATA ``[type, partition, epoch, status, start, end, last epoch, commit,
    truncate, reset, records, asked]``; records ``[offset, time ms, body]`` with consecutive offsets;
    ``asked``: the end the FETCH answered came from. (The bodies are checked where they are taken:
    cluster/partitionlog.py.)"""
    if len(f) != 12:
        raise PeerProtocolError("malformed LOGDATA")
    _, p, epoch, status, start, end, last_epoch, commit, truncate, reset, records, asked = f
    if p.__class__ is not int or not 0 <= p < partitions or records.__class__ is not list:
        raise PeerProtocolError("malformed LOGDATA")
    _seq(asked, "a LOGDATA field")
    head = [_seq(v, "a LOGDATA field") for v in (epoch, status, start, end, last_epoch, commit)]
    cuts = [v for v in (truncate, reset) if v.__class__ is not int or not -1 <= v < wire.SEQ_LIMIT]
    if cuts:
        raise PeerProtocolError("LOGDATA truncate and reset are offsets or -1")
    expect = None
    for r in records:
        if r.__class__ is not list or len(r) != 3 or r[2].__class__ is not bytes:
            raise PeerProtocolError("a LOGDATA record is [offset, time ms, body]")
        o = _seq(r[0], "an offset")
        _seq(r[1], "a record time")
        if expect is not None and o != expect:
            raise PeerProtocolError("LOGDATA records must have consecutive offsets")
        expect = o + 1
    return (p, *head, truncate, reset, records, asked)


def check_partitions_untrusted(parts: Any, partitions: int) -> set[int]:
    if parts.__class__ is not list or any(p.__class__ is not int or not 0 <= p < partitions for p in parts):
        raise PeerProtocolError(f"partitions must be an array of integers 0..{partitions - 1}")
    return set(parts)


def check_digest_untrusted(d: Any, buckets: int) -> list[int]:
    if d.__class__ is not list or len(d) != buckets:
        raise PeerProtocolError(f"a digest has {buckets} buckets")
    return [_u64(x, "a digest bucket") for x in d]
