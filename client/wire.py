"""Binary wire codec shared by clients and nodes: constants, encoders, field checks.

Every binary datagram is one msgpack array ``[VERSION, type, ...fields]``. Its
first byte is therefore 0x90-0x9f or 0xdc/0xdd, never an ASCII letter, which is
how a node tells it apart from the FASTPUSS text protocol on the same port.

Encoders are trusted (our own values); anything arriving from the network goes
through ``decode_untrusted_frame`` (client/decoding.py, which imports this module),
which either returns a fully validated tuple or raises :class:`WireError` with
a code the node can report, using the field checks below.

docs/protocol.md describes every frame with a byte-level example.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator
from enum import IntEnum
from itertools import accumulate
from typing import Any, Final

import msgpack

from roost.client import subjects

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
#: Cluster maps: node ids are config names of 1..64 chars; at most 64 members.
MAX_NODE_ID = 64
MAX_MEMBERS = 64
#: Queue marks one delivered message may carry (a node picks another member of a group for
#: a client already picked for this many groups of one message), and the room they take.
MAX_MARKS = 16
MARK_LEN = 16
MARKS_ROOM = 3 + 18 * MAX_MARKS
#: What a datagram needs around one message: PUB's or MSGS's header, the producer id and
#: sequence a node adds, and the room of queue marks (``check_fits``).
MESSAGE_ROOM = 2 * FRAME_OVERHEAD + MARKS_ROOM
#: The tag of one fragment of a message larger than a datagram (client/parts.py).
PART_TAG = "roost.part"


class FrameType(IntEnum):
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
    MAP = 16  # c -> n: send me your cluster map (answered with REDIRECT)
    PUT = 17  # c -> n: durable publish to one partition's log (docs/durable.md)
    PUTACK = 18  # n -> c: [producer id, partition, acked seq, status]
    GET = 19  # c -> n: read a durable subscription's records from its cursor
    RECORDS = 20  # n -> c: [name, partition, cursor, scanned to, status, records, first, end]
    COMMIT = 21  # c -> n: move a durable subscription's cursor
    COMMITTED = 22  # n -> c: [name, partition, cursor, status]
    BYE = 23  # c -> n: [client id, cookie, session]: the client closed; drop its state now
    PUBRUN = 24  # c -> n: a fire PUB of plain messages of one topic: the topic once, then payloads
    MSGSRUN = 25  # n -> c: fire MSGS of plain messages of one topic: the topic once, then payloads


class ErrorCode(IntEnum):
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
    STALE_BATCH = 14  # CMDS of an older client session, or older than the node remembers
    OVER_CAPACITY = 15  # a new subscription while the node is above admission_share of a limit


class Mode(IntEnum):
    """Delivery mode of a subscription (docs/guarantees.md: what each mode promises)."""

    FIRE = 0
    RELIABLE = 1


MODE_NAMES = {"fire": Mode.FIRE, "reliable": Mode.RELIABLE}


class Op(IntEnum):
    UNSUB = 0
    SUB = 1
    SYNC = 2  # first in a batch: the SUBs that follow are all the client's subscriptions


def subs_digest(subs: Iterable[tuple[str, str | None, int]]) -> int:
    """An order-free 64-bit digest of a client's subscriptions (topic, key, mode),
    the same on client and node; never 0, which PING uses for "not checking"."""
    d = 0
    for topic, key, mode in subs:
        raw = f"{topic}\0{'' if key is None else key}\0{mode}\0{int(key is None)}".encode()
        d ^= int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "big")
    return d or 1


class Reason:
    """Why a subscription ended; the strings are part of the protocol."""

    UNSUBSCRIBED: Final = "unsubscribed"
    OUT_OF_CAPACITY: Final = "out_of_capacity"
    NODE_LOST: Final = "node_lost"
    TIMED_OUT: Final = "timed_out"


class WireError(Exception):
    """A datagram that cannot be accepted; ``code`` goes into the ERROR reply."""

    def __init__(self, code: ErrorCode, text: str) -> None:
        super().__init__(text)
        self.code = code
        self.text = text


# Java's \s: the six ASCII whitespace characters, nothing Unicode.
WHITESPACE = re.compile(r"[ \t\n\x0b\f\r]")

_packer = msgpack.Packer(use_bin_type=True)
pack: Callable[[Any], bytes] = _packer.pack
array_header: Callable[[int], bytes] = _packer.pack_array_header


UDP_CEILING = 65507  # the largest UDP payload over IPv4


def check_fits(size: int, max_datagram: int, overhead: int = MESSAGE_ROOM) -> None:
    """A message of ``size`` packed bytes must fit one datagram with its frame's header (and,
    delivered, the room of its queue marks); the error names the limit and the setting that
    raises it."""
    if size + overhead > max_datagram:
        raise WireError(ErrorCode.TOO_LARGE, f"message of {size:,} bytes does not fit one datagram: at most "
                        f"{max_datagram - overhead:,} bytes per message, as max_datagram is {max_datagram:,} "
                        f"(the node's [limits] max_datagram or the client's ClientConfig.max_datagram, whichever "
                        f"is lower; at most {UDP_CEILING:,}, the UDP ceiling)")  # fmt: skip


def pack_message(topic: str, key: str | None, tags: dict[str, str] | None, payload: bytes) -> bytes:
    """One message as it travels inside PUB and MSGS frames, packed once."""
    return pack([topic, key, tags, payload])


PLAIN_HEADS = 4096
_plain_heads: dict[str, bytes] = {}  # checked topic -> a plain message's bytes before its payload
_BIN8 = [b"\xc4" + bytes((n,)) for n in range(256)]  # msgpack's bin 8 header of each length


def _new_head(heads: dict[str, bytes], topic: str, array: bytes) -> bytes:
    """A plain message's bytes before its payload, kept in ``heads``: ``array`` (the fixarray
    byte of its length: 0x94, or 0x96 delivered with producer id and sequence), the topic and
    two nils. At most ``PLAIN_HEADS`` are kept: then all are dropped, as ``_valid_topics`` is."""
    if len(heads) >= PLAIN_HEADS:
        heads.clear()
    head = heads[topic] = array + pack([topic, None, None])[1:]  # (not the fixarray of 3)
    return head


def pack_plain(topic: str, payload: bytes) -> bytes:
    """``pack_message(topic, None, None, payload)`` (the same bytes) for a ``bytes`` payload, the
    topic checked: the publisher's hot path. The message's head (array, topic, two nils) is
    packed once per topic, so a publish joins three byte strings instead of building a list
    for msgpack. At most ``PLAIN_HEADS`` topics are kept (then all are dropped, as
    ``_valid_topics`` is): a publisher of ever new topics pays one pack more per topic."""
    head = _plain_heads.get(topic) if topic.__class__ is str else None
    if head is None:
        head = _new_head(_plain_heads, check_topic(topic), b"\x94")
    n = len(payload)
    return head + _BIN8[n] + payload if n < 256 else head + pack(payload)


_delivery_heads: dict[str, bytes] = {}  # topic -> a plain delivered message's bytes before its payload
_join = b"".join


def pack_messages(msgs: list[tuple[Any, ...]], pid: bytes | None = None, first: int = 0) -> list[bytes]:
    """Checked messages (topic, key, tags, payload, ...) packed as a node delivers them:
    ``pack_message``'s bytes each, or with ``pid`` ``pack_delivery``'s, the sequences from
    ``first`` on. A node packs every message of every PUB: a plain one (no key, no tags, a
    payload under 256 bytes) is its topic's head, packed once per topic (at most
    ``PLAIN_HEADS`` kept, as in ``pack_plain``), joined to its payload, with no list built
    for msgpack. The topics must have been checked (a decoded PUB's are)."""
    out: list[bytes] = []
    add, heads, bin8 = out.append, _plain_heads if pid is None else _delivery_heads, _BIN8
    tail = bin8[len(pid)] + pid if pid is not None else b""
    topic: Any = None
    head = b""
    for seq, m in enumerate(msgs, first):
        p = m[3]
        if m[1] is None and m[2] is None and len(p) < 256:
            if m[0] != topic:
                topic = m[0]
                head = heads.get(topic) or _new_head(heads, topic, b"\x94" if pid is None else b"\x96")
            add(head + bin8[len(p)] + p if pid is None else _join((head, bin8[len(p)], p, tail, pack(seq))))
        else:
            add(pack([m[0], m[1], m[2], p] if pid is None else [m[0], m[1], m[2], p, pid, seq]))
    return out


def pack_delivery(
    topic: str, key: str | None, tags: dict[str, str] | None, payload: bytes, pid: bytes, pseq: int
) -> bytes:
    """A reliable message as nodes deliver it: with its producer id and sequence,
    so a subscriber can drop the copy a producer resent to another node after
    failover (the first node may have delivered it before dying)."""
    return pack([topic, key, tags, payload, pid, pseq])


def mark_id(group_filter: str, key: str | None) -> bytes:
    """The short name of one queue-group subscription in queue marks: 16 bytes of a hash of its
    filter and key, so that a mark costs 18 bytes in MSGS whatever the filter's length, and
    nobody can make two groups share one (a node and a client compute it alike;
    docs/protocol.md, "Queue groups")."""
    return hashlib.blake2b(pack([group_filter, key]), digest_size=MARK_LEN).digest()


def mark_delivery(packed: bytes, marks: list[bytes]) -> bytes:
    """A delivered message (``pack_message`` or ``pack_delivery``) with one more element: the
    ``mark_id`` of each queue-group subscription the node picked this subscriber for
    (docs/protocol.md, "Queue groups"). A message is a msgpack fixarray (at most 15 elements),
    so its first byte is 0x90 + length: one more element is that byte + 1 and the packed marks."""
    return bytes((packed[0] + 1,)) + packed[1:] + pack(marks)


def runs(packed: list[bytes], budget: int, extra: int = 0) -> Iterator[tuple[int, int]]:
    """``(start, end)`` of the consecutive runs of ``packed`` that fill one datagram each: sizes
    (each one's length plus ``extra``) adding up to at most ``budget`` (a larger message alone).
    The cuts come from the running total of sizes by bisection, with no Python step per message
    (PUB and MSGS batches; PUBRUN's payloads, each ``extra`` 2 for its bin 8 head)."""
    sizes = map(len, packed)
    ends = list(accumulate(map(extra.__add__, sizes) if extra else sizes))
    start, base, n = 0, 0, len(packed)
    while start < n:
        end = max(bisect_right(ends, base + budget, start), start + 1)
        yield start, end
        base, start = ends[end - 1], end


def _header(n: int, *fields: Any) -> bytes:
    """Array header for ``n`` elements followed by the given fields."""
    return array_header(n) + b"".join(pack(f) for f in fields)


# ---------------------------------------------------------------- encoders


def encode_hello(client_id: bytes) -> bytes:
    body = _header(4, VERSION, FrameType.HELLO, client_id)
    pad = max(0, HELLO_PAD_TO - len(body) - 2)  # bin8 header: 2 bytes
    return body + pack(b"\0" * pad)


def encode_welcome(node_id: str, cookie: bytes, params: dict[str, Any], members: list[list[Any]]) -> bytes:
    """``params`` of a member of a partitioned cluster carry ``map_epoch`` and, when it fits
    the anti-amplification budget, ``map`` (the cluster map's wire form, client/clustermap.py).
    In params rather than a field of its own: a client that does not route ignores them."""
    return pack([VERSION, FrameType.WELCOME, node_id, cookie, params, members])


def encode_cmds(
    client_id: bytes, cookie: bytes, session: int, batch: int, cmds: list[tuple[int, str, str | None, int]]
) -> bytes:
    """``session`` names the client process (its start in Unix ms), ``batch``
    counts from 1 within it: a node tells a restarted client that reuses its
    client id from a late datagram of the old one by the session alone."""
    return pack([VERSION, FrameType.CMDS, client_id, cookie, session, batch, [list(c) for c in cmds]])


def encode_cmdack(session: int, batch: int, results: list[int]) -> bytes:
    """Echoes the batch's (session, batch) so a client never applies an answer
    meant for another batch, or for its previous process."""
    return pack([VERSION, FrameType.CMDACK, session, batch, results])


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
        pub_header(client_id, cookie, producer_id, first_seq, floor, reliable)
        + array_header(len(packed_msgs))
        + b"".join(packed_msgs)
    )


