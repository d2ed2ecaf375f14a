"""The three client shells (trio, asyncio, plain threads) over real sockets, against a node process.

Each runs the same 10-message reliable exchange, request/reply and the same error cases, so the
API has one shape whichever loop a user has."""

from __future__ import annotations

import asyncio
import inspect
import os
import subprocess
import sys
import threading
import time
from decimal import Decimal
from pathlib import Path
from typing import Any, cast

import pytest
import trio
import trio.testing

import roost
import roost.asyncio
import roost.sync
import roost.trio
from roost.client import addresses
from roost.client.aio import AsyncioShell
from roost.client.api import REPLY_TO, Request
from roost.client.library import TrioShell
from roost.client.session import ClientConfig
from roost.client.wire import WireError
from tests.clusterkit import ROOT, Node

N = 10
FAST = ClientConfig(node_timeout=0.5)


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    n = Node(tmp_path_factory.mktemp("clients"))
    yield n
    n.stop()


def check_exchange(got: list[roost.Message], topic: str) -> None:
    assert [m.payload for m in got] == [f"m{i}".encode() for i in range(N)]
    assert [m.sequence for m in got] == list(range(1, N + 1))
    assert all(m.topic == topic and m.key == "k" and m.tags == {"n": str(i)} for i, m in enumerate(got))


# ------------------------------------------------------------ the same exchange from each shell


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
async def test_trio_exchange(node, host):
    where = f"{host}:{node.port}"
    async with roost.Client(where) as sub_c, roost.Client(where) as pub_c:
        assert sub_c.node == ("127.0.0.1", node.port)  # (resolved once, at connect)
        async with sub_c.subscribe(f"x.trio.{host}") as sub:
            for i in range(N):
                await pub_c.publish(f"x.trio.{host}", f"m{i}", key="k", tags={"n": str(i)})
            got = []
            with trio.fail_after(10):
                async for m in sub:
                    got.append(m)
                    if len(got) == N:
                        break
    check_exchange(got, f"x.trio.{host}")
    assert got[0].reply_to is None and not isinstance(got[0], Request)
    with pytest.raises(ValueError, match="asks for no answer"):
        got[0].respond("nobody asked")


async def test_payload_types_and_a_bad_mode_are_refused_before_anything_is_queued(node):
    """A payload is bytes, a str (its UTF-8) or a bytearray/memoryview (copied); anything else
    is a TypeError before it is queued (packed as it was, the node refused the whole PUB and a
    reliable publish was resent for ever, stalling every later one). An unknown mode is a
    ValueError. The good publishes after the refused ones all arrive, in order."""
    async with roost.Client(f"127.0.0.1:{node.port}") as c:
        async with c.subscribe("x.payloads") as sub:
            for bad in (123, None, 1.5, ["x"]):
                with pytest.raises(TypeError, match="payload must be bytes or str"):
                    await c.publish("x.payloads", bad)  # type: ignore[arg-type]
            with pytest.raises(ValueError, match="mode must be one of"):
                await c.publish("x.payloads", b"x", mode="durable-ish")
            for mode in ("fire", "reliable"):  # (fire: ClientAPI.publish's own path for a plain message)
                for bad in (123, None):
                    with pytest.raises(TypeError, match="payload must be bytes or str"):
                        await c.publish("x.payloads", bad, mode=mode)  # type: ignore[arg-type]
                for topic, why in (("", "non-empty"), ("x y", "whitespace"), ("x.*", "wildcards"), (5, "non-empty")):
                    with pytest.raises(WireError, match=why):
                        await c.publish(topic, b"x", mode=mode)  # type: ignore[arg-type]
            assert c.router.last_seq == 0 and not c.router.first.pub.fire_unsent  # (nothing queued)
            for p in (b"a", "b", bytearray(b"c"), memoryview(b"d")):
                await c.publish("x.payloads", p)
            assert await c.flush(timeout=5)
            with trio.fail_after(10):
                got = [(await sub.next()).payload for _ in range(4)]
    assert got == [b"a", b"b", b"c", b"d"] and all(g.__class__ is bytes for g in got)


