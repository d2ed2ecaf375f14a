"""The invariants every fuzz target checks, from the cores' real structures (not a copy of their
logic): counters in range, STATUS encodable, what a core sends decodable, and the broker core's
bookkeeping agreeing with itself (index and registers, admission counts, mailboxes, the digest).

Each check raises AssertionError saying what broke; the drivers add the trace of the frames
that led there.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from roost.client import decoding, wire
from roost.client.wire import FrameType, WireError
from roost.cluster.peerwire import check_entries_untrusted, check_forwarded_untrusted, check_relay_untrusted
from roost.node import versions
from roost.node.core import BrokerCore, Confirm, Forward, Log, Relay, Replicate, Send, StatusQuery
from roost.node.logs import event_line
from roost.node.registers import _key_hash, _mix
from sim.check import budget_drift

LIMIT = 1 << 63  # a counter must stay below it: msgpack packs it signed or not, and sums of two stay exact


def counters_in_range(metrics: Mapping[str, Any], where: str = "metrics") -> None:
    bad = {k: v for k, v in metrics.items() if v.__class__ is not int or not 0 <= v < LIMIT}
    assert not bad, f"{where} out of 0..2**63-1: {bad}"


def status_encodes(status: dict[str, Any]) -> dict[str, Any]:
    """``wire.encode_status_reply`` packs it without its fallback, and it decodes again."""
    f = decoding.decode_untrusted_frame(wire.encode_status_reply(status))
    assert f[0] is FrameType.STATUS_REPLY
    assert "unencodable" not in f[1], f"STATUS needed its fallback: {f[1]['unencodable']}"
    return f[1]  # type: ignore[no-any-return]


def decodes(data: bytes, max_datagram: int) -> tuple[Any, ...] | None:
    """A datagram a node sends: a binary frame ``decode_untrusted_frame`` takes (returned), or a
    text line (MSG, ERR; None), and never over ``max_datagram``. A text ERR is cut to three times
    the line it answers, so a one-byte line gets b"ERR" alone."""
    assert len(data) <= max_datagram, f"a datagram of {len(data)} bytes, over max_datagram {max_datagram}"
    if data[:4] == b"MSG " or data[:3] == b"ERR":
        return None
    try:
        return decoding.decode_untrusted_frame(data, 65536)
    except WireError as exc:
        raise AssertionError(f"the node sent a frame its own decoder refuses ({exc.text}): {data[:80]!r}") from None


def broker_actions(actions: Iterable[Any], max_datagram: int, relayed: bool = False) -> list[tuple[Any, Send]]:
    """Check every action a broker core returned; returns the decoded Sends (frame or None, Send).
    What it replicates, forwards and relays must pass the peer decoders the other members run.
    ``relayed``: Sends may be what a peer's RELAY carried (sent as they came: not checked)."""
    out = []
    for a in actions:
        cls = a.__class__
        if cls is Send or cls is Confirm:
            out.append((None if relayed else decodes(a.data, max_datagram), a))
        elif cls is Log:
            event_line(a.event, a.fields)
        elif cls is Replicate:
            check_entries_untrusted(wire_form(a.entries))
        elif cls is Forward:
            check_forwarded_untrusted(wire_form(a.msgs))
        elif cls is Relay:
            check_relay_untrusted(wire_form(a.sends))
        elif cls is StatusQuery:
            status_encodes(a.status)
    return out


def wire_form(v: Any) -> Any:
    """``v`` as a peer receives it: packed and unpacked (tuples become lists)."""
    import msgpack

    return msgpack.unpackb(msgpack.packb(v, use_bin_type=True), raw=False)