def pub_header(client_id: bytes, cookie: bytes, producer_id: bytes, first_seq: int, floor: int,
               reliable: bool) -> bytes:  # fmt: skip
    """A PUB's bytes before its array of messages, each field in msgpack's shortest form (a
    node compares a PUB's first bytes with these: ``decoding.pub_messages_untrusted``)."""
    return _header(9, VERSION, FrameType.PUB, client_id, cookie, producer_id, first_seq, floor, reliable)


#: The longest payload a PUBRUN or MSGSRUN carries (each a msgpack bin 8: 2 bytes of head).
RUN_PAYLOAD_MAX = 255


def encode_pubrun(client_id: bytes, cookie: bytes, producer_id: bytes, first_seq: int, topic: str,
                  payloads: list[bytes]) -> bytes:  # fmt: skip
    """A fire PUB of plain messages (no key, no tags) of one ``topic``, sequences ``first_seq``..:
    the topic once, then each payload (at most ``RUN_PAYLOAD_MAX`` bytes), instead of a
    ``[topic, nil, nil, payload]`` array each. A publisher's batch of one topic, as a rule: the
    node checks the topic once and each payload's type, and relays the run as one MSGSRUN per
    subscriber (docs/protocol.md, "Runs")."""
    return _header(8, VERSION, FrameType.PUBRUN, client_id, cookie, producer_id, first_seq, topic) + pack(payloads)