async def test_async_for_follows_a_yield_every_changed_after_the_client_was_made(node):
    """``Subscription.__anext__``'s own path for a queued message reads ``yield_every`` from the
    config each time, as ``next`` and ``publish`` do: set to 1 on a running client, every
    message taken lets the I/O loop run (the checkpoint resets the count)."""
    async with roost.Client(f"127.0.0.1:{node.port}") as c:
        async with c.subscribe("x.yields") as sub:
            for i in range(5):
                await c.publish("x.yields", b"%d" % i)
            with trio.fail_after(10):
                while sub.session.recv.buffered < 5:  # (bounded by the fail_after)
                    await trio.sleep(0.01)
                c.config.yield_every = 1
                got = []
                async for m in sub:
                    assert c._since_yield == 0
                    got.append(m.payload)
                    if len(got) == 5:
                        break
    assert got == [b"0", b"1", b"2", b"3", b"4"]


BAD_TIMEOUTS: tuple[Any, ...] = ("1", -1, -0.5, float("nan"), True, [1], 10**400, Decimal("1"))


async def test_a_bad_timeout_is_refused_by_every_call_before_it_changes_anything(node):
    """A timeout is None (no limit) or a number of seconds; anything else is a ValueError that
    says what came, from every call that takes one, before it publishes, asks or subscribes (a
    publish that would not have waited ignored it before; 10**400 was queued, then overflowed).
    0 means "do not wait" where the call can finish without an answer (publish and put without
    wait, flush, next); where it needs one (publish and put with wait, status, request,
    subscribe, get, read, commit) 0 is refused too, and status, which asks once, refuses None."""
    async with roost.Client(f"127.0.0.1:{node.port}") as c:
        before = await c.status()
        for bad in BAD_TIMEOUTS:
            now = [
                c.publish("x.t", b"p", timeout=bad),
                c.publish("x.t", b"p", mode="fire", wait=True, timeout=bad),
                c.flush(bad),
                c.put("x.t", b"p", timeout=bad),
            ]
            asking = [
                c.publish("x.t", b"p", wait=True, timeout=bad),
                c.put("x.t", b"p", wait=True, timeout=bad),
                c.request("x.t", b"q", timeout=bad),
                c.get("x.t", "d", timeout=bad),
                c.read("x.t", timeout=bad),
                c.commit("x.t", "d", timeout=bad),
                c.subscribe("x.t").start(bad),
            ]
            for calls, allowed in ((now, "None or a number of seconds >= 0"),
                                   (asking, "None or a number of seconds > 0"),
                                   ([c.status(bad)], "a number of seconds > 0")):  # fmt: skip
                for call in calls:
                    with pytest.raises(ValueError) as e:
                        await call
                    assert str(e.value) == f"timeout must be {allowed}, not {bad!r}"
        zero = [
            c.publish("x.t", b"p", wait=True, timeout=0),
            c.put("x.t", b"p", wait=True, timeout=0),
            c.status(0),
            c.request("x.t", b"q", timeout=0),
            c.get("x.t", "d", timeout=0),
            c.read("x.t", timeout=0),
            c.commit("x.t", "d", timeout=0),
            c.subscribe("x.t").start(0),
        ]
        for call in zero:
            with pytest.raises(ValueError, match=r"a number of seconds > 0, not 0$"):
                await call
        with pytest.raises(ValueError, match=r"^timeout must be a number of seconds > 0, not None$"):
            await c.status(None)  # type: ignore[arg-type]  # (asked once: only its timeout ends the wait)
        assert c.router.last_seq == 0 and c.session.subs == {}  # (nothing published or asked for)
        assert c.session.last_status is before  # (no STATUS asked: it would have been reset)
        assert await c.flush(None) and await c.flush(0)  # (nothing in flight)
        async with c.subscribe("x.t") as sub:
            for bad in BAD_TIMEOUTS:
                with pytest.raises(ValueError, match="timeout must be None or a number of seconds >= 0"):
                    await sub.next(bad)
            with pytest.raises(TimeoutError, match=r"no message on 'x\.t' within 0 s"):
                await sub.next(0)
            assert await c.publish("x.t", b"one", timeout=0) == 1  # (room in the window: 0 is enough)
            with trio.fail_after(10):
                assert (await sub.next()).payload == b"one"
    for bad in (*BAD_TIMEOUTS, 0):
        with pytest.raises(ValueError, match="timeout must be None or a number of seconds > 0"):
            roost.sync.Client(f"127.0.0.1:{node.port}", timeout=bad)
    with roost.sync.Client(f"127.0.0.1:{node.port}") as s:  # (its calls are the async client's)
        with pytest.raises(ValueError, match="seconds >= 0, not -1"):
            s.publish("x.t", b"p", timeout=-1)
        with pytest.raises(ValueError, match="seconds > 0, not 0"):
            s.status(0)
        assert s.aclient.router.last_seq == 0


