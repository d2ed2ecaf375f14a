"""Node core and client library through real UDP sockets, in one process."""

from __future__ import annotations

import math
import os
import socket
from collections import Counter

import pytest
import trio
import trio.testing

from roost.client import Client, ClientClosed, ClientConfig, Message, NodeLost, decoding, wire
from roost.client.router import Router
from roost.client.turns import CALLER, LOOP, WAITER
from roost.client.udp import drain, send_all, send_now, send_ready
from roost.client.wire import ErrorCode, FrameType
from tests.polling import eventually

pytestmark = pytest.mark.trio


def addr(node) -> str:
    return f"{node.addr[0]}:{node.addr[1]}"


async def recv(sock, timeout: float = 2.0) -> bytes:
    with trio.fail_after(timeout):
        return await sock.recv(70000)


async def udp():
    s = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
    await s.bind(("127.0.0.1", 0))
    return s


async def test_fastpuss_text_line(node):
    a, b = await udp(), await udp()
    await a.sendto(b"SUB t1\n", node.addr)
    await eventually(lambda: node.core.index.count == 1, what="the node to take the SUB")
    await b.sendto(b"PUB t1\nhello world  ", node.addr)
    assert await recv(a) == b"MSG t1\nhello world  "


async def test_text_error_reply(node):
    a = await udp()
    await a.sendto(b"SUB a-longer-topic-name", node.addr)
    assert await recv(a) == b"ERR malformed SUB needs whitespace after the topic"
    await a.sendto(b"SUB t1", node.addr)  # (a reply within 3x of a text datagram: its source may be forged)
    assert await recv(a) == b"ERR malformed SUB "
    await a.sendto(b"PUB t\n\xc3\x28", node.addr)
    assert (await recv(a)).startswith(b"ERR bad_utf8 ")


async def test_oversized_datagram_is_refused_with_too_large(node):
    a = await udp()
    await a.sendto(b"PUB t\n" + b"x" * 20000, node.addr)
    assert (await recv(a)).startswith(b"ERR too_large")
    await a.sendto(wire.encode_hello(b"c" * 16) + b"\0" * 20000, node.addr)
    f = decoding.decode_untrusted_frame(await recv(a))
    assert f[0] is FrameType.ERROR and f[1] == ErrorCode.TOO_LARGE


async def test_reliable_library_round_trip_in_order(node):
    async with Client(addr(node)) as sub_c, Client(addr(node)) as pub_c:
        async with sub_c.subscribe("orders", mode="reliable") as sub:
            for i in range(3000):
                await pub_c.publish("orders", f"o{i}", tags={"i": str(i)})
            assert await pub_c.flush(5)
            got = []
            with trio.fail_after(10):
                async for m in sub:
                    got.append(m)
                    if len(got) == 3000:
                        break
    assert [m.payload for m in got] == [f"o{i}".encode() for i in range(3000)]
    assert [m.sequence for m in got] == list(range(1, 3001))
    assert got[7].tags == {"i": "7"} and got[7].topic == "orders"


async def test_fire_and_keys(node):
    async with Client(addr(node)) as c:
        async with c.subscribe("actors", key="a1", mode="fire") as sub:
            await c.publish("actors", b"other", key="a2", mode="fire")
            await c.publish("actors", b"mine", key="a1", mode="fire")
            with trio.fail_after(2):
                m = await sub.next()
    assert (m.key, m.payload, m.sequence) == ("a1", b"mine", None)


async def test_publish_wait_returns_after_puback(node):
    async with Client(addr(node)) as c:
        seq = await c.publish("t", b"x", wait=True)
        assert seq == 1 and c.session.acked == 1


@pytest.mark.parametrize("node", [{"mailbox_capacity": 200, "send_window": 100}], indirect=True)
async def test_slow_subscriber_is_cancelled_out_of_capacity(node):
    slow_cfg = ClientConfig(max_buffered=50)  # stops acknowledging once 50 are waiting
    async with Client(addr(node), config=slow_cfg) as slow, Client(addr(node)) as fast, \
            Client(addr(node)) as pub:  # fmt: skip
        async with slow.subscribe("t") as s_slow, fast.subscribe("t") as s_fast:
            got = []
            with trio.fail_after(20):
                for chunk in range(20):  # paced so that a consumer that reads keeps up
                    for i in range(chunk * 50, chunk * 50 + 50):
                        await pub.publish("t", b"%d" % i)
                    assert await pub.flush(5)  # the publisher is never held back
                    while len(got) < chunk * 50 + 50:
                        got.append((await s_fast.next()).payload)
            assert got == [b"%d" % i for i in range(1000)]
            await eventually(lambda: s_slow.reason is not None, what="the slow subscription to end")
            assert s_slow.error == "out_of_capacity"