def pubrun_room(max_datagram: int, topic: str) -> int:
    """What a PUBRUN of ``topic`` has for its payloads' array (its header at its longest)."""
    return max_datagram - len(_header(8, VERSION, FrameType.PUBRUN, b"\0" * ID_LEN, b"\0" * COOKIE_LEN, b"\0" * ID_LEN,
                                      2**64 - 1, topic)) - 5  # fmt: skip


def run_body(topic: str, payloads: list[bytes]) -> tuple[bytes, bytes]:
    """A MSGSRUN's bytes after its number: the topic, then the payloads' array (a node packs it
    once per datagram it relays, whatever the number of subscribers); with the packed topic
    alone, the head by which node/relay.py merges runs of one topic."""
    head = pack(topic)
    return head, head + pack(payloads)


def msgsrun_header(number: int) -> bytes:
    """A MSGSRUN's bytes before its ``run_body``: the fire datagram's ``number``, as in a fire
    MSGS."""
    return _header(5, VERSION, FrameType.MSGSRUN, number)


def encode_puback(producer_id: bytes, acked_seq: int) -> bytes:
    return pack([VERSION, FrameType.PUBACK, producer_id, acked_seq])


def encode_msgs(stream_id: int, first_seq: int, packed_msgs: list[bytes]) -> bytes:
    """Messages for one subscriber; reliable ones carry consecutive sequences.

    ``stream_id`` 0 means fire-and-forget (``first_seq`` is then 0 too).
    """
    return msgs_header(stream_id, first_seq) + array_header(len(packed_msgs)) + b"".join(packed_msgs)