async def test_a_durable_call_without_a_cluster_map_ends_at_its_own_timeout(node):
    """A durable call waits for the cluster map, and its timeout bounds that wait, counted from
    the call (before, it waited ``node_timeout`` whatever its timeout, and get/read/commit
    counted theirs after it). A single node welcomes a client without announcing a map, so
    each call raises NodeLost (no partitioned cluster) at once, whatever its timeout; a commit
    with nothing read needs no map. Where the node announced a map that has not come yet
    (planted here: a large cluster's map comes after its WELCOME), each call ends at its
    timeout as when no answer came in time: put raises TimeoutError (also with 0, "do not
    wait"), get returns nothing, read raises NodeLost, commit returns False. With no shorter
    timeout that wait ends at ``node_timeout``, in NodeLost."""
    no_map = r"^no cluster map from the node: durable topics need a partitioned cluster$"
    async with roost.Client(f"127.0.0.1:{node.port}", config=ClientConfig(node_timeout=60)) as c:
        with trio.fail_after(5):  # (the waits before: 60 s, then 30 s, a call)
            for timeout in (30, 0):
                with pytest.raises(roost.NodeLost, match=no_map):
                    await c.put("x.d", b"p", timeout=timeout)
            with pytest.raises(roost.NodeLost, match=no_map):
                await c.get("x.d", "d", timeout=30)
            with pytest.raises(roost.NodeLost, match=no_map):
                await c.read("x.d", timeout=30)
            assert await c.commit("x.d", "d", timeout=30) is True  # (nothing read: nothing to commit)
        c.router.first.announced = 7  # (the WELCOME announced a map, not here yet)
        c._durable.core.read_to[("default", "d", "x.d")] = 5  # (as if a get had read up to 5)
        with trio.fail_after(20):
            for t in (0.2, 0):
                with pytest.raises(TimeoutError, match=rf"^no cluster map from the node within {t} s: not put$"):
                    await c.put("x.d", b"p", timeout=t)
            assert await c.get("x.d", "d", timeout=0.2) == []
            with pytest.raises(roost.NodeLost, match=r"^no cluster map from the node within 0.2 s: nothing read"):
                await c.read("x.d", timeout=0.2)
            assert await c.commit("x.d", "d", timeout=0.2) is False
        assert c.router.cmap is None and c.router.putter.streams == {}  # (nothing put)
    async with roost.Client(f"127.0.0.1:{node.port}") as c:  # (node_timeout 1.5 s)
        c.router.first.announced = 7
        with trio.fail_after(20), pytest.raises(roost.NodeLost, match=rf"{no_map}|^node lost before its cluster map"):
            await c.put("x.d", b"p", timeout=30)  # (on a loaded machine the node may also fall silent meanwhile)


def test_asyncio_exchange(node):
    async def main() -> list[roost.Message]:
        async with roost.asyncio.Client(node.addr) as sub_c, roost.asyncio.Client(node.addr) as pub_c:
            async with sub_c.subscribe("x.asyncio") as sub:
                for i in range(N):
                    await pub_c.publish("x.asyncio", f"m{i}", key="k", tags={"n": str(i)})
                got = []
                async with asyncio.timeout(10):
                    async for m in sub:
                        got.append(m)
                        if len(got) == N:
                            break
                return got

    check_exchange(asyncio.run(main()), "x.asyncio")


def test_threads_exchange(node):
    with roost.sync.Client(node.addr) as sub_c, roost.sync.Client(node.addr) as pub_c:
        with sub_c.subscribe("x.sync") as sub:
            sender = threading.Thread(target=lambda: [
                pub_c.publish("x.sync", f"m{i}", key="k", tags={"n": str(i)}) for i in range(N)])  # fmt: skip
            sender.start()
            got = [sub.next(timeout=10) for _ in range(N)]
            sender.join()
            with pytest.raises(TimeoutError):
                sub.next(timeout=0.2)  # (nothing more came)
        assert pub_c.flush(5)
    check_exchange(got, "x.sync")
    with pytest.raises(roost.sync.ClientClosed):
        pub_c.publish("x.sync", "after close")