@pytest.mark.parametrize("node", [{"retransmit_timeout": 0.01, "retransmit_max": 0.02}], indirect=True)
async def test_async_for_past_a_full_buffer_takes_every_message_in_order(node):
    """``async for`` over a subscription whose buffer fills (``max_buffered``): what comes past
    it is not acknowledged and comes again, and every message taken frees its room
    (``Receiver.buffered`` stays the queue's length), so all arrive, in order, once."""
    async with Client(addr(node), config=ClientConfig(max_buffered=10)) as sub_c, Client(addr(node)) as pub:
        async with sub_c.subscribe("t") as sub:
            for i in range(300):
                await pub.publish("t", b"%d" % i)
            recv_side, queue, got, counts = sub.session.recv, sub.state.queue, [], set()
            with trio.fail_after(20):
                async for m in sub:
                    got.append(m.payload)
                    counts.add(recv_side.buffered - len(queue))
                    if len(got) == 300:
                        break
            assert got == [b"%d" % i for i in range(300)] and counts == {0}


async def test_async_for_and_batches_give_the_same_messages_with_their_sequences(node):
    """``async for`` (``__anext__``, with ``SubState.take`` written out) and ``batches()`` over
    the same mixed stream: plain messages (queued as their payload, the sequence beside it),
    keyed and tagged ones (queued as tuples) come as the same Messages, in order, on the
    subscription's topic, each with its own consecutive sequence."""

    def sent(i: int) -> tuple[str | None, dict[str, str] | None]:
        return ("k" if i % 7 == 3 else None), ({"n": str(i)} if i % 11 == 5 else None)

    async with Client(addr(node)) as a, Client(addr(node)) as b, Client(addr(node)) as pub:
        async with a.subscribe("t") as sub_a, b.subscribe("t") as sub_b:
            for i in range(300):
                await pub.publish("t", b"%d" % i, *sent(i))
            iterated: list[Message] = []
            batched: list[Message] = []
            payloads_beside = 0
            with trio.fail_after(20):
                async for m in sub_a:
                    iterated.append(m)
                    payloads_beside = max(payloads_beside, len(sub_a.state.seqs))
                    if len(iterated) == 300:
                        break
                async for batch in sub_b.batches(max_count=64):
                    batched += batch
                    if len(batched) == 300:
                        break
    assert payloads_beside > 0  # (the plain messages were queued as payloads)
    for got in (iterated, batched):
        assert [(m.topic, m.key, m.tags, m.payload) for m in got] == [("t", *sent(i), b"%d" % i) for i in range(300)]
        seqs = [m.sequence or 0 for m in got]
        assert seqs == list(range(seqs[0], seqs[0] + 300)) and seqs[0] > 0


async def test_unsubscribe_ends_iteration_without_error(node):
    async with Client(addr(node)) as c:
        sub = c.subscribe("t")
        await sub.start()
        await sub.unsubscribe()
        with pytest.raises(StopAsyncIteration):
            await sub.next()
        assert sub.reason == "unsubscribed" and sub.error is None
        await c.flush(2)
    assert node.core.index.count == 0


async def test_node_lost_when_the_node_goes_away():
    from roost.node.config import NodeConfig
    from roost.node.logs import EventLog
    from roost.node.server import NodeServer

    server = NodeServer(NodeConfig(client_addr=("127.0.0.1", 0)), EventLog("gone", "warning"))
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)
        cfg = ClientConfig(node_timeout=0.5)
        async with Client(f"127.0.0.1:{server.addr[1]}", config=cfg) as c:
            async with c.subscribe("t") as sub:
                nursery.cancel_scope.cancel()  # the node stops answering
                with trio.fail_after(3):
                    with pytest.raises(StopAsyncIteration):
                        await sub.next()
                assert sub.error == "node_lost"


async def test_connecting_to_nothing_raises_node_lost():
    s = await udp()
    port = s.getsockname()[1]
    s.close()
    with trio.fail_after(5), pytest.raises(NodeLost):
        async with Client(f"127.0.0.1:{port}", config=ClientConfig(node_timeout=0.3)):
            raise AssertionError("connected to a port nobody listens on")


