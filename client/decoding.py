"""Decoding untrusted frames: every binary datagram from the network goes through
:func:`decode_untrusted_frame`, which returns a fully validated tuple or raises
:class:`~roost.client.wire.WireError` with a code the node can report.

It looks the frame type up in a table of per-type validators (``_DECODERS``), one dict lookup and
one call whatever the type, so the hot PUB, MSGS and ACK frames pay nothing for the rarer ones
(client/durablewire.py registers the durable-mode frames' validators in it too). The codec never
lets a msgpack or type error escape, because a decoder exception must not be able to crash a node.

A module of its own, apart from the encoders and field checks of client/wire.py (which it imports;
wire.py imports nothing from here), because this is the part that faces the network.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

import msgpack

from roost.client.wire import (
    COOKIE_LEN,
    ID_LEN,
    MAX_ERROR_TEXT,
    MAX_MEMBERS,
    RUN_PAYLOAD_MAX,
    SEQ_LIMIT,
    VERSION,
    ErrorCode,
    FrameType,
    WireError,
    _bytes,
    _cmd,
    _ip,
    _list,
    _node_id,
    _port,
    _seq,
    _str,
    _uint,
    _valid_topics,
    check_delivered,
    check_filter,
    check_key,
    check_message,
    check_topic,
    pub_header,
)

#: A validator takes the whole frame ``[version, type, field...]``, whose
#: length is already checked (a list; for PUB and MSGS a tuple: ``_AS_TUPLES``),
#: and returns the validated tuple.
_Validator = Callable[[Any], tuple[Any, ...]]

#: Frame type -> (type, frame length including version and type, validator).
#: Keyed by the plain int so that the decoder needs no ``T(...)`` call per frame.
_DECODERS: dict[int, tuple[FrameType, int, _Validator]] = {}


#: The decoded frames' fields: ``decode_untrusted_frame`` returns a plain tuple, the frame's type
#: first (``TYPE``), and these name the other positions, per frame type, where they are read. Index
#: constants rather than a NamedTuple per frame: the tuple the validator builds stays a tuple (no
#: class call per frame), and a message of a PUB's or MSGS's batch stays the tuple msgpack made;
#: ``Final``, so that mypyc (scripts/benchnative.py) compiles a read to a constant index.
TYPE: Final = 0
#: Every frame a client sends a node: its client id and cookie (HELLO: the client id alone).
CLIENT_ID: Final = 1
COOKIE: Final = 2
PUB_PRODUCER: Final = 3
PUB_FIRST: Final = 4
PUB_FLOOR: Final = 5
PUB_RELIABLE: Final = 6
PUB_MESSAGES: Final = 7
PUBRUN_PRODUCER: Final = 3
PUBRUN_FIRST: Final = 4
PUBRUN_TOPIC: Final = 5
PUBRUN_PAYLOADS: Final = 6
ACK_STREAM: Final = 3
ACK_MAX_SEQ: Final = 4
ACK_SACK: Final = 5
CMDS_SESSION: Final = 3
CMDS_BATCH: Final = 4
CMDS_COMMANDS: Final = 5
PING_TOKEN: Final = 3
PING_DIGEST: Final = 4
PING_SESSION: Final = 5
BYE_SESSION: Final = 3
#: The durable-mode frames (client/durablewire.py's validators).
PUT_PRODUCER: Final = 3
PUT_PARTITION: Final = 4
PUT_FIRST: Final = 5
PUT_FLOOR: Final = 6
PUT_MESSAGES: Final = 7
GET_DURABLE: Final = 3
GET_NAME: Final = 4
GET_TOPIC: Final = 5
GET_PARTITION: Final = 6
GET_START: Final = 7
GET_START_AT: Final = 8
GET_MAX: Final = 9
GET_READ_FROM: Final = 10
COMMIT_DURABLE: Final = 3
COMMIT_NAME: Final = 4
COMMIT_TOPIC: Final = 5
COMMIT_PARTITION: Final = 6
COMMIT_OFFSET: Final = 7
#: The frames a node sends a client.
MSGS_STREAM: Final = 1
MSGS_FIRST: Final = 2
MSGS_MESSAGES: Final = 3
MSGSRUN_NUMBER: Final = 1
MSGSRUN_TOPIC: Final = 2
MSGSRUN_PAYLOADS: Final = 3
WELCOME_NODE: Final = 1
WELCOME_COOKIE: Final = 2
WELCOME_PARAMS: Final = 3
WELCOME_MEMBERS: Final = 4
WELCOME_MAP: Final = 5
CMDACK_SESSION: Final = 1
CMDACK_BATCH: Final = 2
CMDACK_RESULTS: Final = 3
PUBACK_PRODUCER: Final = 1
PUBACK_ACKED: Final = 2
PONG_TOKEN: Final = 1
PONG_KNOWN: Final = 2
PONG_COOKIE: Final = 3
PONG_CANCELS: Final = 4
PONG_DIGEST: Final = 5
CANCEL_TOPIC: Final = 1
CANCEL_KEY: Final = 2
CANCEL_REASON: Final = 3
REDIRECT_NODE: Final = 1
REDIRECT_MAP: Final = 2
ERROR_CODE: Final = 1
ERROR_TEXT: Final = 2
STATUS_REPLY_STATUS: Final = 1
PUTACK_PRODUCER: Final = 1
PUTACK_PARTITION: Final = 2
PUTACK_ACKED: Final = 3
PUTACK_STATUS: Final = 4
#: A message of a PUB's or MSGS's batch (a tuple: ``_checked``): topic, key, tags, payload; a
#: delivered one (6 or 7 fields) also its producer id and sequence; a queue group's copy its marks last.
MSG_TOPIC: Final = 0
MSG_KEY: Final = 1
MSG_TAGS: Final = 2
MSG_PAYLOAD: Final = 3
MSG_PRODUCER: Final = 4
MSG_SEQ: Final = 5


def _frame(ftype: FrameType, fields: int) -> Callable[[_Validator], _Validator]:
    """Register the validator of ``ftype``, which has ``fields`` after version and type."""

    def register(fn: _Validator) -> _Validator:
        _DECODERS[int(ftype)] = (ftype, fields + 2, fn)
        return fn

    return register


# The hot three first: PUB (node, per publisher datagram), MSGS (client), ACK (node).


@_frame(FrameType.PUB, 7)
def _pub(f: Sequence[Any]) -> tuple[Any, ...]:  # (a tuple: _AS_TUPLES; mypyc checks a list annotation)
    _, _, cid, cookie, pid, first, floor, rel, msgs = f
    if rel.__class__ is not bool:
        raise WireError(ErrorCode.MALFORMED, "reliable flag must be a boolean")
    msgs = _batch("PUB", first, msgs)
    return (
        FrameType.PUB, _bytes(cid, ID_LEN, "client id"), _bytes(cookie, COOKIE_LEN, "cookie"),
        _bytes(pid, ID_LEN, "producer id"), first,
        _seq(floor, "floor"), rel, _checked(msgs, False),
    )  # fmt: skip


@_frame(FrameType.MSGS, 3)
def _msgs(f: Sequence[Any]) -> tuple[Any, ...]:  # (a tuple: _AS_TUPLES)
    _, _, stream, first, msgs = f
    msgs = _array(msgs, "messages")
    if _uint(stream, "stream"):  # (fire: first_seq numbers the datagram, as MSGSRUN's number does)
        _last_seq(_seq(first, "first_seq"), msgs)
    return FrameType.MSGS, stream, _uint(first, "first_seq"), _checked(msgs, True)


@_frame(FrameType.PUBRUN, 6)
def _pubrun(f: list[Any]) -> tuple[Any, ...]:
    _, _, cid, cookie, pid, first, topic, payloads = f
    return (
        FrameType.PUBRUN, _bytes(cid, ID_LEN, "client id"), _bytes(cookie, COOKIE_LEN, "cookie"),
        _bytes(pid, ID_LEN, "producer id"), _seq(first, "first_seq"), check_topic(topic),
        _payloads(_batch("PUBRUN", first, payloads)),
    )  # fmt: skip


@_frame(FrameType.MSGSRUN, 3)
def _msgsrun(f: list[Any]) -> tuple[Any, ...]:
    _, _, number, topic, payloads = f
    if not _array(payloads, "payloads"):
        raise WireError(ErrorCode.MALFORMED, "MSGSRUN carries at least one payload")
    return FrameType.MSGSRUN, _uint(number, "number"), check_topic(topic), _payloads(payloads)


def _payloads(payloads: Sequence[Any]) -> Sequence[bytes]:
    """A run's payloads: each bytes of at most ``RUN_PAYLOAD_MAX`` (one loop, no call per payload)."""
    for p in payloads:
        if p.__class__ is not bytes or len(p) > RUN_PAYLOAD_MAX:
            raise WireError(ErrorCode.MALFORMED, f"a run's payload is bytes of at most {RUN_PAYLOAD_MAX}")
    return payloads