def msgs_header(stream_id: int, first_seq: int) -> bytes:
    """A MSGS's bytes before its array of messages (a node that relays a PUB's array as it came
    adds it to that: node/delivery.py)."""
    return _header(5, VERSION, FrameType.MSGS, stream_id, first_seq)


MSGS_HEADER_MAX = len(msgs_header(2**64 - 1, 2**64 - 1)) + 5  # (+ the array's header)


def encode_ack(client_id: bytes, cookie: bytes, stream_id: int, max_seq: int, sack: list[list[int]]) -> bytes:
    return pack([VERSION, FrameType.ACK, client_id, cookie, stream_id, max_seq, sack])


def encode_ping(client_id: bytes, cookie: bytes, token: int, digest: int = 0, session: int = 0) -> bytes:
    """``digest``: subs_digest of the subscriptions the client holds as
    confirmed, or 0 while commands are in flight (nothing to compare).
    ``session``: the client's command session, so that a node seeing the
    client at a new address can tell a moved process from a new one."""
    return pack([VERSION, FrameType.PING, client_id, cookie, token, digest, session])


def encode_pong(token: int, known: bool, cookie: bytes, cancels: list[list[Any]], digest: int = 0) -> bytes:
    """``digest``: the node's subs_digest of the client's subscriptions, when
    the PING carried one; 0 otherwise."""
    return pack([VERSION, FrameType.PONG, token, known, cookie, cancels, digest])