async def test_a_client_cannot_subscribe_another_address(node):
    victim, attacker = await udp(), await udp()
    vid = os.urandom(16)
    await victim.sendto(wire.encode_hello(vid), node.addr)
    cookie = decoding.decode_untrusted_frame(await recv(victim))[2]
    # The attacker learned the victim's id and cookie, but sends from its own address.
    await attacker.sendto(wire.encode_cmds(vid, cookie, 1, 1, [(1, "t", None, 0)]), node.addr)
    f = decoding.decode_untrusted_frame(await recv(attacker))
    assert f[0] is FrameType.ERROR and f[1] == ErrorCode.BAD_COOKIE
    assert node.core.index.count == 0 and node.core.clients == {}
    # Nothing published reaches either socket: the node handles datagrams in
    # order, so an answer to a later request is the next datagram each gets.
    p = await udp()
    await p.sendto(b"PUB t\nsecret", node.addr)
    await victim.sendto(wire.encode_ping(vid, cookie, 1), node.addr)
    assert decoding.decode_untrusted_frame(await recv(victim))[0] is FrameType.PONG
    await attacker.sendto(wire.encode_hello(os.urandom(16)), node.addr)
    assert decoding.decode_untrusted_frame(await recv(attacker))[0] is FrameType.WELCOME


def client_addr(c: Client) -> tuple[str, int]:
    return ("127.0.0.1", c._conn.socks[id(c.session)].getsockname()[1])


async def test_odd_frames_from_the_node_address_do_not_stop_the_client(node):
    """Whoever can send from the node's address (a spoofer) gets the client to
    ignore what it cannot use, or to recover from what it can."""
    bad = [
        wire.pack([1, FrameType.WELCOME, "n1", b"k" * 16, {}, [["n9", "127.0.0.1", 70000]]]),
        wire.pack([1, FrameType.WELCOME, "n1", b"k" * 16, {}, [["n9", "evil.example", 7400]]]),
        wire.pack([1, FrameType.WELCOME, "n1", b"k" * 16, {}, [["n9", "127.0.0.1\x00", 7400]]]),
        wire.pack([1, FrameType.WELCOME, "", b"k" * 16, {}, []]),
        wire.pack([1, FrameType.WELCOME, "n1", b"k" * 16, {}, [["n9", "127.0.0.1", 1]] * 65]),
        wire.pack([1, FrameType.WELCOME, "n1", b"k" * 16, [], []]),
        wire.pack([1, FrameType.WELCOME, "n1"]),
        b"", b"\xc1", b"\x91", b"\x92\x01\x63", b"MSG t\nhello", b"\xff" * 300,
    ]  # fmt: skip
    odd_but_valid = [
        # a WELCOME with a cookie the node never issued and odd parameters
        wire.encode_welcome("spoof", b"s" * 16, {"max_datagram": 10**9, "ping_interval": -1.0}, []),
        wire.encode_cmdack(1, 1, [0]),  # not our session
        wire.encode_puback(b"x" * 16, 10**9),  # not our producer
        wire.pack([1, FrameType.ERROR, 2**40, "x" * 1000]),  # an error code nobody defined
        wire.encode_status_reply({"node": ["?"]}),
    ]
    async with Client(addr(node)) as c, Client(addr(node)) as pub:
        async with c.subscribe("t") as sub:
            for d in bad + odd_but_valid:
                node.sock.sendto(d, client_addr(c))
            with trio.fail_after(5):
                await c._until(lambda: c.session.bad_datagrams >= len(bad))
            assert c.session.bad_datagrams == len(bad)
            assert c.session.candidates == [c.node]  # nothing was added to the cluster map
            with trio.fail_after(5):
                await pub.publish("t", b"still here", wait=True)
                assert (await sub.next()).payload == b"still here"
                async with c.subscribe("u", mode="fire") as later:
                    assert later.active
        assert c.session_errors == 0 and c.session.connected


class _BuggyRouter:
    """The client's router with a bug that a datagram can reach: a STATUS reply that says
    "boom" raises as it is fed (everything else is the real router's)."""

    def __init__(self, *args, **kwargs) -> None:
        self.real = Router(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.real, name)

    def handle_datagrams(self, s, batch, now) -> None:
        for data, _ in batch:
            f = decoding.decode_untrusted_frame(data)
            if f[0] is FrameType.STATUS_REPLY and "boom" in f[1]:
                raise RuntimeError("boom")
        self.real.handle_datagrams(s, batch, now)


async def test_a_datagram_the_session_fails_on_does_not_stop_the_client(node):
    async with Client(addr(node), router=_BuggyRouter) as c, Client(addr(node)) as pub:  # type: ignore[arg-type]
        async with c.subscribe("t") as sub:
            node.sock.sendto(wire.encode_status_reply({"boom": 1}), client_addr(c))
            with trio.fail_after(5):
                await c._until(lambda: c.session_errors == 1)
            assert isinstance(c.last_session_error, RuntimeError)
            with trio.fail_after(5):
                await pub.publish("t", b"after", wait=True)
                assert (await sub.next()).payload == b"after"