def test_threads_iteration_ends_with_the_subscription(node):
    with roost.sync.Client(node.addr) as c:
        sub = c.subscribe("x.ends")
        sub.start()
        c.publish("x.ends", "one", wait=True)
        first = next(iter(sub))
        sub.unsubscribe()
        assert first.payload == b"one" and list(sub) == [] and sub.reason == "unsubscribed" and sub.error is None


# ------------------------------------------------------------ batches (next_batch, batches) from each shell


async def test_trio_batches_take_what_is_queued_in_order(node):
    async with roost.Client(node.addr) as sub_c, roost.Client(node.addr) as pub_c:
        async with sub_c.subscribe("x.batch.trio") as sub:
            for i in range(300):
                await pub_c.publish("x.batch.trio", b"%d" % i, key="k" if i == 150 else None)
            assert await pub_c.flush(10)
            got: list[list[roost.Message]] = []
            with trio.fail_after(10):
                async for batch in sub.batches(max_count=100):
                    got.append(batch)
                    if sum(map(len, got)) == 300:
                        break
            with pytest.raises(ValueError, match="max_count must be an integer of at least 1"):
                await sub.next_batch(0)
            with pytest.raises(TimeoutError):
                await sub.next_batch(timeout=0.1)
            assert sub.session.recv.buffered == 0  # (every message taken is counted as taken)
    flat = [m for b in got for m in b]
    assert [m.payload for m in flat] == [b"%d" % i for i in range(300)]
    assert [m.sequence for m in flat] == list(range(1, 301)) and flat[150].key == "k"
    assert all(1 <= len(b) <= 100 for b in got) and len(got) >= 3


async def test_a_yield_after_every_message_still_delivers(node):
    """yield_every = 1: next() yields before each message and then takes it (it used to yield
    again and again, for ever)."""
    async with roost.Client(node.addr, config=ClientConfig(yield_every=1)) as c:
        async with c.subscribe("x.yield1") as sub:
            for i in range(3):
                await c.publish("x.yield1", b"%d" % i)
            with trio.fail_after(10):
                got = [await sub.next(), *(await sub.next_batch(2))]
                while len(got) < 3:
                    got += await sub.next_batch(2)
            with pytest.raises(ValueError, match="max_count must be an integer"):
                await sub.next_batch(2.5)  # type: ignore[arg-type]
    assert [m.payload for m in got] == [b"0", b"1", b"2"]


def test_asyncio_next_batch(node):
    async def main() -> list[roost.Message]:
        async with roost.asyncio.Client(node.addr) as sub_c, roost.asyncio.Client(node.addr) as pub_c:
            async with sub_c.subscribe("x.batch.asyncio") as sub:
                for i in range(N):
                    await pub_c.publish("x.batch.asyncio", f"m{i}", key="k", tags={"n": str(i)})
                got: list[roost.Message] = []
                async with asyncio.timeout(10):
                    while len(got) < N:
                        got += await sub.next_batch(N)
                return got

    check_exchange(asyncio.run(main()), "x.batch.asyncio")


def test_threads_batches_end_with_the_subscription(node):
    with roost.sync.Client(node.addr) as sub_c, roost.sync.Client(node.addr) as pub_c:
        sub = sub_c.subscribe("x.batch.sync")
        sub.start()
        for i in range(N):
            pub_c.publish("x.batch.sync", f"m{i}", key="k", tags={"n": str(i)})
        assert pub_c.flush(5)
        got = sub.next_batch(timeout=10)
        while len(got) < N:
            got += sub.next_batch(timeout=10)
        sub.unsubscribe()
        assert list(sub.batches()) == [] and sub.reason == "unsubscribed"
    check_exchange(got, "x.batch.sync")


# ------------------------------------------------------------ request/reply from each shell