def _checked(msgs: Sequence[Any], delivered: bool) -> list[tuple[Any, ...]]:
    """A PUB's (``delivered`` False) or a MSGS's messages, checked. The common message (a known
    topic, no key, no tags, a payload, and in MSGS, reliable: a producer id and sequence) is
    checked in one expression in this loop (a function call per message costs as much as the
    checks); anything else, valid or not, goes through ``check_message`` or
    ``check_delivered``. msgpack made the messages tuples (``_AS_TUPLES``): while every one so
    far is common they are kept as they are (``out`` None), and only a datagram with another
    shape in it (or a frame whose arrays came as lists: not our encoders') gets a list of
    checked copies."""
    topics, full = _valid_topics, check_delivered if delivered else check_message
    out: list[tuple[Any, ...]] | None = None if msgs.__class__ is tuple else []
    for at, m in enumerate(msgs):
        if m.__class__ is tuple or m.__class__ is list:
            if out is None and m.__class__ is list:  # (not msgpack's: only its tuples are kept as they are)
                out = list(msgs[:at])
            n = len(m)
            if n == 4:
                t, k, g, p = m
                if k is None and g is None and t.__class__ is str and t in topics and p.__class__ is bytes:
                    if out is not None:
                        out.append((t, None, None, p))
                    continue
            elif n == 6 and delivered:
                t, k, g, p, i, s = m
                if (k is None and g is None and t.__class__ is str and t in topics and p.__class__ is bytes
                        and i.__class__ is bytes and len(i) == ID_LEN and s.__class__ is int
                        and 0 <= s < SEQ_LIMIT):  # fmt: skip
                    if out is not None:
                        out.append((t, None, None, p, i, s))
                    continue
        if out is None:
            out = list(msgs[:at])  # (the common ones before it, as msgpack made them)
        out.append(full(m))
    return list(msgs) if out is None else out