def broker_consistent(core: BrokerCore) -> None:
    """The broker core's structures agree with each other."""
    counters_in_range(core.metrics)
    index = core.index
    held: dict[tuple[str, str | None, Any], int] = {}
    for topic, keys in index.topics.items():
        assert index.names.get(topic) == topic, f"index.names lacks {topic!r}"
        for k, subs in keys.items():
            assert subs, f"an empty level left in the index: {topic!r} {k!r}"
            held.update(((topic, k, w), m) for w, m in subs.items())
    assert set(index.names) == set(index.topics), "index.names and index.topics differ"
    for text, fs in index.filters.items():
        assert fs.filter.text == text, f"filter {text!r} is stored as {fs.filter.text!r}"
        assert fs.keys, f"an empty filter left in the index: {text!r}"
        for k, subs in fs.keys.items():
            assert subs, f"an empty level left in the index: {text!r} {k!r}"
            held.update(((text, k, w), m) for w, m in subs.items())
            if fs.filter.queue is not None:
                assert index.groups.get(fs.marks[k]) == (fs, k), f"queue group {text!r} {k!r} lost its mark"
    assert index.count == len(held), f"index.count {index.count}, index holds {len(held)}"
    own = core.own
    want: dict[tuple[str, str | None, Any], int] = {}
    text_live = 0
    for who, c in core.clients.items():
        assert c.cid == who
        live = reliable = 0
        for (t, k), v in c.subs.items():
            if v & versions.PRESENT:
                live += 1
                reliable += v & versions.RELIABLE
                if own is None or own.owned[own.partition(t)]:
                    want[(t, k, who)] = v & versions.RELIABLE
            else:
                assert core.replicating, f"a tombstone on a single node: {who!r} {t!r}"
        assert c.live == live, f"client {who!r}: live {c.live}, registers present {live}"
        if who.__class__ is not bytes:
            text_live += live
            assert c.mailbox is None and c.counted is None
        elif reliable:
            assert c.mailbox is not None, f"client {who!r}: {reliable} reliable subscriptions and no mailbox"
        else:  # (partitioned: the registers of a partition the map took away go, the mailbox may stay)
            assert c.mailbox is None or own is not None, f"client {who!r}: a mailbox and no reliable subscription"
        if c.mailbox is not None:
            mailbox_consistent(c.mailbox)
    assert held == want, f"index and registers differ: {_diff(held, want)}"
    assert core.text_subs == text_live, f"text_subs {core.text_subs}, text registers present {text_live}"
    hosts = Counter(st.host for st in core.producers.values())
    clients = Counter(c.counted for c in core.clients.values() if c.counted is not None)
    assert dict(core.client_share.per_host) == dict(clients), \
        f"client records per host {dict(core.client_share.per_host)}, counted {dict(clients)}"  # fmt: skip
    hosts.update(clients)
    assert dict(core.admission.per_host) == dict(hosts), \
        f"admission per host {dict(core.admission.per_host)}, producers and clients {dict(hosts)}"  # fmt: skip
    for pid, st in core.producers.items():
        assert st.acked.__class__ is int and 0 <= st.acked < LIMIT, f"producer {pid!r} acknowledged through {st.acked}"
    drift = budget_drift(core)
    assert not drift, f"budgets: {drift}"
    if core.replicating:
        digest_consistent(core)


def _diff(a: dict[Any, Any], b: dict[Any, Any]) -> str:
    only_a = {k: a[k] for k in a.keys() - b.keys()}
    only_b = {k: b[k] for k in b.keys() - a.keys()}
    other = {k: (a[k], b[k]) for k in a.keys() & b.keys() if a[k] != b[k]}
    return f"index only {only_a}, registers only {only_b}, modes {other}"[:600]


def mailbox_consistent(mb: Any) -> None:
    n = len(mb)
    assert 0 <= mb.base <= len(mb.buf)
    assert mb.acked <= mb.sent <= mb.acked + n, f"mailbox acked {mb.acked} sent {mb.sent} holding {n}"
    assert n <= mb.capacity, f"mailbox holds {n} over its capacity {mb.capacity}"
    assert mb.nbytes == sum(map(len, mb.buf[mb.base :])), "mailbox nbytes differs from what it holds"
    assert mb.inflight == sum(map(len, mb.buf[mb.base : mb.base + mb.sent - mb.acked])), \
        f"mailbox inflight {mb.inflight} differs from the bytes sent and not acknowledged"  # fmt: skip
    assert all(mb.acked < s <= mb.sent for s in mb.sacked), "a SACKed sequence outside acked..sent"


def digest_consistent(core: BrokerCore) -> None:
    """The bucket digests are what the registers hash to (node/registers.py's own functions)."""
    digest = [0] * len(core.digest)
    for who, c in core.clients.items():
        if not c.subs:
            continue
        if core.own is None:
            b, h = _key_hash(who, None)
            digest[b] ^= _mix(h, c.cver)
        for tk, v in c.subs.items():
            b, h = core.registers.bucket(who, tk)
            digest[b] ^= core.registers.share(h, v, c.cver)
    bad = [i for i, (x, y) in enumerate(zip(digest, core.digest, strict=True)) if x != y]
    assert not bad, f"digest buckets {bad[:8]} differ from the registers"