def encode_cancel(topic: str, key: str | None, reason: str) -> bytes:
    return pack([VERSION, FrameType.CANCEL, topic, key, reason])


def encode_redirect(node_id: str, cmap: list[Any]) -> bytes:
    """A newer cluster map (its wire form, client/clustermap.py) from member ``node_id``: sent
    to a client whose PUB or SUB reached a member that is not its partition's primary, and
    as the answer to MAP."""
    return pack([VERSION, FrameType.REDIRECT, node_id, cmap])


def encode_map_request(client_id: bytes, cookie: bytes) -> bytes:
    """Ask for the cluster map (when WELCOME announced one by ``map_epoch`` but had no room for it)."""
    return pack([VERSION, FrameType.MAP, client_id, cookie])


def encode_bye(client_id: bytes, cookie: bytes, session: int) -> bytes:
    """A client that closes cleanly says so, so that its node drops its subscriptions at once
    instead of after ``subscriber_timeout`` of silence. Not answered: a lost BYE is a time-out."""
    return pack([VERSION, FrameType.BYE, client_id, cookie, session])


#: The longest ERROR text, the decoder's limit: an encoder cuts a longer one (it may quote
#: what the sender sent, a 1 KB filter) rather than send what the client must refuse.
MAX_ERROR_TEXT = 1024


def encode_error(code: ErrorCode, text: str) -> bytes:
    if len(text) > MAX_ERROR_TEXT:
        text = text[: MAX_ERROR_TEXT - 3] + "..."
    return pack([VERSION, FrameType.ERROR, int(code), text])


def encode_status(client_id: bytes, cookie: bytes) -> bytes:
    return pack([VERSION, FrameType.STATUS, client_id, cookie])


def encode_status_reply(status: dict[str, Any]) -> bytes:
    """Never raises: a value msgpack cannot carry (an int out of its range, a type it does not
    know) is replaced by a string saying so, and the reply lists where under ``unencodable``,
    because an operator's STATUS must not be what ends a node."""
    try:
        return pack([VERSION, FrameType.STATUS_REPLY, status])
    except (OverflowError, TypeError, ValueError):
        where: list[str] = []
        clean = _encodable(status, "", where)
        clean["unencodable"] = where[:32]
        return pack([VERSION, FrameType.STATUS_REPLY, clean])


def _encodable(v: Any, path: str, where: list[str]) -> Any:
    """``v`` with what msgpack cannot pack replaced by a string that says what it was (``where``
    collects the paths)."""
    if v is None or v.__class__ in (bool, float, str, bytes):
        return v
    if v.__class__ is int:
        if -(1 << 63) <= v < 1 << 64:
            return v
        where.append(path)
        return f"unencodable: an integer of {v.bit_length()} bits"
    if isinstance(v, dict):
        return {k if k.__class__ is str else str(k): _encodable(x, f"{path}.{k}", where) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_encodable(x, f"{path}[{i}]", where) for i, x in enumerate(v)]
    where.append(path)
    return f"unencodable: a {type(v).__name__}"


# ---------------------------------------------------------------- validation


_valid_topics: dict[str, None] = {}


