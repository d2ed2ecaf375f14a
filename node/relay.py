"""Fire batches a node relays whole, framed into datagrams: consecutive ones merged.

node/producers.py relays a fire publisher's datagram to a fire subscriber without packing its
messages again: a PUB's array of messages as its publisher sent it, or a PUBRUN's topic and
payloads packed once for every subscriber (docs/protocol.md, "Runs"). Each is a *body* and its
message count in ``ClientState.fire_whole``, with its *head*: empty for a PUB's array (framed
as a fire MSGS), the packed topic for a run (framed as a MSGSRUN). A body ends with a msgpack
array. At the flush, consecutive bodies of the same head that fit one datagram together go out
as one: the head once, then their arrays' items under one array header. So many small batches
(many publishers, each sending a few messages) do not cost a datagram each, as the messages a
subscriber is given one at a time do not (``Delivery._emit``).
"""

from __future__ import annotations

from collections.abc import Callable

from roost.client import wire

#: A batch relayed whole: its body, its number of messages, its head (see the module).
Whole = tuple[bytes, int, bytes]


def _items(body: bytes, at: int) -> bytes:
    """The items of the msgpack array at ``at`` in ``body``, its header (1, 3 or 5 bytes: a
    fixarray, an array 16, an array 32; a node only relays arrays it decoded) left out."""
    b = body[at]
    return body[at + (1 if b < 0xDC else 3 if b == 0xDC else 5) :]


def datagrams(whole: list[Whole], budget: int, number: Callable[[], int]) -> list[bytes]:
    """The datagrams of a subscriber's batches relayed whole, in order: consecutive ones of the
    same head merged while their bodies add up to at most ``budget`` (a datagram's room after
    a MSGS's longest header), each numbered by ``number()`` as a fire datagram is."""
    out: list[bytes] = []
    i, n = 0, len(whole)
    while i < n:
        body, count, head = whole[i]
        h = len(head)
        j, size = i + 1, len(body)
        while j < n and whole[j][2] == head and size + len(whole[j][0]) - h <= budget:
            size += len(whole[j][0]) - h
            count += whole[j][1]
            j += 1
        frame = wire.msgsrun_header(number()) if head else wire.msgs_header(0, number())
        if j == i + 1:
            out.append(frame + body)
        else:
            out.append(b"".join((frame, head, wire.array_header(count), *(_items(b, h) for b, _, _ in whole[i:j]))))
        i = j
    return out