def _batch(frame: str, first: Any, msgs: Any) -> Sequence[Any]:
    """A PUB's or a PUT's messages: an array (a tuple in a PUB: ``_AS_TUPLES``) of at least one,
    their sequences from ``first`` on below 2**63 (each message is checked by the caller)."""
    checked: Sequence[Any] = _array(msgs, "messages")
    if not checked:
        raise WireError(ErrorCode.MALFORMED, f"{frame} carries at least one message")
    _last_seq(_seq(first, "first_seq"), checked)
    return checked


def _array(v: Any, what: str) -> Any:
    """``_list``, for the frames decoded with their arrays as tuples (``_AS_TUPLES``) as well."""
    if v.__class__ is not list and v.__class__ is not tuple:
        raise WireError(ErrorCode.MALFORMED, f"{what} must be an array")
    return v


def _last_seq(first: int, msgs: Sequence[Any]) -> None:
    """The messages of a PUB, a PUT or a reliable MSGS take the sequences ``first`` on: the last
    be below 2**63 too (``wire.SEQ_LIMIT``: one past it would overflow every frame that carries
    or acknowledges it, and the counters of the node that takes it)."""
    if first + len(msgs) - 1 >= SEQ_LIMIT:
        raise WireError(ErrorCode.MALFORMED, "first_seq + messages - 1 must be below 2**63")


@_frame(FrameType.ACK, 5)
def _ack(f: list[Any]) -> tuple[Any, ...]:
    _, _, cid, cookie, stream, max_seq, sack = f
    ranges = []
    for r in _list(sack, "sack")[:64]:
        if r.__class__ is not list or len(r) != 2:
            raise WireError(ErrorCode.MALFORMED, "a sack range is [lo, hi]")
        lo, hi = _seq(r[0], "sack lo"), _seq(r[1], "sack hi")
        if lo > hi:
            raise WireError(ErrorCode.MALFORMED, "sack range with lo > hi")
        ranges.append((lo, hi))
    return (
        FrameType.ACK, _bytes(cid, ID_LEN, "client id"), _bytes(cookie, COOKIE_LEN, "cookie"),
        _uint(stream, "stream"), _seq(max_seq, "max_seq"), ranges,
    )  # fmt: skip


@_frame(FrameType.HELLO, 2)
def _hello(f: list[Any]) -> tuple[Any, ...]:
    _, _, cid, pad = f
    if not isinstance(pad, bytes):
        raise WireError(ErrorCode.MALFORMED, "HELLO padding must be bytes")
    return FrameType.HELLO, _bytes(cid, ID_LEN, "client id")


def _cluster_map(v: Any) -> Any:
    """A cluster map's wire form, checked and placed (client/clustermap.py; imported here,
    not at the top: the cluster package builds on this module)."""
    from roost.client.clustermap import decode_untrusted_map

    return decode_untrusted_map(v)