async def test_unusable_addresses_do_not_stop_the_client(node):
    async with Client(addr(node)) as c:
        bad = [(("127.0.0.1", 70000), b"x"), (("127.0.0.1\x00", 7400), b"x"), (("::1", 7400), b"x"), ((None, 1), b"x")]
        assert send_now(c._conn.socks[id(c.session)], bad) == 4  # type: ignore[arg-type]
        with trio.fail_after(5):
            assert await c.publish("t", b"x", wait=True) == 1


async def test_what_a_node_sends_is_counted_where_it_is_sent(node):
    """datagrams_out and bytes_out are what left the port: a STATUS reply too (it is not a
    broker Send), byte for byte as the client received it."""
    before = dict(node.core.metrics)
    s, cid = await udp(), os.urandom(wire.ID_LEN)
    await s.sendto(wire.encode_hello(cid), node.addr)
    welcome = await recv(s)
    await s.sendto(wire.encode_status(cid, decoding.decode_untrusted_frame(welcome)[2]), node.addr)
    reply = await recv(s)
    assert decoding.decode_untrusted_frame(reply)[0] is FrameType.STATUS_REPLY
    m = node.core.metrics
    assert m["datagrams_out"] - before.get("datagrams_out", 0) == 2
    assert m["bytes_out"] - before.get("bytes_out", 0) == len(welcome) + len(reply)


async def test_send_ready_counts_only_datagrams_that_left_and_keeps_order():
    a, b = socket.socket(socket.AF_INET, socket.SOCK_DGRAM), await udp()
    a.setblocking(False)
    metrics: Counter[str] = Counter()
    to = b.getsockname()
    sends = [(to, b"zero"), (to, b"one"), (("256.0.0.1", 1), b"bad"), (to, b"three")]
    assert send_ready(a, sends, metrics, start=1) == 4  # (from ``start``: what a caller that waited goes on with)
    assert (await recv(b), await recv(b)) == (b"one", b"three")
    assert metrics == Counter(datagrams_out=2, bytes_out=8, send_failed=1)
    a.close()


@pytest.mark.parametrize("node", [{"client_addr": ("0.0.0.0", 0)}], indirect=True)
async def test_a_node_bound_to_a_wildcard_answers_the_launchers_probe(node):
    """``cluster up`` asks each member's own STATUS at its client_addr: for 0.0.0.0 it asks
    loopback, and takes the reply that comes from there."""
    from roost.node.procs import probe_status

    status = await trio.to_thread.run_sync(probe_status, "0.0.0.0", node.addr[1], 2.0)
    assert status is not None and status["node"] == node.cfg.id


def _queued_frames(sock: socket.socket) -> list[FrameType]:
    """The kinds of the datagrams waiting in a node's socket (read, so the node never sees them)."""
    return [decoding.decode_untrusted_frame(d)[0] for d, _ in drain(sock, 70000)]


async def _idle_client(node, send=send_now, **config):
    """A connected client whose I/O loop waits, with the node drained (``send``: its sends)."""
    c = Client(addr(node), config=ClientConfig(**config), send=send)
    await c.__aenter__()
    await trio.testing.wait_all_tasks_blocked()
    return c


#: A node whose clients ping once a minute: no PING lands inside the tests' counts.
QUIET = pytest.mark.parametrize("node", [{"ping_interval": 60.0, "subscriber_timeout": 180.0}], indirect=True)


@QUIET
async def test_a_publish_on_an_idle_path_is_sent_before_publish_returns(node):
    c = await _idle_client(node, idle_gap=1e-9, idle_burst=1)
    try:
        # (no await gives the node a turn between the publishes and the look at its socket)
        assert await c.publish("t.idle", b"fire", mode="fire") == 0
        assert c.session.pub.fire_unsent == 0
        assert _queued_frames(node.sock) == [FrameType.PUBRUN]  # (a fire message of one topic: a run)
        seq = await c.publish("t.idle", b"one")
        assert c.session.pub.unsent_from == seq + 1 and _queued_frames(node.sock) == [FrameType.PUB]
        # A reliable publish in flight (the node has not answered): the next waits for the loop.
        await c.publish("t.idle", b"two")
        assert c.session.pub.unsent_from == seq + 1 and _queued_frames(node.sock) == []
        with trio.fail_after(5):
            await trio.lowlevel.checkpoint()
            while c.session.pub.unsent_from != seq + 2:  # (the loop's turn sends it: the node takes the retry)
                await trio.sleep(0.01)
        assert await c.flush(5)
    finally:
        await c.aclose()