async def test_trio_request_reply(node):
    async with roost.Client(node.addr) as server, roost.Client(node.addr) as client:
        async with server.subscribe("svc.trio") as sub, trio.open_nursery() as nursery:

            async def serve() -> None:
                async for m in sub:
                    assert isinstance(m, Request) and m.reply_to.startswith("_INBOX.")
                    await m.respond(m.payload.upper(), tags={"by": "trio"})

            nursery.start_soon(serve)
            with trio.fail_after(10):
                answers = [await client.request("svc.trio", f"q{i}", timeout=5) for i in range(3)]
            nursery.cancel_scope.cancel()
        assert [a.payload for a in answers] == [b"Q0", b"Q1", b"Q2"]
        assert answers[0].tags is not None and answers[0].tags["by"] == "trio" and REPLY_TO not in answers[0].tags
        with pytest.raises(TimeoutError, match="no reply"):
            await client.request("svc.nobody", "hello?", timeout=0.3)


def test_asyncio_request_reply_with_a_callback(node):
    async def main() -> list[bytes]:
        async with roost.asyncio.Client(node.addr) as server, roost.asyncio.Client(node.addr) as client:

            async def answer(m: roost.Message) -> None:
                assert isinstance(m, Request)
                await m.respond(m.payload[::-1])

            async with server.subscribe("svc.asyncio", callback=answer):
                got = await asyncio.gather(*(client.request("svc.asyncio", f"ab{i}", timeout=5) for i in range(3)))
            with pytest.raises(TimeoutError):
                await client.request("svc.nobody", "hello?", timeout=0.3)
            return [m.payload for m in got]

    assert asyncio.run(main()) == [b"0ba", b"1ba", b"2ba"]


def test_threads_request_reply_with_a_callback(node):
    calls = []
    with roost.sync.Client(node.addr) as server, roost.sync.Client(node.addr) as client:

        def answer(m: roost.Message) -> None:
            calls.append(threading.current_thread().name)
            assert isinstance(m, Request)
            m.respond(b"re: " + m.payload)  # (blocking: returns once sent)

        with server.subscribe("svc.sync", callback=answer):
            assert client.request("svc.sync", "hi", timeout=5).payload == b"re: hi"
        assert server.callback_errors == 0
    assert calls and calls[0] != threading.main_thread().name


def test_a_callback_that_raises_is_counted_and_the_subscription_goes_on(node):
    seen = []

    def flaky(m: roost.Message) -> None:
        seen.append(m.payload)
        if m.payload == b"bad":
            raise RuntimeError("boom")

    with roost.sync.Client(node.addr) as c:
        with c.subscribe("x.flaky", callback=flaky):
            for p in ("bad", "good"):
                c.publish("x.flaky", p, wait=True)
            deadline = time.monotonic() + 10
            while len(seen) < 2 and time.monotonic() < deadline:  # (bounded polling: a real process)
                time.sleep(0.01)
        assert seen == [b"bad", b"good"] and c.callback_errors == 1
        assert str(c.last_callback_error) == "boom"


# ------------------------------------------------------------ addresses


async def test_a_list_of_nodes_is_tried_in_turn(node):
    dead = f"127.0.0.1:{node.port + 1 if node.port < 65535 else node.port - 1}"
    async with roost.Client(f"{dead},{node.addr}", config=FAST) as c:
        assert c.session.node == ("127.0.0.1", node.port) and c.session.failovers == 1
        await c.publish("x.list", "ok", wait=True)


async def test_roost_nodes_sets_the_default(node, monkeypatch):
    monkeypatch.setenv("ROOST_NODES", f"localhost:{node.port}")
    async with roost.Client() as c:
        assert c.node == ("127.0.0.1", node.port)
        await c.publish("x.env", "ok", wait=True)


async def test_a_name_that_does_not_resolve_is_a_clear_error():
    with pytest.raises(roost.NodeLost, match=r"cannot resolve no-such-host\.invalid:7400"):
        async with roost.Client("no-such-host.invalid:7400"):
            pytest.fail("connected to a name that does not resolve")


def test_ipv6_literal(tmp_path):
    n = Node(tmp_path, host="::1")
    try:
        with roost.sync.Client(f"[::1]:{n.port}") as c, c.subscribe("x.v6") as sub:
            assert c.session.node == ("::1", n.port)
            c.publish("x.v6", "over v6")
            assert sub.next(timeout=10).payload == b"over v6"
    finally:
        n.stop()