@_frame(FrameType.WELCOME, 4)
def _welcome(f: list[Any]) -> tuple[Any, ...]:
    """Returns the cluster map (params' ``map``, checked and placed) as a field of its own,
    None when there is none."""
    _, _, node_id, cookie, params, members = f
    if not isinstance(params, dict):
        raise WireError(ErrorCode.MALFORMED, "WELCOME params must be a map")
    raw_map = params.pop("map", None)
    cmap = None if raw_map is None else _cluster_map(raw_map)
    if "map_epoch" in params:
        _uint(params["map_epoch"], "map_epoch")
    members = _list(members, "members")
    if len(members) > MAX_MEMBERS:
        raise WireError(ErrorCode.MALFORMED, f"a cluster map has at most {MAX_MEMBERS} members")
    mem = []
    for m in members:
        if m.__class__ is not list or len(m) != 3:
            raise WireError(ErrorCode.MALFORMED, "a member is [id, host, port]")
        mem.append((_node_id(m[0], "member id"), _ip(m[1], "member host"), _port(m[2], "member port")))
    return FrameType.WELCOME, _node_id(node_id, "node id"), _bytes(cookie, COOKIE_LEN, "cookie"), params, mem, cmap


@_frame(FrameType.CMDS, 5)
def _cmds(f: list[Any]) -> tuple[Any, ...]:
    _, _, cid, cookie, session, batch, cmds = f
    return (
        FrameType.CMDS, _bytes(cid, ID_LEN, "client id"), _bytes(cookie, COOKIE_LEN, "cookie"),
        _seq(session, "session"), _seq(batch, "batch id"), [_cmd(c) for c in _list(cmds, "commands")],
    )  # fmt: skip


@_frame(FrameType.CMDACK, 3)
def _cmdack(f: list[Any]) -> tuple[Any, ...]:
    _, _, session, batch, results = f
    res = _list(results, "results")
    if any(r.__class__ is not int for r in res):
        raise WireError(ErrorCode.MALFORMED, "results must be integers")
    return FrameType.CMDACK, _seq(session, "session"), _seq(batch, "batch id"), res


@_frame(FrameType.PUBACK, 2)
def _puback(f: list[Any]) -> tuple[Any, ...]:
    _, _, pid, acked = f
    return FrameType.PUBACK, _bytes(pid, ID_LEN, "producer id"), _seq(acked, "acked seq")


@_frame(FrameType.PING, 5)
def _ping(f: list[Any]) -> tuple[Any, ...]:
    _, _, cid, cookie, token, digest, session = f
    return (
        FrameType.PING, _bytes(cid, ID_LEN, "client id"), _bytes(cookie, COOKIE_LEN, "cookie"), _uint(token, "token"),
        _uint(digest, "digest"), _seq(session, "session"),
    )  # fmt: skip


@_frame(FrameType.PONG, 5)
def _pong(f: list[Any]) -> tuple[Any, ...]:
    _, _, token, known, cookie, cancels, digest = f
    if known.__class__ is not bool:
        raise WireError(ErrorCode.MALFORMED, "known must be a boolean")
    cs = []
    for c in _list(cancels, "cancels"):
        if c.__class__ is not list or len(c) != 3:
            raise WireError(ErrorCode.MALFORMED, "a cancel is [topic, key, reason]")
        cs.append((check_filter(c[0]), check_key(c[1]), _str(c[2], "reason")))
    return (
        FrameType.PONG,
        _uint(token, "token"),
        known,
        _bytes(cookie, COOKIE_LEN, "cookie"),
        cs,
        _uint(digest, "digest"),
    )


@_frame(FrameType.CANCEL, 3)
def _cancel(f: list[Any]) -> tuple[Any, ...]:
    _, _, topic, key, reason = f
    return FrameType.CANCEL, check_filter(topic), check_key(key), _str(reason, "reason")


@_frame(FrameType.REDIRECT, 2)
def _redirect(f: list[Any]) -> tuple[Any, ...]:
    _, _, node_id, cmap = f
    return FrameType.REDIRECT, _node_id(node_id, "node id"), _cluster_map(cmap)


@_frame(FrameType.MAP, 2)
def _map(f: list[Any]) -> tuple[Any, ...]:
    _, _, cid, cookie = f
    return FrameType.MAP, _bytes(cid, ID_LEN, "client id"), _bytes(cookie, COOKIE_LEN, "cookie")


@_frame(FrameType.BYE, 3)
def _bye(f: list[Any]) -> tuple[Any, ...]:
    _, _, cid, cookie, session = f
    return (
        FrameType.BYE,
        _bytes(cid, ID_LEN, "client id"),
        _bytes(cookie, COOKIE_LEN, "cookie"),
        _seq(session, "session"),
    )