@QUIET
async def test_a_busy_publishers_messages_wait_for_the_loop_and_share_a_datagram(node):
    c = await _idle_client(node, idle_gap=60.0, idle_burst=1)
    try:
        async with c.subscribe("t.busy", mode="fire") as sub:
            await sub.start()
            await trio.testing.wait_all_tasks_blocked()
            c._turns.busy_at = -math.inf  # (quiet for longer than idle_gap: the subscription's turn is forgotten)
            before = node.core.metrics["datagrams_in"]
            for i in range(5):
                await c.publish("t.busy", str(i), mode="fire")
            # The first went at once; the other four came within idle_gap: queued for the loop.
            assert c.session.pub.fire_unsent == 4
            with trio.fail_after(5):
                got = [m.payload for m in [await sub.next() for _ in range(5)]]
            assert got == [b"0", b"1", b"2", b"3", b"4"]
            assert node.core.metrics["datagrams_in"] - before == 2  # (the first alone, the four together)
    finally:
        await c.aclose()


@QUIET
@pytest.mark.parametrize("mode", ["reliable", "fire"])
async def test_a_burst_on_a_quiet_path_is_sent_call_by_call_and_what_follows_waits(node, mode):
    """idle_burst calls after the path went quiet each send their datagram before they return
    (a paced publisher that woke late publishes what is due at once); the next, the path still
    busy, waits for the loop, and a reliable burst's publishes are all in flight at once."""
    c = await _idle_client(node, idle_gap=60.0, idle_burst=3)
    try:
        pub = c.session.pub
        for round_ in range(2):
            await trio.testing.wait_all_tasks_blocked()  # (the loop waits, the node is drained)
            c._turns.busy_at = -math.inf  # (quiet for longer than idle_gap)
            for i in range(3):
                await c.publish("t.burst", f"{round_}.{i}", mode=mode)
                assert (pub.fire_unsent, pub.unsent_from) == (0, pub.next_seq)  # (sent: nothing queued)
            assert _queued_frames(node.sock) == [FrameType.PUBRUN if mode == "fire" else FrameType.PUB] * 3
            await c.publish("t.burst", f"{round_}.3", mode=mode)  # (the burst is spent: the loop sends it)
            assert _queued_frames(node.sock) == []
            queued = (1, pub.next_seq) if mode == "fire" else (0, pub.next_seq - 1)
            assert (pub.fire_unsent, pub.unsent_from) == queued
            assert await c.flush(5)  # (the loop sends it; the three the node missed are resent)
            assert pub.fire_unsent == 0
    finally:
        await c.aclose()


@QUIET
async def test_no_call_makes_a_turn_of_its_own_with_idle_gap_inf(node):
    c = await _idle_client(node, idle_gap=math.inf)
    try:
        for i in range(6):
            await c.publish("t.never", str(i), mode="fire")
            assert c.session.pub.fire_unsent == i + 1  # (queued for the loop's turn)
        assert _queued_frames(node.sock) == []
        assert await c.flush(5)
    finally:
        await c.aclose()


@QUIET
async def test_a_burst_ends_when_its_last_turn_is_idle_gap_old_on_a_busy_path(node):
    """A burst goes on only while each call comes within idle_gap of its last turn: other
    traffic that keeps the path busy does not keep a burst going."""
    c = await _idle_client(node, idle_gap=0.05, idle_burst=4)
    try:
        c._turns.busy_at = -math.inf
        await c.publish("t.spent", b"0", mode="fire")
        assert c.session.pub.fire_unsent == 0 and _queued_frames(node.sock) == [FrameType.PUBRUN]  # (the burst's first)
        c._turns.burst_at -= 1.0  # (its last turn a second ago, ...)
        c._turns.busy_at = trio.current_time()  # (... and the path busy since: a datagram just came)
        await c.publish("t.spent", b"1", mode="fire")
        assert c.session.pub.fire_unsent == 1 and _queued_frames(node.sock) == []  # (for the loop)
    finally:
        await c.aclose()


def _came(c: Client) -> dict[str, int]:
    """How many of ``c``'s turns received datagrams so far, by who made them (client/turns.py)."""
    return dict(c._turns.came)


def _more(before: dict[str, int], after: dict[str, int]) -> set[str]:
    """Who made turns that received datagrams between the two counts."""
    return {who for who, n in after.items() if n > before[who]}