@pytest.mark.parametrize(("text", "want"), [
    ("h:1", [("h", 1)]), ("h", [("h", 7400)]), ("[::1]:9", [("::1", 9)]), ("::1", [("::1", 7400)]),
    ("[::1]", [("::1", 7400)]), ("a:1, b:2,a:1", [("a", 1), ("b", 2)]), (("h", 5), [("h", 5)]),
    ("[0:0:0:0:0:0:0:1]:9", [("::1", 9)]), ("0::1", [("::1", 7400)]), (("0:0::1", 9), [("::1", 9)]),
    (["a:1", ("b", 2)], [("a", 1), ("b", 2)]),
])  # fmt: skip
def test_parse_nodes(text, want):
    assert addresses.parse_nodes(text) == want


@pytest.mark.parametrize(("text", "why"), [
    ("h:0", "valid port"), ("h:x", "valid port"), (":7", "no valid host"), ("[::1", "not \\[IPV6\\]:PORT"),
    ("1:2:x", "not an IPv6"), ("h:70000", "valid port"), ("", "empty"), (",", "empty"),
    (("127.0.0.1", 70000), "valid port"), (("h", 0), "valid port"), (("bad host", 1), "valid host"),
    (("1:2:x", 5), "not an IPv6"), (("h", True), "HOST:PORT or \\(host, port\\)"),
])  # fmt: skip
def test_bad_node_addresses_are_refused(text, why):
    with pytest.raises(ValueError, match=why):
        addresses.parse_nodes(text)


def test_roost_nodes_default_and_fallback():
    assert addresses.parse_nodes(None, env={"ROOST_NODES": "a:1,b:2"}) == [("a", 1), ("b", 2)]
    assert addresses.parse_nodes(None, env={}) == addresses.parse_nodes(None, env={"ROOST_NODES": ""})
    assert addresses.parse_nodes(None, env={}) == [("127.0.0.1", 7400)]
    with pytest.raises(ValueError, match=r"^ROOST_NODES: 'a:x' has no valid port"):
        addresses.parse_nodes(None, env={"ROOST_NODES": "a:x"})


def test_resolution_order_puts_ipv4_first():
    import socket

    v6 = (socket.AF_INET6, socket.SOCK_DGRAM, 17, "", ("::1", 7400, 0, 0))
    v4 = (socket.AF_INET, socket.SOCK_DGRAM, 17, "", ("127.0.0.1", 7400))
    assert addresses.ordered([v6, v4, v4]) == [("127.0.0.1", 7400), ("::1", 7400)]


# ------------------------------------------------------------ the README's examples


@pytest.mark.parametrize("example", ["trio_client.py", "asyncio_client.py", "threads_client.py"])
def test_readme_examples_run(node, example, tmp_path):
    code = (Path(ROOT) / "examples" / example).read_text()
    body = code.split('"""', 2)[2].strip()  # (the README shows the code without the docstring)
    assert body in (Path(ROOT) / "README.md").read_text(), f"README.md does not show examples/{example} as it is"
    r = subprocess.run([sys.executable, str(Path(ROOT) / "examples" / example)], cwd=tmp_path, capture_output=True,
                       text=True, timeout=60, env={**os.environ, "ROOST_NODES": f"localhost:{node.port}"})  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"greetings hello {i}" for i in range(3)] + ["tea time"]


class RenamedShell(TrioShell):
    """The trio shell with a resolver whose answers the test changes (the OS's getaddrinfo
    cannot be told that a name moved)."""

    where: dict[str, tuple[str, int]] = {}

    async def resolve(self, host, port):
        return [(2, 2, 17, "", self.where[host])]


class Renamed(roost.Client):
    """The trio client on that shell."""

    _shell_class = RenamedShell


async def test_a_name_is_resolved_again_when_its_node_goes_silent(node, tmp_path):
    moved = Node(tmp_path)
    RenamedShell.where = {"svc": ("127.0.0.1", moved.port)}
    try:
        async with Renamed("svc:1") as c, c.subscribe("x.moved") as sub:
            assert c.session.node == ("127.0.0.1", moved.port)
            RenamedShell.where["svc"] = ("127.0.0.1", node.port)  # (the name now means the other node...)
            moved.stop()  # (...and the first is gone)
            with trio.fail_after(15):
                await c.publish("x.moved", "after the move", wait=True)
                assert (await sub.next()).payload == b"after the move"
            assert c.session.node == ("127.0.0.1", node.port) and not c.session.lost
    finally:
        moved.stop()


