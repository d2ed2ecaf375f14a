"""What the broker core asks its shell to do: the actions every entry point returns.

The core is sans-IO (docs/architecture.md), so it cannot send, log or talk to peers
itself; it returns these values and the shell (``node/server.py`` or the
cluster member's shell) performs them in order. They are plain named tuples
because a batch of datagrams can produce thousands of sends: no per-action
behaviour, nothing to allocate beyond the tuple.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from roost.node.cookies import Addr


class Send(NamedTuple):
    """One datagram to one address."""

    addr: Addr
    data: bytes


class Log(NamedTuple):
    """One operator-readable event (node/logs.py formats it)."""

    level: str
    event: str
    fields: dict[str, Any]


class Replicate(NamedTuple):
    """Local changes of replicated registers, to be pushed to every peer."""

    entries: list[list[Any]]


class StatusQuery(NamedTuple):
    """A client asked for status: the shell (or member core) answers with
    ``status`` plus whatever it knows beyond this core (the cluster view)."""

    addr: Addr
    status: dict[str, Any]


class Forward(NamedTuple):
    """Partitioned mode: messages whose partition another member is primary of,
    each ``[topic, key, tags, payload, producer id, sequence]`` (producer id and
    sequence None for fire), to be sent over the peer link to that member."""

    member: str
    msgs: list[list[Any]]


class Relay(NamedTuple):
    """Partitioned mode: text-protocol datagrams for clients whose home is another
    member, to be sent from that member's socket (a text client may only hear
    the address it sent to), each ``[host, port, datagram]``."""

    member: str
    sends: list[list[Any]]


class Confirm(NamedTuple):
    """Partitioned mode: a CMDACK that waits until the subscription changes of the
    same entry point are acknowledged by their partitions' owners."""

    addr: Addr
    data: bytes


class DurablePut(NamedTuple):
    """A PUT (docs/durable.md): messages ``[topic, key, tags, payload]`` of one partition,
    producer sequences from ``first``, for the member that keeps the partition's log."""

    addr: Addr
    pid: bytes
    partition: int
    first: int
    floor: int
    msgs: list[list[Any]]


class DurableGet(NamedTuple):
    """A GET: the records of ``topic`` from the cursor of durable subscription (``did``, ``name``)."""

    addr: Addr
    did: bytes
    name: str
    topic: str
    partition: int
    start: int
    start_at: int
    most: int
    read_from: int


class DurableCommit(NamedTuple):
    """A COMMIT: the subscriber took everything of the subscription before ``offset``."""

    addr: Addr
    did: bytes
    name: str
    topic: str
    partition: int
    offset: int


class Trace(NamedTuple):
    """What a core did that a checker must know and no other action shows (FoundationDB's trace
    events): emitted only when the core's configuration says ``trace`` (the simulator's), so the
    shells never see one. ``event`` names it; ``fields`` are its values, as a checker reads them."""

    event: str
    fields: dict[str, Any]


Action = (
    Send | Log | Replicate | StatusQuery | Forward | Relay | Confirm | DurablePut | DurableGet | DurableCommit | Trace
)