async def _driving(c: Client, sub, timeout: float = 10.0, came: list[dict[str, int]] | None = None):
    """Make ``c``'s path sparse (a wait of idle_gap or more), and return a list and a task
    function that waits in ``sub.next(timeout)`` (driving the socket) and puts what it got
    there, or the exception the wait ended with (and in ``came``, ``_came(c)`` as it got it)."""
    with pytest.raises(TimeoutError):
        await sub.next(timeout=0.01)  # (a wait of idle_gap or more: the next drives the socket)
    got: list[object] = []

    async def waiter() -> None:
        try:
            got.append(await sub.next(timeout=timeout))
            if came is not None:
                came.append(_came(c))
        except Exception as exc:  # (what the wait ended with, for the test to look at)
            got.append(exc)

    return got, waiter


@QUIET
@pytest.mark.parametrize("mode", ["reliable", "fire"])
async def test_a_sparse_wait_takes_its_message_in_the_waiting_task(node, mode):
    """After a wait of idle_gap or more, the task waiting in next() makes the loop's turns
    itself (the loop parked), so the turn that brings its message is its own; then the loop
    waits on the socket again. A wait shorter than idle_gap (a busy path) leaves them to the
    loop's task."""
    c = await _idle_client(node, idle_gap=1e-9)
    p = await _idle_client(node)
    try:
        async with c.subscribe("t.sparse", mode=mode) as sub:
            for i in range(3):
                came: list[dict[str, int]] = []
                got, waiter = await _driving(c, sub, came=came)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(waiter, name="waiter")
                    await trio.testing.wait_all_tasks_blocked()
                    assert c._shell._driver == id(c.session) and c._conn.socks[id(c.session)] is not None
                    before = _came(c)
                    await p.publish("t.sparse", str(i), mode=mode)
                assert [m.payload for m in got] == [str(i).encode()]
                # (the turns that took datagrams until it had its message: the waiter's alone)
                assert _more(before, came[0]) == {WAITER} and c._shell._driver is None
                await eventually(lambda: id(c.session) in c._shell._wait_scopes, what="the loop to wait on its socket")
        c.config.idle_gap = 60.0  # (no wait is as long: every one is left to the loop's task)
        async with c.subscribe("t.busy", mode=mode) as sub:
            got, waiter = await _driving(c, sub)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(waiter, name="waiter")
                await trio.testing.wait_all_tasks_blocked()
                assert c._shell._driver is None
                before = _came(c)
                await p.publish("t.busy", b"x", mode=mode)
            assert [m.payload for m in got] == [b"x"] and _more(before, _came(c)) == {LOOP}
    finally:
        await p.aclose()
        await c.aclose()


@QUIET
async def test_a_driven_messages_ack_leaves_after_its_subscriber_has_it(node):
    """The waiting task's turn that brings its message holds the ACK back; the loop's task,
    woken as the wait ends, sends it at its turn, with no further wait of the subscriber's."""
    order: list[str] = []

    def noted(sock, datagrams):
        order.extend("ACK" for _, d in datagrams if decoding.decode_untrusted_frame(d)[0] is FrameType.ACK)
        return send_now(sock, datagrams)

    c = await _idle_client(node, noted, idle_gap=1e-9)
    p = await _idle_client(node)
    try:
        async with c.subscribe("t.ack", mode="reliable") as sub:
            got, _ = await _driving(c, sub)

            async def waiter() -> None:
                got.append(await sub.next(timeout=10))
                order.append("got")

            async with trio.open_nursery() as nursery:
                nursery.start_soon(waiter, name="waiter")
                await trio.testing.wait_all_tasks_blocked()
                assert c._shell._driver == id(c.session)
                order.clear()
                await p.publish("t.ack", b"one")
            mb = node.core.clients[c.client_id].mailbox
            await eventually(lambda: mb.acked == mb.sent == 1, what="the node to hear the ACK")
            assert order == ["got", "ACK"] and [m.payload for m in got] == [b"one"]
    finally:
        await p.aclose()
        await c.aclose()


