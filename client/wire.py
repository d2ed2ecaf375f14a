"""Binary wire codec shared by clients and nodes.

Every binary datagram is one msgpack array ``[VERSION, type, ...fields]``. Its
first byte is therefore 0x90-0x9f or 0xdc/0xdd, never an ASCII letter, which is
how a node tells it apart from the FASTPUSS text protocol on the same port.

Encoders are trusted (our own values); anything arriving from the network goes
through :func:`decode_untrusted_frame`, which either returns a fully validated
tuple or raises :class:`WireError` with a code the node can report. The codec
never lets a msgpack or type error escape, because a decoder exception must not
be able to crash a node.

docs/protocol.md describes every frame with a byte-level example.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from enum import IntEnum
from typing import Any

import msgpack

VERSION = 1

#: Bytes a MSGS/PUB frame needs around its messages (header, seq, counts).
FRAME_OVERHEAD = 64
#: Clients pad HELLO to this size so that a WELCOME (cookie plus cluster map)
#: stays within the 3x anti-amplification budget of an unvalidated address.
HELLO_PAD_TO = 256
COOKIE_LEN = 16
ID_LEN = 16
MAX_TOPIC_BYTES = 255
MAX_KEY_BYTES = 255
MAX_TAGS = 32
MAX_TAG_BYTES = 255


class T(IntEnum):
    """Frame types. Values are part of the wire format: never renumber."""

    HELLO = 1
    WELCOME = 2
    CMDS = 3
    CMDACK = 4
    PUB = 5
    PUBACK = 6
    MSGS = 7
    ACK = 8
    PING = 9
    PONG = 10
    CANCEL = 11
    REDIRECT = 12
    ERROR = 13
    STATUS = 14
    STATUS_REPLY = 15


class E(IntEnum):
    """Error codes carried by ERROR frames and text ``ERR`` replies."""

    OK = 0
    MALFORMED = 1
    UNSUPPORTED_VERSION = 2
    UNKNOWN_TYPE = 3
    TOO_LARGE = 4
    BAD_COOKIE = 5
    BAD_TOPIC = 6
    BAD_UTF8 = 7
    UNKNOWN_VERB = 8
    FORBIDDEN = 9
    OVERLOADED = 10
    BAD_KEY = 11
    BAD_MODE = 12
    BAD_TAGS = 13
    STALE_BATCH = 14


ERROR_NAMES = {e: e.name.lower() for e in E}


class Mode(IntEnum):
    """Delivery mode of a subscription (DESIGN.md, Delivery modes)."""

    FIRE = 0
    RELIABLE = 1


MODE_NAMES = {"fire": Mode.FIRE, "reliable": Mode.RELIABLE}


class Op(IntEnum):
    UNSUB = 0
    SUB = 1


class Reason:
    """Why a subscription ended; the strings are part of the protocol."""

    UNSUBSCRIBED = "unsubscribed"
    OUT_OF_CAPACITY = "out_of_capacity"
    NODE_LOST = "node_lost"
    TIMED_OUT = "timed_out"


class WireError(Exception):
    """A datagram that cannot be accepted; ``code`` goes into the ERROR reply."""

    def __init__(self, code: E, text: str) -> None:
        super().__init__(text)
        self.code = code
        self.text = text


# Java's \s: the six ASCII whitespace characters, nothing Unicode.
WHITESPACE = re.compile(r"[ \t\n\x0b\f\r]")

_packer = msgpack.Packer(use_bin_type=True)
pack: Callable[[Any], bytes] = _packer.pack
_array_header: Callable[[int], bytes] = _packer.pack_array_header


def pack_message(topic: str, key: str | None, tags: dict[str, str] | None, payload: bytes) -> bytes:
    """One message as it travels inside PUB and MSGS frames, packed once."""
    return pack([topic, key, tags, payload])


def pack_delivery(
    topic: str, key: str | None, tags: dict[str, str] | None, payload: bytes, pid: bytes, pseq: int
) -> bytes:
    """A reliable message as nodes deliver it: with its producer id and sequence,
    so a subscriber can drop the copy a producer resent to another node after
    failover (the first node may have delivered it before dying)."""
    return pack([topic, key, tags, payload, pid, pseq])


def _header(n: int, *fields: Any) -> bytes:
    """Array header for ``n`` elements followed by the given fields."""
    return _array_header(n) + b"".join(pack(f) for f in fields)


# ---------------------------------------------------------------- encoders


def encode_hello(client_id: bytes) -> bytes:
    body = _header(4, VERSION, T.HELLO, client_id)
    pad = max(0, HELLO_PAD_TO - len(body) - 2)  # bin8 header: 2 bytes
    return body + pack(b"\0" * pad)


def encode_welcome(
    node_id: str, cookie: bytes, params: dict[str, Any], members: list[list[Any]]
) -> bytes:
    return pack([VERSION, T.WELCOME, node_id, cookie, params, members])


def encode_cmds(
    client_id: bytes, cookie: bytes, session: int, batch: int, cmds: list[tuple[int, str, str | None, int]]
) -> bytes:
    return pack([VERSION, T.CMDS, client_id, cookie, session, batch, [list(c) for c in cmds]])


def encode_cmdack(session: int, batch: int, results: list[int]) -> bytes:
    return pack([VERSION, T.CMDACK, session, batch, results])


def encode_pub(
    client_id: bytes,
    cookie: bytes,
    producer_id: bytes,
    first_seq: int,
    floor: int,
    reliable: bool,
    packed_msgs: list[bytes],
) -> bytes:
    """PUB carries consecutive producer sequences first_seq.. for its messages.

    ``floor`` is the lowest sequence the producer still waits for: everything
    below it was acknowledged, so a node that never saw this producer (or
    forgot it) can start de-duplicating from there.
    """
    return (
        _header(9, VERSION, T.PUB, client_id, cookie, producer_id, first_seq, floor, reliable)
        + _array_header(len(packed_msgs))
        + b"".join(packed_msgs)
    )


def encode_puback(producer_id: bytes, acked_seq: int) -> bytes:
    return pack([VERSION, T.PUBACK, producer_id, acked_seq])


def encode_msgs(stream_id: int, first_seq: int, packed_msgs: list[bytes]) -> bytes:
    """Messages for one subscriber; reliable ones carry consecutive sequences.

    ``stream_id`` 0 means fire-and-forget (``first_seq`` is then 0 too).
    """
    return (
        _header(5, VERSION, T.MSGS, stream_id, first_seq)
        + _array_header(len(packed_msgs))
        + b"".join(packed_msgs)
    )


MSGS_HEADER_MAX = len(_header(5, VERSION, T.MSGS, 2**64 - 1, 2**64 - 1)) + 5


def encode_ack(
    client_id: bytes, cookie: bytes, stream_id: int, max_seq: int, sack: list[list[int]]
) -> bytes:
    return pack([VERSION, T.ACK, client_id, cookie, stream_id, max_seq, sack])


def encode_ping(client_id: bytes, cookie: bytes, token: int) -> bytes:
    return pack([VERSION, T.PING, client_id, cookie, token])


def encode_pong(token: int, known: bool, cookie: bytes, cancels: list[list[Any]]) -> bytes:
    return pack([VERSION, T.PONG, token, known, cookie, cancels])


def encode_cancel(topic: str, key: str | None, reason: str) -> bytes:
    return pack([VERSION, T.CANCEL, topic, key, reason])


def encode_redirect(node_id: str, host: str, port: int, reason: str) -> bytes:
    return pack([VERSION, T.REDIRECT, node_id, host, port, reason])


def encode_error(code: E, text: str) -> bytes:
    return pack([VERSION, T.ERROR, int(code), text])


def encode_status(client_id: bytes, cookie: bytes) -> bytes:
    return pack([VERSION, T.STATUS, client_id, cookie])


def encode_status_reply(status: dict[str, Any]) -> bytes:
    return pack([VERSION, T.STATUS_REPLY, status])


# ---------------------------------------------------------------- validation


_valid_topics: dict[str, None] = {}


def check_topic(topic: Any) -> str:
    """Topic rule: str, 1..255 UTF-8 bytes, no whitespace (memoised: hot path)."""
    if topic.__class__ is str and topic in _valid_topics:
        return topic  # type: ignore[no-any-return]
    if not isinstance(topic, str) or not topic:
        raise WireError(E.BAD_TOPIC, "topic must be a non-empty string")
    if len(topic) > 63 and len(topic.encode()) > MAX_TOPIC_BYTES:
        raise WireError(E.BAD_TOPIC, f"topic longer than {MAX_TOPIC_BYTES} bytes")
    if WHITESPACE.search(topic):
        raise WireError(E.BAD_TOPIC, "topic contains whitespace")
    if len(_valid_topics) >= 65536:
        _valid_topics.clear()
    _valid_topics[topic] = None
    return topic


def check_key(key: Any) -> str | None:
    if key is None:
        return None
    if not isinstance(key, str) or not key or len(key.encode()) > MAX_KEY_BYTES:
        raise WireError(E.BAD_KEY, f"key must be null or a string of 1..{MAX_KEY_BYTES} bytes")
    return key


def check_tags(tags: Any) -> dict[str, str] | None:
    if tags is None:
        return None
    if not isinstance(tags, dict) or len(tags) > MAX_TAGS:
        raise WireError(E.BAD_TAGS, f"tags must be null or a map of at most {MAX_TAGS} entries")
    for k, v in tags.items():
        if not (isinstance(k, str) and isinstance(v, str)):
            raise WireError(E.BAD_TAGS, "tag names and values must be strings")
        if len(k) > MAX_TAG_BYTES or len(v) > MAX_TAG_BYTES:
            raise WireError(E.BAD_TAGS, f"tag names and values are at most {MAX_TAG_BYTES} chars")
    return tags


def check_message(m: Any) -> tuple[Any, ...]:
    """A message is [topic, key, tags, payload], plus [producer id, seq] when
    delivered reliably; returns it as a tuple."""
    if m.__class__ is not list or (len(m) != 4 and len(m) != 6):
        raise WireError(E.MALFORMED, "a message is [topic, key, tags, payload(, producer, seq)]")
    if len(m) == 6:
        _bytes(m[4], ID_LEN, "producer id")
        _uint(m[5], "producer seq")
    topic, key, tags, payload = m[0], m[1], m[2], m[3]
    check_topic(topic)
    if key is not None:
        check_key(key)
    if tags is not None:
        check_tags(tags)
    if payload.__class__ is not bytes:
        raise WireError(E.MALFORMED, "payload must be bytes")
    return tuple(m)


def _bytes(v: Any, n: int, what: str) -> bytes:
    if not isinstance(v, bytes) or len(v) != n:
        raise WireError(E.MALFORMED, f"{what} must be {n} bytes")
    return v


def _uint(v: Any, what: str) -> int:
    if v.__class__ is not int or v < 0 or v >= 2**64:
        raise WireError(E.MALFORMED, f"{what} must be an unsigned 64-bit integer")
    return v  # type: ignore[no-any-return]


def _str(v: Any, what: str, limit: int = 255) -> str:
    if not isinstance(v, str) or len(v) > limit:
        raise WireError(E.MALFORMED, f"{what} must be a string of at most {limit} chars")
    return v


def _list(v: Any, what: str) -> list[Any]:
    if v.__class__ is not list:
        raise WireError(E.MALFORMED, f"{what} must be an array")
    return v  # type: ignore[no-any-return]


def _cmd(c: Any) -> tuple[int, str, str | None, int]:
    if c.__class__ is not list or len(c) != 4:
        raise WireError(E.MALFORMED, "a command is [op, topic, key, mode]")
    op, topic, key, mode = c
    if op not in (0, 1) or op.__class__ is not int:
        raise WireError(E.MALFORMED, "op must be 0 (unsub) or 1 (sub)")
    if mode not in (0, 1) or mode.__class__ is not int:
        raise WireError(E.BAD_MODE, "mode must be 0 (fire) or 1 (reliable)")
    return op, check_topic(topic), check_key(key), mode


# Field count per frame type (after version and type).
_ARITY = {
    T.HELLO: 2, T.WELCOME: 4, T.CMDS: 5, T.CMDACK: 3, T.PUB: 7, T.PUBACK: 2,
    T.MSGS: 3, T.ACK: 5, T.PING: 3, T.PONG: 4, T.CANCEL: 3, T.REDIRECT: 4, T.ERROR: 2,
    T.STATUS: 2, T.STATUS_REPLY: 1,
}  # fmt: skip


def decode_untrusted_frame(data: bytes, max_len: int = 65536) -> tuple[Any, ...]:
    """Parse and validate one binary datagram from the network.

    Returns ``(type, field, ...)`` with every field checked for type and range,
    messages as validated 4-tuples. Raises WireError for anything else.
    """
    try:
        frame = msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            max_str_len=max_len,
            max_bin_len=max_len,
            max_array_len=max_len,
            max_map_len=max_len,
            max_ext_len=0,
        )
    except Exception as exc:  # msgpack raises many types; all mean "not a frame"
        code = E.BAD_UTF8 if isinstance(exc, UnicodeDecodeError) else E.MALFORMED
        raise WireError(code, f"not a msgpack frame: {exc.__class__.__name__}") from None
    if frame.__class__ is not list or len(frame) < 2:
        raise WireError(E.MALFORMED, "a frame is [version, type, ...]")
    if frame[0] != VERSION or frame[0].__class__ is not int:
        raise WireError(E.UNSUPPORTED_VERSION, f"unsupported version, this node speaks {VERSION}")
    try:
        ftype = T(frame[1])
    except (ValueError, TypeError):
        raise WireError(E.UNKNOWN_TYPE, "unknown frame type") from None
    f = frame[2:]
    if len(f) != _ARITY[ftype]:
        raise WireError(E.MALFORMED, f"{ftype.name} has {_ARITY[ftype]} fields, got {len(f)}")
    if ftype is T.PUB:
        cid, cookie, pid, first, floor, rel, msgs = f
        if rel.__class__ is not bool:
            raise WireError(E.MALFORMED, "reliable flag must be a boolean")
        msgs = _list(msgs, "messages")
        if not msgs:
            raise WireError(E.MALFORMED, "PUB carries at least one message")
        return (
            ftype, _bytes(cid, ID_LEN, "client id"), _bytes(cookie, COOKIE_LEN, "cookie"),
            _bytes(pid, ID_LEN, "producer id"), _uint(first, "first_seq"),
            _uint(floor, "floor"), rel, [check_message(m) for m in msgs],
        )  # fmt: skip
    if ftype is T.MSGS:
        stream, first, msgs = f
        return ftype, _uint(stream, "stream"), _uint(first, "first_seq"), [
            check_message(m) for m in _list(msgs, "messages")
        ]
    if ftype is T.ACK:
        cid, cookie, stream, max_seq, sack = f
        ranges = []
        for r in _list(sack, "sack")[:64]:
            if r.__class__ is not list or len(r) != 2:
                raise WireError(E.MALFORMED, "a sack range is [lo, hi]")
            lo, hi = _uint(r[0], "sack lo"), _uint(r[1], "sack hi")
            if lo > hi:
                raise WireError(E.MALFORMED, "sack range with lo > hi")
            ranges.append((lo, hi))
        return (
            ftype, _bytes(cid, ID_LEN, "client id"), _bytes(cookie, COOKIE_LEN, "cookie"),
            _uint(stream, "stream"), _uint(max_seq, "max_seq"), ranges,
        )  # fmt: skip
    if ftype is T.HELLO:
        cid, pad = f
        if not isinstance(pad, bytes):
            raise WireError(E.MALFORMED, "HELLO padding must be bytes")
        return ftype, _bytes(cid, ID_LEN, "client id")
    if ftype is T.CMDS:
        cid, cookie, session, batch, cmds = f
        return (
            ftype, _bytes(cid, ID_LEN, "client id"), _bytes(cookie, COOKIE_LEN, "cookie"),
            _uint(session, "session"), _uint(batch, "batch id"), [_cmd(c) for c in _list(cmds, "commands")],
        )  # fmt: skip
    if ftype is T.STATUS:
        cid, cookie = f
        return ftype, _bytes(cid, ID_LEN, "client id"), _bytes(cookie, COOKIE_LEN, "cookie")
    if ftype is T.STATUS_REPLY:
        if not isinstance(f[0], dict):
            raise WireError(E.MALFORMED, "STATUS_REPLY carries a map")
        return ftype, f[0]
    if ftype is T.PING:
        cid, cookie, token = f
        return (
            ftype, _bytes(cid, ID_LEN, "client id"), _bytes(cookie, COOKIE_LEN, "cookie"),
            _uint(token, "token"),
        )  # fmt: skip
    if ftype is T.WELCOME:
        node_id, cookie, params, members = f
        if not isinstance(params, dict):
            raise WireError(E.MALFORMED, "WELCOME params must be a map")
        mem = []
        for m in _list(members, "members"):
            if m.__class__ is not list or len(m) != 3:
                raise WireError(E.MALFORMED, "a member is [id, host, port]")
            mem.append((_str(m[0], "member id"), _str(m[1], "member host"), _uint(m[2], "port")))
        return ftype, _str(node_id, "node id"), _bytes(cookie, COOKIE_LEN, "cookie"), params, mem
    if ftype is T.CMDACK:
        session, batch, results = f
        res = _list(results, "results")
        if any(r.__class__ is not int for r in res):
            raise WireError(E.MALFORMED, "results must be integers")
        return ftype, _uint(session, "session"), _uint(batch, "batch id"), res
    if ftype is T.PUBACK:
        pid, acked = f
        return ftype, _bytes(pid, ID_LEN, "producer id"), _uint(acked, "acked seq")
    if ftype is T.PONG:
        token, known, cookie, cancels = f
        if known.__class__ is not bool:
            raise WireError(E.MALFORMED, "known must be a boolean")
        cs = []
        for c in _list(cancels, "cancels"):
            if c.__class__ is not list or len(c) != 3:
                raise WireError(E.MALFORMED, "a cancel is [topic, key, reason]")
            cs.append((check_topic(c[0]), check_key(c[1]), _str(c[2], "reason")))
        return ftype, _uint(token, "token"), known, _bytes(cookie, COOKIE_LEN, "cookie"), cs
    if ftype is T.CANCEL:
        topic, key, reason = f
        return ftype, check_topic(topic), check_key(key), _str(reason, "reason")
    if ftype is T.REDIRECT:
        node_id, host, port, reason = f
        return (
            ftype, _str(node_id, "node id"), _str(host, "host"), _uint(port, "port"),
            _str(reason, "reason"),
        )  # fmt: skip
    # T.ERROR
    code, text = f
    if code.__class__ is not int:
        raise WireError(E.MALFORMED, "error code must be an integer")
    return ftype, code, _str(text, "error text", 1024)