def check_topic(topic: Any) -> str:
    """Topic rule: str, 1..255 UTF-8 bytes, no whitespace (memoised: hot path)."""
    if topic.__class__ is str and topic in _valid_topics:
        return topic  # type: ignore[no-any-return]
    if not isinstance(topic, str) or not topic:
        raise WireError(ErrorCode.BAD_TOPIC, "topic must be a non-empty string")
    if len(topic) > 63 and len(topic.encode()) > MAX_TOPIC_BYTES:
        raise WireError(ErrorCode.BAD_TOPIC, f"topic longer than {MAX_TOPIC_BYTES} bytes")
    if WHITESPACE.search(topic):
        raise WireError(ErrorCode.BAD_TOPIC, "topic contains whitespace")
    if "*" in topic or ">" in topic:
        raise WireError(ErrorCode.BAD_TOPIC, f"'*' and '>' are wildcards, for subscriptions only: topic {topic!r}")
    if len(_valid_topics) >= 65536:
        _valid_topics.clear()
    _valid_topics[topic] = None
    return topic


def check_filter(text: Any) -> str:
    """What a subscription names: a topic, or a filter with wildcards, a queue group or
    a query (client/subjects.py). Refused with ``bad_topic`` and the reason."""
    if text.__class__ is str and text in _valid_topics:
        return text  # type: ignore[no-any-return]
    if text.__class__ is not str or subjects.is_plain(text):
        return check_topic(text)
    try:
        return subjects.parse_filter_untrusted(text).text
    except subjects.FilterError as exc:
        raise WireError(ErrorCode.BAD_TOPIC, f"topic filter: {exc}") from None


def check_key(key: Any) -> str | None:
    if key is None:
        return None
    if not isinstance(key, str) or not key or len(key.encode()) > MAX_KEY_BYTES:
        raise WireError(ErrorCode.BAD_KEY, f"key must be null or a string of 1..{MAX_KEY_BYTES} bytes")
    return key


def check_tags(tags: Any) -> dict[str, str] | None:
    if tags is None:
        return None
    if not isinstance(tags, dict) or len(tags) > MAX_TAGS:
        raise WireError(ErrorCode.BAD_TAGS, f"tags must be null or a map of at most {MAX_TAGS} entries")
    for k, v in tags.items():
        if not (isinstance(k, str) and isinstance(v, str)):
            raise WireError(ErrorCode.BAD_TAGS, "tag names and values must be strings")
        if len(k) > MAX_TAG_BYTES or len(v) > MAX_TAG_BYTES:
            raise WireError(ErrorCode.BAD_TAGS, f"tag names and values are at most {MAX_TAG_BYTES} chars")
    return tags


def check_message(m: Any) -> tuple[Any, ...]:
    """A message is [topic, key, tags, payload], plus [producer id, seq] when
    delivered reliably; returns it as a tuple."""
    if (m.__class__ is not list and m.__class__ is not tuple) or (len(m) != 4 and len(m) != 6):
        raise WireError(ErrorCode.MALFORMED, "a message is [topic, key, tags, payload(, producer, seq)]")
    if len(m) == 6:
        _bytes(m[4], ID_LEN, "producer id")
        _seq(m[5], "producer seq")
    topic, key, tags, payload = m[0], m[1], m[2], m[3]
    check_topic(topic)
    if key is not None:
        check_key(key)
    if tags is not None:
        check_tags(tags)
    if payload.__class__ is not bytes:
        raise WireError(ErrorCode.MALFORMED, "payload must be bytes")
    return tuple(m)


def check_delivered(m: Any) -> tuple[Any, ...]:
    """A message in MSGS: as ``check_message``, or with the queue-group marks a node adds
    (``mark_delivery``) as a last element: 5 elements (fire) or 7 (reliable)."""
    n = len(m) if m.__class__ is list or m.__class__ is tuple else 0
    if n != 5 and n != 7:
        return check_message(m)
    marks = m[-1]
    if (marks.__class__ is not list and marks.__class__ is not tuple) or not 0 < len(marks) <= MAX_MARKS:
        raise WireError(ErrorCode.MALFORMED, f"queue marks must be an array of 1..{MAX_MARKS} mark ids")
    for mk in marks:
        if mk.__class__ is not bytes or len(mk) != MARK_LEN:
            raise WireError(ErrorCode.MALFORMED, f"a queue mark is a mark id of {MARK_LEN} bytes")
    return (*check_message(m[:-1]), list(marks))  # (a list whichever msgpack made: decoding._AS_TUPLES)