@QUIET
async def test_leaving_right_after_a_driven_message_sends_its_held_ack_before_bye(node):
    """The application takes a driven reliable message and leaves the client at once (no
    await between: the loop's task, which would send the held ACK at its turn, gets none):
    the BYE goes with the ACK in front of it."""
    sent: list[FrameType] = []

    def noted(sock, datagrams):  # (the subscriber's sends)
        sent.extend(decoding.decode_untrusted_frame(d)[0] for _, d in datagrams)
        return send_now(sock, datagrams)

    c = await _idle_client(node, noted, idle_gap=1e-9)
    p = await _idle_client(node)
    try:
        sub = c.subscribe("t.bye", mode="reliable")
        await sub.start()
        got, _ = await _driving(c, sub)
        at_bye: list[list[FrameType]] = []

        async def waiter() -> None:
            got.append(await sub.next(timeout=10))
            c._conn.goodbye()  # (what leaving the client does first, with no await before it)
            at_bye.append(list(sent))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter, name="waiter")
            await trio.testing.wait_all_tasks_blocked()
            assert c._shell._driver == id(c.session)
            sent.clear()  # (what it sends from now on)
            await p.publish("t.bye", b"last")
        assert [m.payload for m in got] == [b"last"] and at_bye == [[FrameType.ACK, FrameType.BYE]]
    finally:
        await p.aclose()
        await c.aclose()


@QUIET
async def test_a_condition_that_fails_inside_a_driven_turn_is_the_callers_error(node):
    """The condition a driving task waits on is looked at inside its turn (to hold the ACK):
    its own exception reaches the caller, and the client stays open."""
    c = await _idle_client(node, idle_gap=1e-9)
    p = await _idle_client(node)
    try:
        async with c.subscribe("t.cond", mode="fire") as sub:
            await _driving(c, sub)

            def cond() -> bool:
                if sub.state.queue:
                    raise LookupError("the caller's own")
                return False

            driven: list[bool] = []

            async def publish() -> None:
                await trio.testing.wait_all_tasks_blocked()
                driven.append(c._shell._driver == id(c.session))
                await p.publish("t.cond", b"x")

            async with trio.open_nursery() as nursery:
                nursery.start_soon(publish)
                with pytest.raises(LookupError, match="the caller's own"), trio.fail_after(5):
                    await c._until(cond)
            assert driven == [True] and not c._conn.closed and c._conn.error is None and c._shell._driver is None
            assert (await sub.next(timeout=1)).payload == b"x"
    finally:
        await p.aclose()
        await c.aclose()


@QUIET
async def test_a_driving_wait_that_times_out_gives_the_socket_back(node):
    c = await _idle_client(node, idle_gap=1e-9)
    p = await _idle_client(node)
    try:
        async with c.subscribe("t.back", mode="fire") as sub:
            got, waiter = await _driving(c, sub, timeout=0.2)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(waiter, name="waiter")
                await trio.testing.wait_all_tasks_blocked()
                assert c._shell._driver == id(c.session)
            assert len(got) == 1 and isinstance(got[0], TimeoutError) and c._shell._driver is None
            await eventually(lambda: id(c.session) in c._shell._wait_scopes, what="the loop to wait on its socket")
            c.config.idle_gap = 60.0
            before = _came(c)
            await p.publish("t.back", b"later", mode="fire")
            await eventually(lambda: bool(sub.state.queue), what="the loop's task to queue it")
            assert _more(before, _came(c)) == {LOOP}
            assert (await sub.next(timeout=1)).payload == b"later"
    finally:
        await p.aclose()
        await c.aclose()


@QUIET
async def test_a_publish_while_a_task_drives_the_socket_is_sent_at_once(node):
    """A publish on a quiet path makes its turn in the publishing task while another task
    drives the socket; the turn changed something (it sent), so the driver's wait ends and it
    looks again, as the client's other waiters do; it gets its message back from the node in
    a turn of its own."""
    c = await _idle_client(node, idle_gap=1e-9)
    try:
        async with c.subscribe("t.self", mode="fire") as sub:
            came: list[dict[str, int]] = []
            got, waiter = await _driving(c, sub, came=came)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(waiter, name="waiter")
                await trio.testing.wait_all_tasks_blocked()
                assert c._shell._driver == id(c.session) and id(c.session) in c._shell._wait_scopes
                before = _came(c)
                c._turns.busy_at = -math.inf
                await c.publish("t.self", b"mine", mode="fire")
                assert c.session.pub.fire_unsent == 0  # (sent before publish returned)
                assert id(c.session) not in c._shell._wait_scopes  # (the driver's wait ended: it looks again)
            assert [m.payload for m in got] == [b"mine"] and _more(before, came[0]) == {WAITER}
    finally:
        await c.aclose()