# ------------------------------------------------------------ what the cold review found


async def test_a_request_whose_reply_topic_is_unusable_is_a_plain_message(node):
    async with roost.Client(node.addr) as c, c.subscribe("x.evil") as sub:
        for bad in ("", "has space", "tab\there"):
            await c.publish("x.evil", "evil", tags={REPLY_TO: bad, "roost.request": "1"})
        with trio.fail_after(10):
            got = [await sub.next() for _ in range(3)]
        assert not any(isinstance(m, Request) for m in got) and all(m.reply_to is None for m in got)


def test_threads_next_with_short_timeouts_loses_nothing(node):
    """A time-out that ends a wait must not drop a message the loop took meanwhile: the reader
    here often waits (the publisher waits for each PUBACK) and times out (how often depends on
    the machine's load)."""
    n = 2000
    with roost.sync.Client(node.addr) as c, roost.sync.Client(node.addr) as pub, c.subscribe("x.short") as sub:
        sender = threading.Thread(target=lambda: [pub.publish("x.short", str(i), wait=True) for i in range(n)])
        sender.start()
        got, timeouts, deadline = [], 0, time.monotonic() + 60
        while len(got) < n and time.monotonic() < deadline:
            try:
                got.append(sub.next(timeout=0.0003))
            except TimeoutError:
                timeouts += 1
        sender.join()
    assert [int(m.payload) for m in got] == list(range(n))  # (a thread-side time-out lost some: 9 of 2,000)


def test_threads_calls_under_way_end_when_another_thread_closes(node):
    c = roost.sync.Client(node.addr, timeout=None)
    c.connect()
    errors: list[BaseException] = []

    def publish_for_ever() -> None:
        try:
            for i in range(10_000_000):
                c.publish("x.closing", str(i))
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=publish_for_ever)
    t.start()
    deadline = time.monotonic() + 30
    while c.aclient.router.last_seq < 500 and time.monotonic() < deadline:  # (the publisher is under way)
        time.sleep(0.001)
    c.close(flush=False)
    t.join(10)
    assert not t.is_alive() and len(errors) == 1 and isinstance(errors[0], roost.sync.ClientClosed)


async def test_trio_calls_after_close_are_refused(node):
    async with roost.Client(node.addr) as c:
        assert c.session.connected
    with pytest.raises(roost.ClientClosed):
        await c.publish("x.after", "late")
    with pytest.raises(roost.ClientClosed):
        await c.subscribe("x.after").start()


def test_asyncio_calls_after_close_are_refused(node):
    async def main() -> None:
        async with roost.asyncio.Client(node.addr) as c:
            assert c.session.connected
        with pytest.raises(roost.asyncio.ClientClosed):
            await c.publish("x.after", "late")
        with pytest.raises(roost.asyncio.ClientClosed):
            await c.request("x.after", "late")

    asyncio.run(main())


async def test_trio_waiters_hear_when_the_io_breaks(node):
    seen = []
    async with roost.Client(node.addr) as c, c.subscribe("x.broken") as sub:
        await c.subscribe("x.broken.cb", callback=seen.append).start()
        for i in range(10):  # (unacknowledged when the socket breaks: leaving the block must still end cleanly)
            await c.publish("x.broken.other", str(i))
        c._conn.socks[id(c.session)].close()  # (the socket breaks under the I/O task)
        c._kick()
        with trio.fail_after(10), pytest.raises(roost.ClientClosed, match="I/O failed"):
            await sub.next()
        assert not await c.flush(1)
    assert c._conn.closed and seen == []


def test_asyncio_waiters_hear_when_the_io_breaks(node):
    async def main() -> None:
        async with roost.asyncio.Client(node.addr) as c, c.subscribe("x.broken") as sub:
            await c.subscribe("x.broken.cb", callback=print).start()
            for i in range(10):
                await c.publish("x.broken.other", str(i))
            c.loop.remove_reader(c._conn.socks[id(c.session)])
            c._conn.socks[id(c.session)].close()
            c._kick()
            async with asyncio.timeout(10):
                with pytest.raises(roost.asyncio.ClientClosed, match="I/O failed"):
                    await sub.next()
        assert cast(AsyncioShell, c._shell).tasks == set()  # (the callback's task ended quietly)

    asyncio.run(main())