def _bytes(v: Any, n: int, what: str) -> bytes:
    if not isinstance(v, bytes) or len(v) != n:
        raise WireError(ErrorCode.MALFORMED, f"{what} must be {n} bytes")
    return v


def _uint(v: Any, what: str) -> int:
    if v.__class__ is not int or v < 0 or v >= 2**64:
        raise WireError(ErrorCode.MALFORMED, f"{what} must be an unsigned 64-bit integer")
    return v  # type: ignore[no-any-return]


#: Every sequence on the wire (a producer's, a stream's, a durable offset) is below this: a
#: node adds to them and keeps counters of their differences, which must stay in msgpack's
#: signed range (a STATUS reply carries those counters) whatever a sender claims.
SEQ_LIMIT = 1 << 63


def _seq(v: Any, what: str) -> int:
    """A sequence number, offset or counter from the wire: an int in 0 .. 2**63 - 1."""
    if v.__class__ is not int or v < 0 or v >= SEQ_LIMIT:
        raise WireError(ErrorCode.MALFORMED, f"{what} must be an integer in 0..2**63-1")
    return v  # type: ignore[no-any-return]


def _str(v: Any, what: str, limit: int = 255) -> str:
    if not isinstance(v, str) or len(v) > limit:
        raise WireError(ErrorCode.MALFORMED, f"{what} must be a string of at most {limit} chars")
    return v


def _list(v: Any, what: str) -> list[Any]:
    if v.__class__ is not list:
        raise WireError(ErrorCode.MALFORMED, f"{what} must be an array")
    return v  # type: ignore[no-any-return]


def _cmd(c: Any) -> tuple[int, str, str | None, int]:
    if c.__class__ is not list or len(c) != 4:
        raise WireError(ErrorCode.MALFORMED, "a command is [op, topic, key, mode]")
    op, topic, key, mode = c
    if op not in (0, 1, 2) or op.__class__ is not int:
        raise WireError(ErrorCode.MALFORMED, "op must be 0 (unsub), 1 (sub) or 2 (sync)")
    if mode not in (0, 1) or mode.__class__ is not int:
        raise WireError(ErrorCode.BAD_MODE, "mode must be 0 (fire) or 1 (reliable)")
    if topic.__class__ is not str or not topic or len(topic) > subjects.MAX_FILTER_BYTES:
        raise WireError(
            ErrorCode.BAD_TOPIC, f"a command's topic filter is a string of 1..{subjects.MAX_FILTER_BYTES} bytes"
        )
    # (its grammar is checked where a subscription is made, check_filter: after the budgets
    # that may refuse it, since parsing a kilobyte of query costs ~100 us and a stranger may
    # send thousands; a bad one gets bad_topic in its CMDACK slot)
    return op, topic, check_key(key), mode


def _node_id(v: Any, what: str) -> str:
    """Node ids are config names (1..64 chars): a longer or empty one is not from a node."""
    if v.__class__ is not str or not v or len(v) > MAX_NODE_ID:
        raise WireError(ErrorCode.MALFORMED, f"{what} must be a string of 1..{MAX_NODE_ID} chars")
    return v  # type: ignore[no-any-return]


def _ip(v: Any, what: str) -> str:
    """Nodes advertise IP literals: a host name would make the client resolve
    whatever a datagram told it to, and a failover target must be reachable as is."""
    if v.__class__ is not str or len(v) > 64:
        raise WireError(ErrorCode.MALFORMED, f"{what} must be an IP address")
    try:
        ipaddress.ip_address(v)
    except ValueError:
        raise WireError(ErrorCode.MALFORMED, f"{what} must be an IP address") from None
    return v  # type: ignore[no-any-return]


def _port(v: Any, what: str) -> int:
    if v.__class__ is not int or not 0 < v < 65536:
        raise WireError(ErrorCode.MALFORMED, f"{what} must be 1..65535")
    return v  # type: ignore[no-any-return]