@QUIET
async def test_a_turn_made_by_a_publish_wakes_the_driver_to_what_it_took(node):
    """The publishing task's turn drains a datagram the driving task waits on the socket for:
    the driver's wait ends, and it finds its message queued (else it would wait on an empty
    socket until its next deadline, here a minute away)."""
    c = await _idle_client(node, idle_gap=1e-9, node_timeout=60.0)
    try:
        async with c.subscribe("t.took", mode="fire") as sub:
            got, waiter = await _driving(c, sub)
            with trio.fail_after(5):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(waiter, name="waiter")
                    await trio.testing.wait_all_tasks_blocked()
                    assert c._shell._driver == id(c.session)
                    msgs = wire.encode_msgs(0, 0, [wire.pack_message("t.took", None, None, b"theirs")])
                    node.sock.sendto(msgs, c._conn.socks[id(c.session)].getsockname())  # (as the node would)
                    before = _came(c)
                    c._turns.busy_at = -math.inf
                    await c.publish("t.other", b"mine", mode="fire")
                    assert c.session.pub.fire_unsent == 0 and len(sub.state.queue) == 1  # (its turn took it)
                    assert _more(before, _came(c)) == {CALLER}
                    assert id(c.session) not in c._shell._wait_scopes  # (the driver's wait ended)
            assert [m.payload for m in got] == [b"theirs"]
    finally:
        await c.aclose()


@QUIET
async def test_closing_the_client_ends_a_driving_wait_at_once(node):
    """Leaving the client on an exception (no flush, whose kick would wake the driver anyway)
    ends a driving wait at once: its deadline is a minute away."""
    with trio.fail_after(2):
        async with trio.open_nursery() as nursery:
            c = await _idle_client(node, idle_gap=1e-9, node_timeout=60.0)
            sub = c.subscribe("t.close", mode="fire")
            await sub.start()
            got, waiter = await _driving(c, sub)
            nursery.start_soon(waiter, name="waiter")
            await trio.testing.wait_all_tasks_blocked()
            assert c._shell._driver == id(c.session)
            await c.__aexit__(RuntimeError, RuntimeError("the application failed"), None)
    assert len(got) == 1 and isinstance(got[0], ClientClosed)


@pytest.mark.parametrize("node", [{"ping_interval": 0.1, "subscriber_timeout": 0.5}], indirect=True)
async def test_a_driving_wait_keeps_the_session_alive_with_its_pings(node):
    """A long wait on a sparse path fires the session's timers as the loop would: its PINGs
    keep the subscription alive across several subscriber_timeouts."""
    c = await _idle_client(node, idle_gap=1e-9)
    p = await _idle_client(node)
    try:
        async with c.subscribe("t.alive", mode="reliable") as sub:
            got, waiter = await _driving(c, sub, timeout=1.5)  # (three subscriber_timeouts)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(waiter, name="waiter")
                await trio.testing.wait_all_tasks_blocked()
                assert c._shell._driver == id(c.session)
            assert len(got) == 1 and isinstance(got[0], TimeoutError)
            assert node.core.metrics["clients_timed_out"] == 0
            assert c.session.connected and node.core.index.count == 1
            await p.publish("t.alive", b"still here")
            assert (await sub.next(timeout=5)).payload == b"still here"
    finally:
        await p.aclose()
        await c.aclose()


async def test_send_all_yields_the_cpu_only_after_every_datagram_left():
    a, b = socket.socket(socket.AF_INET, socket.SOCK_DGRAM), socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    a.setblocking(False)
    b.bind(("127.0.0.1", 0))
    b.setblocking(False)
    seen: list[list[bytes]] = []

    def yield_cpu() -> None:  # (what the receiver holds when the sender gives up its core)
        seen.append([d for d, _ in drain(b, 100)])

    to = b.getsockname()
    try:
        await send_all(a, [(to, b"one"), (to, b"two")], Counter(), yield_cpu)
        assert seen == [[b"one", b"two"]]
        await send_all(a, [], Counter(), yield_cpu)  # (nothing sent: the core is not given up)
        assert seen == [[b"one", b"two"]]
    finally:
        a.close()
        b.close()


async def test_a_closed_client_makes_no_turn_of_its_own(node):
    """After aclose (and while it closes), an API call that kicks the I/O makes no turn on the
    socket: the client stays closed, not failed on a closed socket, and sends nothing after BYE."""
    c = await _idle_client(node, idle_gap=0.0)
    await c.publish("t.closed", b"x", mode="fire")
    await trio.testing.wait_all_tasks_blocked()
    await c.aclose()
    assert c._shell._wait_scopes == {}  # (the cancelled I/O loop left no wait behind for a turn to use)
    c._kick()  # (what flush, unsubscribe and status do before they look at the closed state)
    assert await c.flush() is False
    assert c._conn.error is None and c._shell._wait_scopes == {}
    with pytest.raises(ClientClosed, match="the client is closed"):
        await c.publish("t.closed", b"y")
