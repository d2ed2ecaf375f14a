"""The durable-mode frames (docs/durable.md): PUT/PUTACK, GET/RECORDS, COMMIT/COMMITTED.

Encoders and the validators of untrusted frames, registered in client/decoding.py's table like
every other frame type (client/decoding.py imports this module last, so decode_untrusted_frame
knows them).
"""

from __future__ import annotations

from typing import Any

from roost.client.decoding import _batch, _frame
from roost.client.wire import (
    COOKIE_LEN,
    ID_LEN,
    VERSION,
    ErrorCode,
    FrameType,
    WireError,
    _bytes,
    _header,
    _list,
    _seq,
    _str,
    _uint,
    array_header,
    check_message,
    check_topic,
    pack,
)


def encode_put(client_id: bytes, cookie: bytes, producer_id: bytes, partition: int, first_seq: int, floor: int,
               packed_msgs: list[bytes]) -> bytes:  # fmt: skip
    """PUT: a durable publish of messages of one partition, sequences first_seq.. of the producer
    in that partition (each partition has its own sequences: its log de-duplicates them)."""
    return (
        _header(9, VERSION, FrameType.PUT, client_id, cookie, producer_id, partition, first_seq, floor)
        + array_header(len(packed_msgs))
        + b"".join(packed_msgs)
    )


#: PUTACK status: stored and committed on every owner; this member does not lead the partition
#: (ask for the map, retry); too much uncommitted, retry; a gap (resend from the acknowledged point);
#: this member cannot reach the majority of the metadata quorum (retry, at another member)
PUT_OK, PUT_NOT_LEADER, PUT_BUSY, PUT_GAP, PUT_NO_QUORUM = 0, 1, 2, 3, 4


def encode_putack(producer_id: bytes, partition: int, acked_seq: int, status: int) -> bytes:
    return pack([VERSION, FrameType.PUTACK, producer_id, partition, acked_seq, status])


#: Where a durable subscription begins when its cursor does not exist yet (GET ``start``)
START_EARLIEST, START_LATEST, START_OFFSET, START_TIME = 0, 1, 2, 3


def encode_get(client_id: bytes, cookie: bytes, durable_id: bytes, name: str, topic: str, partition: int,
               start: int, start_at: int, max_records: int, read_from: int = 0) -> bytes:  # fmt: skip
    """GET: the records of ``topic`` from the cursor of durable subscription (durable_id, name), or
    from ``read_from`` if that is later (what this reader was given and has not committed yet).
    With ``name`` empty there is no subscription: a plain read from ``read_from`` (a reader that
    keeps its own offsets, such as the Spark source); ``start`` and ``start_at`` are not used."""
    return pack([VERSION, FrameType.GET, client_id, cookie, durable_id, name, topic, partition, start, start_at,
                 max_records, read_from])  # fmt: skip


def encode_records(name: str, partition: int, cursor: int, scanned: int, status: int,
                   records: list[list[Any]], first: int = 0, end: int = 0) -> bytes:  # fmt: skip
    """RECORDS: ``[[offset, time ms, topic, key, tags, payload], ...]``; ``scanned``: the offset after the
    last record looked at (records of other topics of the partition are skipped); ``first`` and
    ``end``: the partition's first retained offset and its commit (the end a reader can reach)."""
    return pack([VERSION, FrameType.RECORDS, name, partition, cursor, scanned, status, records, first, end])


def encode_commit(client_id: bytes, cookie: bytes, durable_id: bytes, name: str, topic: str, partition: int,
                  offset: int) -> bytes:  # fmt: skip
    return pack([VERSION, FrameType.COMMIT, client_id, cookie, durable_id, name, topic, partition, offset])


def encode_committed(name: str, partition: int, offset: int, status: int) -> bytes:
    return pack([VERSION, FrameType.COMMITTED, name, partition, offset, status])


@_frame(FrameType.PUT, 7)
def _put(f: list[Any]) -> tuple[Any, ...]:
    _, _, cid, cookie, pid, partition, first, floor, msgs = f
    msgs = _batch("PUT", first, msgs)
    return (
        FrameType.PUT, _bytes(cid, ID_LEN, "client id"), _bytes(cookie, COOKIE_LEN, "cookie"),
        _bytes(pid, ID_LEN, "producer id"), _uint(partition, "partition"), first,
        _seq(floor, "floor"), [check_message(m) for m in msgs],
    )  # fmt: skip


@_frame(FrameType.PUTACK, 4)
def _putack(f: list[Any]) -> tuple[Any, ...]:
    _, _, pid, partition, acked, status = f
    if status not in (PUT_OK, PUT_NOT_LEADER, PUT_BUSY, PUT_GAP, PUT_NO_QUORUM):
        raise WireError(ErrorCode.MALFORMED, "unknown PUTACK status")
    return (
        FrameType.PUTACK,
        _bytes(pid, ID_LEN, "producer id"),
        _uint(partition, "partition"),
        _seq(acked, "acked"),
        status,
    )


@_frame(FrameType.GET, 10)
def _get(f: list[Any]) -> tuple[Any, ...]:
    _, _, cid, cookie, did, name, topic, partition, start, start_at, most, read_from = f
    if start not in (START_EARLIEST, START_LATEST, START_OFFSET, START_TIME):
        raise WireError(ErrorCode.MALFORMED, "unknown GET start")
    return (
        FrameType.GET, _bytes(cid, ID_LEN, "client id"), _bytes(cookie, COOKIE_LEN, "cookie"),
        _bytes(did, ID_LEN, "durable id"), _str(name, "durable name", 64), check_topic(topic),
        _uint(partition, "partition"), start, _seq(start_at, "start offset or time"),
        max(1, min(_uint(most, "max records"), 10_000)), _seq(read_from, "read from"),
    )  # fmt: skip


@_frame(FrameType.RECORDS, 8)
def _records(f: list[Any]) -> tuple[Any, ...]:
    _, _, name, partition, cursor, scanned, status, recs, first, end = f
    out = []
    for r in _list(recs, "records"):
        if r.__class__ is not list or len(r) != 6:
            raise WireError(ErrorCode.MALFORMED, "a record is [offset, time ms, topic, key, tags, payload]")
        out.append((_seq(r[0], "offset"), _seq(r[1], "time"), *check_message(r[2:])))
    return (FrameType.RECORDS, _str(name, "durable name", 64), _uint(partition, "partition"), _seq(cursor, "cursor"),
            _seq(scanned, "scanned"), _uint(status, "status"), out, _seq(first, "first"),
            _seq(end, "end"))  # fmt: skip


@_frame(FrameType.COMMIT, 7)
def _commit(f: list[Any]) -> tuple[Any, ...]:
    _, _, cid, cookie, did, name, topic, partition, offset = f
    if not name:
        raise WireError(ErrorCode.MALFORMED, "COMMIT needs a durable subscription name")
    return (
        FrameType.COMMIT, _bytes(cid, ID_LEN, "client id"), _bytes(cookie, COOKIE_LEN, "cookie"),
        _bytes(did, ID_LEN, "durable id"), _str(name, "durable name", 64), check_topic(topic),
        _uint(partition, "partition"), _seq(offset, "offset"),
    )  # fmt: skip


@_frame(FrameType.COMMITTED, 4)
def _committed(f: list[Any]) -> tuple[Any, ...]:
    _, _, name, partition, offset, status = f
    return (FrameType.COMMITTED, _str(name, "durable name", 64), _uint(partition, "partition"), _seq(offset, "offset"),
            _uint(status, "status"))  # fmt: skip