@_frame(FrameType.ERROR, 2)
def _error(f: list[Any]) -> tuple[Any, ...]:
    _, _, code, text = f
    if code.__class__ is not int:
        raise WireError(ErrorCode.MALFORMED, "error code must be an integer")
    return FrameType.ERROR, code, _str(text, "error text", MAX_ERROR_TEXT)


@_frame(FrameType.STATUS, 2)
def _status(f: list[Any]) -> tuple[Any, ...]:
    _, _, cid, cookie = f
    return FrameType.STATUS, _bytes(cid, ID_LEN, "client id"), _bytes(cookie, COOKIE_LEN, "cookie")


@_frame(FrameType.STATUS_REPLY, 1)
def _status_reply(f: list[Any]) -> tuple[Any, ...]:
    if not isinstance(f[2], dict):
        raise WireError(ErrorCode.MALFORMED, "STATUS_REPLY carries a map")
    return FrameType.STATUS_REPLY, f[2]


#: The first three bytes of a PUB and of a MSGS (a fixarray of their length, the version, the
#: type): these two, a node's and a subscriber's per-message frames, are unpacked with their
#: arrays as tuples, so that a checked message is the tuple msgpack made, not a copy of a list
#: (~45-70 ns a message on each hop: docs/performance.md). Any other frame keeps its lists.
#: (A tuple, compared by ==: a bytearray or memoryview datagram compares as bytes does.)
_AS_TUPLES = (bytes((0x90 + 9, VERSION, FrameType.PUB)), bytes((0x90 + 5, VERSION, FrameType.MSGS)))


#: The text of the ERROR a node answers a frame type it does not know with (every build's): a
#: client that hears it after a PUBRUN stops sending runs (client/session.py).
UNKNOWN_FRAME = "unknown frame type"


def decode_untrusted_frame(data: bytes, max_len: int = 65536) -> tuple[Any, ...]:
    """Parse and validate one binary datagram from the network.

    Returns ``(type, field, ...)`` with every field checked for type and range,
    messages as validated 4-tuples. Raises WireError for anything else.
    """
    try:
        frame = msgpack.unpackb(
            data,
            raw=False,
            use_list=data[:3] not in _AS_TUPLES,
            strict_map_key=True,
            max_str_len=max_len,
            max_bin_len=max_len,
            max_array_len=max_len,
            max_map_len=max_len,
            max_ext_len=0,
        )
    except Exception as exc:  # msgpack raises many types; all mean "not a frame"
        code = ErrorCode.BAD_UTF8 if isinstance(exc, UnicodeDecodeError) else ErrorCode.MALFORMED
        raise WireError(code, f"not a msgpack frame: {exc.__class__.__name__}") from None
    if (frame.__class__ is not list and frame.__class__ is not tuple) or len(frame) < 2:
        raise WireError(ErrorCode.MALFORMED, "a frame is [version, type, ...]")
    if frame[0] != VERSION or frame[0].__class__ is not int:
        raise WireError(ErrorCode.UNSUPPORTED_VERSION, f"unsupported version, this node speaks {VERSION}")
    ft = frame[1]
    rule = _DECODERS.get(ft) if ft.__class__ is int else None
    if rule is None:
        raise WireError(ErrorCode.UNKNOWN_TYPE, UNKNOWN_FRAME)
    ftype, length, validate = rule
    if len(frame) != length:
        raise WireError(ErrorCode.MALFORMED, f"{ftype.name} has {length - 2} fields, got {len(frame) - 2}")
    return validate(frame)


def pub_messages_untrusted(data: bytes, frame: tuple[Any, ...]) -> bytes | None:
    """The array of messages of ``frame``, a PUB that :func:`decode_untrusted_frame` made of
    ``data``, as ``data`` carries it (its array header included): so a node can relay a fire
    datagram's messages to a subscriber as they came, instead of packing each one again. Given
    when ``data`` opens with the PUB's other fields in msgpack's shortest form (as
    ``wire.encode_pub`` writes them, compared byte for byte): then what follows them is exactly
    the bytes the messages were decoded from (the decoder refused anything after the array).
    None when the fields came in another valid form. The caller decides whether the messages
    may go on as they are (each of them ``[topic, key, tags, payload]``: a PUB's message may
    also carry a producer id and sequence, which no subscriber must get from a publisher)."""
    _, cid, cookie, pid, first, floor, reliable, _ = frame
    head = pub_header(cid, cookie, pid, first, floor, reliable)
    return bytes(data[len(head) :]) if data[: len(head)] == head else None


from roost.client import durablewire  # noqa: E402,F401  (registers the durable-mode frames' validators)