async def test_trio_closing_wakes_tasks_waiting_outside_the_block(node):
    got: list[BaseException] = []

    async def wait_on(sub: roost.Subscription) -> None:
        try:
            await sub.next()
        except roost.ClientClosed as exc:
            got.append(exc)

    async with trio.open_nursery() as nursery:
        async with roost.Client(node.addr) as c:
            sub = c.subscribe("x.waiting")
            await sub.start()
            nursery.start_soon(wait_on, sub)
            await trio.testing.wait_all_tasks_blocked()
        with trio.fail_after(5):
            while not got:
                await trio.sleep(0)
    assert len(got) == 1 and isinstance(got[0], roost.ClientClosed)


async def test_a_full_publish_window_ends_with_node_lost(tmp_path):
    gone = Node(tmp_path)
    try:
        async with roost.Client(gone.addr, config=ClientConfig(pub_window=4, node_timeout=0.5)) as c:
            gone.stop()
            with trio.fail_after(10), pytest.raises(roost.NodeLost, match="not published"):
                for i in range(5):  # (the fifth waits for room that never comes)
                    await c.publish("x.full", str(i))
            assert c.router.lost
    finally:
        gone.stop()


class _Leave(Exception):
    """Raised to leave a client's ``async with`` without its flush (which waits ``node_timeout``)."""


async def test_publish_timeouts_say_which_wait_ran_out(tmp_path):
    """``timeout`` bounds publish's two waits, each with its own error: for room in a full
    window (not published), and with ``wait=True`` for the acknowledgement (queued, retried)."""
    gone = Node(tmp_path)
    try:
        with pytest.raises(_Leave):  # (leaving by an exception skips the flush: it would wait node_timeout)
            async with roost.Client(gone.addr, config=ClientConfig(pub_window=2, node_timeout=30)) as c:
                gone.stop()
                with trio.fail_after(10):
                    with pytest.raises(TimeoutError, match=r"not acknowledged within 0\.2 s"):
                        await c.publish("x.slow", "one", wait=True, timeout=0.2)
                    assert c.router.last_seq == 1 and c.router.acked == 0  # (queued, not acknowledged)
                    await c.publish("x.slow", "two")
                    with pytest.raises(TimeoutError, match=r"no room in the publish window within 0\.2 s"):
                        await c.publish("x.slow", "three", timeout=0.2)
                    assert c.router.last_seq == 2  # (the third was not published)
                raise _Leave
    finally:
        gone.stop()


def test_the_three_clients_have_the_same_api():
    def public(cls: object) -> set[str]:
        return {n for n in dir(cls) if not n.startswith("_")}

    trio_c, aio_c, sync_c = roost.Client, roost.asyncio.Client, roost.sync.Client
    made = [cls("127.0.0.1:1") for cls in (trio_c, aio_c, sync_c)]  # (not connected: their attributes too)
    assert public(made[1]) - public(made[0]) == {"loop"} and public(made[0]) - public(made[1]) == set()
    assert public(made[0]) - public(made[2]) == {"aclose"}  # (close instead, and connect)
    assert public(made[2]) - public(made[0]) == {"close", "connect", "aclient", "timeout"}
    for name in public(trio_c) - {"aclose", "router", "session"}:
        a, b = getattr(trio_c, name), getattr(sync_c, name)
        if callable(a):
            pa = [p for p in inspect.signature(a).parameters if p != "self"]
            pb = [p for p in inspect.signature(b).parameters if p != "self"]
            assert pa == pb, name
    sub_t, sub_a, sub_s = (public(c.subscribe("t")) for c in made)
    assert sub_t == sub_a and sub_s - sub_t == {"asub"}
    assert sub_t - sub_s == {"begin", "confirmation", "state", "session"}  # (the steps of start, on the loop)
    assert set(roost.trio.__all__) == set(roost.asyncio.__all__) == set(roost.sync.__all__)


def test_threads_connect_is_once_per_client(node):
    c = roost.sync.Client(node.addr)
    with c:
        with pytest.raises(roost.sync.ClientClosed, match="once per client"):
            c.connect()
    with pytest.raises(roost.sync.ClientClosed, match="once per client \\(this one is closed\\)"):
        c.connect()
