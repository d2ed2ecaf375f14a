"""The monitoring endpoint: its documents from a core driven by hand, then the HTTP server of a
real node in this process, then a real cluster member's /healthz through its start-up."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import socket
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from roost import Client
from roost.client import decoding, wire
from roost.cluster.config import CLUSTER_SETTINGS
from roost.node import monitor, monitorhttp
from roost.node.config import ConfigError, NodeConfig, load_node_config
from roost.node.logs import EventLog
from roost.node.monitorslots import Slots
from roost.node.server import NodeServer
from tests.clusterkit import LocalCluster
from tests.corekit import connect, make_core
from tests.polling import eventually, wait_until

INFO = monitor.Info("n1", "9.9", "single", 1.7e9, 0.0, {"max_datagram": 16384})


def families(text: bytes) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text.decode())}


def sample(fams: dict[str, Any], name: str, **labels: str) -> float:
    (value,) = [s.value for f in fams.values() for s in f.samples
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]  # fmt: skip
    return float(value)


# ------------------------------------------------------------ documents, from a core


def test_varz_counts_traffic_and_messages_and_names_drops():
    core = make_core()
    sub, pub = connect(core, ("127.0.0.1", 5001), ("127.0.0.1", 5002))
    sub.sub("t")
    pub.pub([("t", b"x")] * 3, now=1.0)
    core.handle_datagrams([(b"FOO t\n", ("203.0.113.9", 1))], 1.0)  # (not a text network: dropped)
    v = monitor.varz(core, INFO, 5.0)
    assert (v["server_id"], v["version"], v["uptime_s"]) == ("n1", "9.9", 5.0)
    assert v["in_msgs"] == 3 and v["out_msgs"] == 3 and v["clients"] == 1 and v["subscriptions"] == 1
    assert v["in_datagrams"] == core.metrics["datagrams_in"] > 0 and v["in_bytes"] > v["in_datagrams"]
    assert (v["out_datagrams"], v["out_bytes"]) == (0, 0)  # (counted by the shell that sends: tests/test_udp.py)
    assert v["drops"] == {"dropped_forbidden": 1, "error_forbidden": 1}
    assert v["config"] == {"max_datagram": 16384}


def test_settings_shown_never_include_the_secret():
    settings = {s.key: s.default for s in CLUSTER_SETTINGS} | {"secret": "do-not-show-0123456789"}
    shown = monitor.node_settings(NodeConfig(monitor_addr="127.0.0.1:8222"), settings)
    assert "secret" not in shown and "do-not-show" not in json.dumps(shown)
    assert shown["monitor_addr"] == "127.0.0.1:8222" and shown["client_addr"] == "127.0.0.1:7400"
    assert shown["pull_timeout"] == 30.0


def test_connz_pages_clients_in_the_order_they_arrived():
    core = make_core()
    ports = [6004, 6001, 6003, 6000, 6002]  # (arrival order, not address order)
    clients = connect(core, *[("127.0.0.1", p) for p in ports])
    for i, c in enumerate(clients):
        c.sub(f"t{i}", now=float(i))
    page = monitor.connz(core, 10.0, {"offset": "1", "limit": "2", "subs": "1"})
    assert (page["total"], page["offset"], page["count"]) == (5, 1, 2)
    assert [r["addr"] for r in page["connections"]] == ["127.0.0.1:6001", "127.0.0.1:6003"]
    assert page["connections"][0]["subs"] == [["t1", "reliable"]] and page["connections"][0]["age_s"] == 9.0
    assert monitor.connz(core, 10.0, {"offset": "4"})["count"] == 1
    assert monitor.connz(core, 10.0, {"offset": "5"})["connections"] == []
    # a text subscriber is listed while it has a subscription here
    core.handle_datagrams([(b"SUB tx\n", ("127.0.0.1", 7000))], 11.0)
    assert [(r["kind"], r["addr"]) for r in monitor.connz(core, 12.0, {"offset": "5"})["connections"]] == [
        ("text", "127.0.0.1:7000")
    ]
    core.handle_datagrams([(b"UNSUB tx\n", ("127.0.0.1", 7000))], 12.0)
    assert monitor.connz(core, 13.0, {})["total"] == 5
    for bad in ({"limit": "0"}, {"limit": "5000"}, {"offset": "-1"}, {"limit": "x"}, {"offset": str(2**63)}):
        with pytest.raises(monitor.BadQuery):
            monitor.connz(core, 10.0, bad)


def test_subsz_pages_cut_anywhere_agree_with_the_whole_listing():
    """A page is sliced across filters of several keys (skipped by their key counts), so every
    offset and limit must give the same rows as the one page that holds them all."""
    core = make_core()
    (c,) = connect(core, ("127.0.0.1", 6000))
    c.cmds([(1, "a", None, 1), (1, "a", "k1", 0), (1, "a", "k2", 1), (1, "b", None, 1),
            (1, "c.*", "k", 1), (1, "c.*", None, 0), (1, "d.>", None, 1)])  # fmt: skip
    whole = monitor.subsz(core, {"limit": "1024"})["subscriptions"]
    assert [(s["filter"], s["key"]) for s in whole] == [
        ("a", None),
        ("a", "k1"),
        ("a", "k2"),
        ("b", None),
        ("c.*", "k"),
        ("c.*", None),
        ("d.>", None),
    ]
    for offset in range(9):
        for limit in range(1, 9):
            got = monitor.subsz(core, {"offset": str(offset), "limit": str(limit)})
            assert got["subscriptions"] == whole[offset : offset + limit], (offset, limit)
            assert got["total"] == 7


def test_subsz_by_topic_keeps_the_filters_a_message_would_match():
    core = make_core()
    (c,) = connect(core, ("127.0.0.1", 6000))
    c.cmds([(1, "a.b", None, 1), (1, "a.*", None, 0), (1, "a.>", "k", 1), (1, "x.y", None, 1)])
    every = monitor.subsz(core, {})
    assert every["num_subscriptions"] == 4 and every["total"] == 4
    (pub,) = connect(core, ("127.0.0.1", 6001))
    pub.pub([("a.b", b"1"), ("a.b", b"2"), ("a.c", b"3")])
    pub.send(
        wire.encode_pub(
            pub.cid, pub.cookie, pub.pid, pub.seq, pub.seq, True, [wire.pack_message("a.b", "k", None, b"4")]
        ),
        0.0,
    )  # (a keyed message)
    hit = monitor.subsz(core, {"topic": "a.b"})
    assert [(s["filter"], s["key"], s["reliable"], s["matches"]) for s in hit["subscriptions"]] == [
        ("a.*", None, 0, 4),
        ("a.>", "k", 1, 1),
        ("a.b", None, 1, 3),
    ]
    assert [s["filter"] for s in monitor.subsz(core, {"topic": "a.b.c"})["subscriptions"]] == ["a.>"]
    with pytest.raises(monitor.BadQuery, match="wildcards"):
        monitor.subsz(core, {"topic": "a.*"})
    assert core.index.matched == {"a.b": 3}  # (x.y: nothing delivered, no entry)
    c.cmds([(0, "a.b", None, 1)])  # (the bare topic's last subscriber leaves: its count goes with it)
    assert core.index.matched == {}


def test_metrics_parse_and_agree_with_the_core():
    core = make_core()
    sub, pub = connect(core, ("127.0.0.1", 5001), ("127.0.0.1", 5002))
    sub.sub("t")
    pub.pub([("t", b"x")] * 7)
    status = {
        "state": "ready",
        "members": [{"id": "n1", "state": "ready", "queue": 0}, {"id": "n2", "state": "down", "queue": 12}],
        "map": {"epoch": 4},
    }
    fams = families(monitor.metrics(core, INFO, 2.0, status))
    assert sample(fams, "roost_messages_in_total", node="n1") == 7
    assert sample(fams, "roost_events_total", event="datagrams_in") == core.metrics["datagrams_in"]
    assert sample(fams, "roost_subscriptions", node="n1") == 1
    assert sample(fams, "roost_cluster_member_up", member="n2") == 0
    assert sample(fams, "roost_cluster_peer_queue", member="n2") == 12
    assert sample(fams, "roost_cluster_map_epoch") == 4


# ------------------------------------------------------------ the HTTP server of a real node


async def get(url: str, method: str = "GET", data: bytes | None = None) -> tuple[int, str, bytes]:
    def fetch() -> tuple[int, str, bytes]:
        req = urllib.request.Request(url, method=method, data=data)
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.status, r.headers["content-type"], r.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.headers["content-type"], exc.read()

    return await trio.to_thread.run_sync(fetch)


async def raw(port: int, data: bytes) -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(data)
        out = b""
        with trio.move_on_after(5):
            while chunk := await stream.receive_some(65536):
                out += chunk
        return out


@contextlib.asynccontextmanager
async def monitored_node(log: Any = None, **settings: Any) -> AsyncIterator[tuple[NodeServer, str, int]]:
    cfg = NodeConfig(client_addr=("127.0.0.1", 0), monitor_addr="127.0.0.1:0", **settings)
    server = NodeServer(cfg, EventLog("m", "warning", stream=log))
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)
        assert server.listeners
        port = server.listeners[0].socket.getsockname()[1]
        yield server, f"http://127.0.0.1:{port}", port
        nursery.cancel_scope.cancel()


@pytest.fixture
async def monitored() -> Any:
    async with monitored_node() as node:
        yield node


async def test_a_node_serves_every_path_over_http(monitored):
    server, url, _ = monitored
    code, ctype, body = await get(url + "/healthz")
    assert (code, ctype, json.loads(body)) == (200, "application/json", {"state": "ready", "status": "ok"})
    before = json.loads((await get(url + "/varz"))[2])
    assert before["monitor_addr"] == url.removeprefix("http://")  # (port 0 in the config: the one bound)
    assert server.core.status()["monitor"] == before["monitor_addr"]
    async with Client(f"127.0.0.1:{server.addr[1]}") as c, c.subscribe("m.t") as sub:
        for i in range(20):
            await c.publish("m.t", b"%d" % i, wait=True)
        got = []
        async for m in sub:
            got.append(m.payload)
            if len(got) == 20:
                break
        assert got == [b"%d" % i for i in range(20)]
        conns = json.loads((await get(url + "/connz?subs=1"))[2])
        assert conns["total"] == 1 and conns["connections"][0]["subs"] == [["m.t", "reliable"]]
        subs = json.loads((await get(url + "/subsz?topic=m.t"))[2])
        assert [s["filter"] for s in subs["subscriptions"]] == ["m.t"]
    after = json.loads((await get(url + "/varz"))[2])
    assert after["in_msgs"] - before["in_msgs"] == 20 and after["out_msgs"] - before["out_msgs"] == 20
    assert after["in_datagrams"] > before["in_datagrams"] and after["uptime_s"] >= before["uptime_s"]
    assert after["rss_bytes"] > 1 << 20 and after["cpu_seconds"] > 0
    code, ctype, body = await get(url + "/metrics")
    assert code == 200 and ctype.startswith("text/plain")
    assert sample(families(body), "roost_messages_in_total") == after["in_msgs"]
    assert json.loads((await get(url + "/clusterz"))[2])["mode"] == "single"


async def test_bad_requests_get_an_error_and_the_node_carries_on(monitored):
    _, url, port = monitored
    assert (await get(url + "/nope"))[0] == 404
    assert (await get(url + "/varz", method="POST", data=b"x"))[0] == 405
    assert (await get(url + "/connz?limit=0"))[0] == 400
    assert (await get(url + "/connz?offset=99999999999999999999999"))[0] == 400
    assert (await get(url + "/connz?" + "&".join(f"a{i}=1" for i in range(25))))[0] == 400
    assert (await raw(port, b"GARBAGE\r\n\r\n")).startswith(b"HTTP/1.1 400 ")
    assert (await raw(port, b"GET /" + b"x" * 10000 + b" HTTP/1.1\r\nhost: x\r\n\r\n")).startswith(b"HTTP/1.1 431")
    big_header = b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-big: " + b"y" * 20000 + b"\r\n\r\n"  # (in one send)
    assert (await raw(port, big_header)).startswith(b"HTTP/1.1 431 ")
    head = await raw(port, b"HEAD /varz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK") and head.endswith(b"\r\n\r\n")  # (no body)
    # two requests on one connection (keep-alive)
    two = await raw(port, b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\nGET /healthz HTTP/1.1\r\nhost: x\r\n"
                          b"connection: close\r\n\r\n")  # fmt: skip
    assert two.count(b"HTTP/1.1 200 OK") == 2
    assert (await get(url + "/healthz"))[0] == 200


async def closed_by_server(stream: trio.SocketStream, within: float) -> bool:
    """Did the server close ``stream`` (end of file, or a reset) within ``within`` seconds?"""
    with trio.move_on_after(within):
        try:
            while await stream.receive_some(65536):
                pass
        except trio.BrokenResourceError:
            pass
        return True
    return False


# ------------------------------------------------------------ the endpoint's limits, over real sockets

HEALTHZ = b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n"


@contextlib.asynccontextmanager
async def monitor_alone(log: Any = None, **settings: Any) -> AsyncIterator[tuple[monitorhttp.Documents, int]]:
    """The monitoring server alone on this trio loop, over a core driven by hand. Its connection
    figures (``Documents.http``) are read directly: a request to /varz would change them."""
    core = make_core()
    listeners = await monitorhttp.open_listeners(("127.0.0.1", 0))
    docs = monitorhttp.Documents(dataclasses.replace(INFO), lambda: core, lambda: (True, "ready"))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(monitorhttp.serve, listeners, docs, EventLog("m", "warning", stream=log),
                           NodeConfig(**settings))  # fmt: skip
        await eventually(lambda: docs.http() != {}, what="the server to start")
        yield docs, listeners[0].socket.getsockname()[1]
        nursery.cancel_scope.cancel()


async def dial(port: int, source: str = "127.0.0.1") -> trio.SocketStream:
    return await trio.open_tcp_stream("127.0.0.1", port, local_address=source)


async def answer(stream: trio.SocketStream, request: bytes = HEALTHZ, within: float = 5.0) -> bytes:
    """Send ``request`` on ``stream`` and read one answer (a head and its content-length body);
    what came before the server closed, if it did."""
    out = b""
    with trio.move_on_after(within), contextlib.suppress(trio.BrokenResourceError):
        await stream.send_all(request)
        while b"\r\n\r\n" not in out or len(out.partition(b"\r\n\r\n")[2]) < _length(out):
            chunk = await stream.receive_some(65536)
            if not chunk:
                break
            out += chunk
    return out


def _length(response: bytes) -> int:
    for line in response.partition(b"\r\n\r\n")[0].split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.lower() == b"content-length":
            return int(value)
    return 0


def task_count() -> int:
    """Every task of this trio run (a refused connection must leave none behind)."""

    def tasks(task: trio.lowlevel.Task) -> int:
        return 1 + sum(tasks(t) for n in task.child_nurseries for t in n.child_tasks)

    root = trio.lowlevel.current_root_task()
    assert root is not None
    return tasks(root)


@pytest.mark.parametrize("per_host", [None, 32], ids=["one-host-8-per-host", "ten-hosts-global-cap"])
async def test_a_hundred_idle_connections_leave_healthz_answering_every_try_within_100ms(per_host):
    """The acceptance: 100 connections that never send a byte, all open at once, then /healthz
    tried on fresh connections as a container healthcheck does: each answered 200 within 100 ms.
    With the defaults (32 connections, 8 per host) from one address; then from ten addresses with
    no per-host limit short of the cap, so that only the cap's eviction lets the tries in."""
    settings = {} if per_host is None else {"monitor_max_per_host": per_host}
    sources = ["127.0.0.1"] if per_host is None else [f"127.0.0.{i}" for i in range(2, 12)]
    async with monitor_alone(**settings) as (docs, port):
        idle = [await dial(port, sources[i % len(sources)]) for i in range(100)]
        await eventually(lambda: docs.http()["accepted"] == 100, what="the server to take the 100 connections")
        assert docs.http()["connections"] == (8 if per_host is None else 32) and docs.http()["refused"] == 0
        for i in range(20):
            t0 = trio.current_time()
            async with await dial(port) as s:
                got = await answer(s, within=1.0)
            took = trio.current_time() - t0
            assert got.startswith(b"HTTP/1.1 200 ") and took < 0.1, (i, got[:40], took)
        assert docs.http()["evicted"] >= 100 - 32 and docs.http()["refused"] == 0
        closed = [await closed_by_server(s, within=0.5) for s in idle[:50]]  # (the oldest went first)
        assert all(closed)
        for s in idle:
            await s.aclose()


async def test_a_full_endpoint_closes_its_longest_idle_connection_and_refuses_only_when_all_are_busy():
    async with monitor_alone(monitor_max_connections=3, monitor_max_per_host=3) as (docs, port):
        a, b, c = [await dial(port, f"127.0.0.{i}") for i in (2, 3, 4)]
        await eventually(lambda: docs.http()["connections"] == 3, what="three connections")
        await b.send_all(b"GET /healthz HTTP/1.1\r\n")  # (a request under way: b may not give way)
        await eventually(lambda: docs.http()["idle"] == 2, what="b busy")
        d = await dial(port, "127.0.0.5")
        assert await closed_by_server(a, within=2)  # (idle the longest)
        assert (await answer(d)).startswith(b"HTTP/1.1 200 ")  # (d stays open: keep-alive, idle again)
        e = await dial(port, "127.0.0.6")
        assert await closed_by_server(c, within=2)  # (c went idle before d did)
        assert docs.http()["evicted"] == 2
        await d.send_all(b"GET /h")
        await e.send_all(b"G")
        await eventually(lambda: docs.http()["idle"] == 0, what="b, d and e busy")
        before = task_count()
        f = await dial(port, "127.0.0.7")
        refused = await answer(f, b"")  # (every slot has a request under way: refused, and told so)
        assert refused.startswith(b"HTTP/1.1 503 ") and b"busy" in refused and await closed_by_server(f, within=2)
        assert task_count() == before
        assert docs.http() | {"accepted": 0} == {"connections": 3, "idle": 0, "accepted": 0, "refused": 1,
                                                 "evicted": 2, "idle_closed": 0, "request_timeouts": 0,
                                                 "requests": 1, "unauthorized": 0}  # fmt: skip
        await b.send_all(b"host: x\r\n\r\n")  # (b's request completes: answered)
        assert (await answer(b, b"")).startswith(b"HTTP/1.1 200 ")
        for s in (a, b, c, d, e, f):
            await s.aclose()


async def test_a_connection_whose_request_came_with_it_is_not_closed_for_those_behind_it():
    """A health check sends its request as it connects. Connections queued behind it (here made
    without letting the server run, so that all are accepted in one batch, before any of their
    tasks runs) must not push it out: what it sent is read as it is accepted."""
    async with monitor_alone(monitor_max_connections=4, monitor_max_per_host=2) as (docs, port):
        first = socket.create_connection(("127.0.0.1", port))
        first.sendall(HEALTHZ)
        behind = [socket.create_connection(("127.0.0.1", port)) for _ in range(10)]
        first.setblocking(False)
        async with trio.SocketStream(trio.socket.from_stdlib_socket(first)) as s:
            assert (await answer(s, b"")).startswith(b"HTTP/1.1 200 ")
        assert docs.http()["evicted"] == 9
        for b in behind:
            b.close()


async def test_one_source_address_holds_at_most_max_per_host_and_cannot_shut_out_another():
    async with monitor_alone(monitor_max_connections=10, monitor_max_per_host=2) as (docs, port):
        x1, x2 = await dial(port, "127.0.0.2"), await dial(port, "127.0.0.2")
        await eventually(lambda: docs.http()["connections"] == 2, what="two connections")
        x3 = await dial(port, "127.0.0.2")
        assert await closed_by_server(x1, within=2)  # (its own address's idle connection gave way)
        await x2.send_all(b"GET")
        await x3.send_all(b"GET")
        await eventually(lambda: docs.http()["idle"] == 0, what="x2 and x3 busy")
        x4 = await dial(port, "127.0.0.2")
        assert await closed_by_server(x4, within=2)  # (refused: 127.0.0.2 has two requests under way)
        async with await dial(port, "127.0.0.3") as y:
            assert (await answer(y)).startswith(b"HTTP/1.1 200 ")
        assert (docs.http()["refused"], docs.http()["evicted"]) == (1, 1)
        for s in (x1, x2, x3, x4):
            await s.aclose()


async def test_a_request_trickled_a_byte_at_a_time_is_cut_at_request_timeout_from_its_first_byte():
    async with monitor_alone(monitor_request_timeout=1.0, monitor_idle_timeout=30.0) as (docs, port):
        async with await dial(port) as s:  # (a whole request within the limit is answered)
            for i in range(len(HEALTHZ)):
                await s.send_all(HEALTHZ[i : i + 1])
                await trio.sleep(0.3 / len(HEALTHZ))
            assert (await answer(s, b"")).startswith(b"HTTP/1.1 200 ")
        slow = await dial(port)
        endless = b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-pad: " + b"y" * 1000

        async def trickle() -> None:
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                for i in range(len(endless)):  # (a byte every 50 ms: far within idle_timeout)
                    await slow.send_all(endless[i : i + 1])
                    await trio.sleep(0.05)

        async with trio.open_nursery() as nursery:
            t0 = trio.current_time()
            nursery.start_soon(trickle)
            closed = await closed_by_server(slow, within=10)
            took = trio.current_time() - t0
            nursery.cancel_scope.cancel()
        assert closed and 0.9 <= took < 3.0, took
        assert docs.http()["request_timeouts"] == 1
        await slow.aclose()


async def test_an_idle_connection_is_closed_after_idle_timeout_before_and_between_requests():
    log = io.StringIO()
    async with monitor_alone(log, monitor_idle_timeout=0.3, monitor_request_timeout=0.5) as (docs, port):
        stream = await dial(port)
        assert await closed_by_server(stream, within=5)
        await stream.aclose()
        async with await dial(port) as kept:  # (keep-alive: idle again once answered)
            assert (await answer(kept)).startswith(b"HTTP/1.1 200 ")
            assert await closed_by_server(kept, within=5)
        assert docs.http()["idle_closed"] == 2
        # a request whose announced body never comes is not answered (and is no error)
        async with await dial(port) as s:
            assert await answer(s, b"GET /varz HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\n") == b""
        assert docs.http()["request_timeouts"] == 1 and "monitor_error" not in log.getvalue()
        async with await dial(port) as s:  # (a body larger than a request head is refused)
            got = await answer(s, b"GET /varz HTTP/1.1\r\nhost: x\r\ncontent-length: 9000\r\n\r\n" + b"x" * 9000)
            assert got.startswith(b"HTTP/1.1 413 ")


async def test_a_connection_is_closed_after_connection_timeout_however_busy():
    async with monitor_alone(monitor_connection_timeout=1.0, monitor_request_timeout=1.0) as (_, port):
        async with await dial(port) as s:
            t0 = trio.current_time()
            while trio.current_time() - t0 < 10:
                got = await answer(s)
                if not got:
                    break
                assert got.startswith(b"HTTP/1.1 200 ")
            assert 0.9 <= trio.current_time() - t0 < 3.0


class _Named:
    """A listener bound on loopback that says it is bound on ``host`` (serve() asks it once)."""

    def __init__(self, real: trio.SocketListener, host: str) -> None:
        self.real, self.host = real, host
        self.socket = self

    def getsockname(self) -> tuple[str, int]:
        return self.host, 8222

    def fileno(self) -> int:
        return self.real.socket.fileno()

    async def __aenter__(self) -> _Named:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.real.aclose()


@pytest.mark.parametrize(("host", "token", "warned"), [("0.0.0.0", "", True), ("192.0.2.1", "", True),
                         ("0.0.0.0", "t" * 16, False), ("127.0.0.2", "", False), ("::1", "", False)])  # fmt: skip
async def test_a_listener_beyond_loopback_without_a_token_is_logged_at_start(host, token, warned):
    log = io.StringIO()
    docs = monitorhttp.Documents(dataclasses.replace(INFO), lambda: None, lambda: (True, "ready"))
    (real,) = await monitorhttp.open_listeners(("127.0.0.1", 0))
    with trio.move_on_after(0.2):
        await monitorhttp.serve([_Named(real, host)], docs, EventLog("m", "warning", stream=log),  # type: ignore[list-item]
                                NodeConfig(monitor_token=token))  # fmt: skip
    assert ("event=monitor_unprotected" in log.getvalue()) == warned, log.getvalue()


# ------------------------------------------------------------ the slots, by hand


def test_slots_close_the_longest_idle_first_and_refuse_only_when_every_one_is_busy():
    closed: list[str] = []
    slots: Slots[str] = Slots(3, 3, closed.append)
    for k, host in (("a", "h1"), ("b", "h2"), ("c", "h3")):
        assert slots.admit(k, host)
    slots.busy("a")
    slots.idle("a")  # (a answered a request: now the newest idle)
    assert slots.admit("d", "h4") and closed == ["b"]
    slots.busy("c")
    assert slots.admit("e", "h5") and closed == ["b", "a"]
    slots.busy("d")
    slots.busy("e")
    assert not slots.admit("f", "h6") and closed == ["b", "a"]
    slots.leave("c")
    slots.leave("c")  # (twice: no harm)
    assert slots.admit("f", "h6")
    assert slots.admit("g", "h7", busy=True) and closed == ["b", "a", "f"]  # (came with its request)
    assert not slots.admit("h", "h8") and closed == ["b", "a", "f"]
    assert slots.figures() == {"connections": 3, "idle": 0, "accepted": 7, "refused": 2, "evicted": 3,
                               "idle_closed": 0, "request_timeouts": 0, "requests": 0, "unauthorized": 0}  # fmt: skip


def test_slots_per_host_take_the_hosts_own_idle_connection_or_refuse():
    closed: list[str] = []
    slots: Slots[str] = Slots(10, 2, closed.append)
    assert slots.admit("a1", "A") and slots.admit("b1", "B") and slots.admit("a2", "A")
    assert slots.admit("a3", "A") and closed == ["a1"]  # (not b1, idle longer, of another host)
    slots.busy("a2")
    slots.busy("a3")
    assert not slots.admit("a4", "A") and slots.admit("b2", "B")
    assert Slots(2, 8, closed.append).per_host == 2  # (at most the cap)


# ------------------------------------------------------------ the bearer token

TOKEN = "monitor-token-0123456789"


async def test_with_a_token_every_path_but_healthz_answers_401_without_it():
    async with monitored_node(monitor_token=TOKEN) as (_, _url, port):

        async def ask(path: str, auth: bytes | None = None, method: bytes = b"GET") -> bytes:
            header = b"" if auth is None else b"authorization: " + auth + b"\r\n"
            async with await dial(port) as s:
                return await answer(s, method + b" " + path.encode() + b" HTTP/1.1\r\nhost: x\r\n" + header + b"\r\n")

        for path in ("/varz", "/connz", "/subsz", "/clusterz", "/metrics", "/", "/nope", "/varz/", "/varz?x=1"):
            got = await ask(path)
            assert got.startswith(b"HTTP/1.1 401 ") and b'www-authenticate: Bearer realm="roost"\r\n' in got, path
        for wrong in (b"Bearer " + TOKEN[:-1].encode(), b"Bearer " + TOKEN.encode() + b"x", b"Basic " + TOKEN.encode(),
                      TOKEN.encode(), b"Bearer"):  # fmt: skip
            got = await ask("/varz", wrong)
            assert got.startswith(b"HTTP/1.1 401 ") and b'error="invalid_token"' in got, wrong
        good = b"Bearer " + TOKEN.encode()
        varz = await ask("/varz", good)
        assert varz.startswith(b"HTTP/1.1 200 ") and TOKEN.encode() not in varz
        assert (await ask("/varz", b"bearer   " + TOKEN.encode())).startswith(b"HTTP/1.1 200 ")
        assert (await ask("/nope", good)).startswith(b"HTTP/1.1 404 ")
        assert (await ask("/metrics", good)).startswith(b"HTTP/1.1 200 ")
        for path in ("/healthz", "/healthz/"):
            assert (await ask(path)).startswith(b"HTTP/1.1 200 ")
        assert (await ask("/healthz", method=b"HEAD")).startswith(b"HTTP/1.1 200 ")
        assert (await ask("/varz", method=b"POST")).startswith(b"HTTP/1.1 401 ")
        assert (await ask("/varz", good, method=b"POST")).startswith(b"HTTP/1.1 405 ")
        async with await dial(port) as s:  # (two Authorization headers: refused, whichever is right)
            got = await answer(s, b"GET /varz HTTP/1.1\r\nhost: x\r\nauthorization: " + good +
                               b"\r\nauthorization: Bearer other\r\n\r\n")  # fmt: skip
            assert got.startswith(b"HTTP/1.1 401 ")


# ------------------------------------------------------------ [monitor] settings at load


@pytest.mark.parametrize(("toml", "says"), [
    ("max_per_host = 0", "[monitor] max_per_host = 0: must be an integer from 1 to 10000"),
    ("max_connections = 20000", "[monitor] max_connections = 20000: must be an integer from 1 to 10000"),
    ("request_timeout = 0.0", "[monitor] request_timeout = 0.0: must be a number of seconds from 0.1 to 600"),
    ("request_timeout = 40\nconnection_timeout = 30",
     "[monitor] request_timeout = 40.0: must be at most connection_timeout (30.0)"),
    ("idle_timeout = \"10\"", "[monitor] idle_timeout = '10': must be a number of seconds from 0.1 to 3600"),
    ("bogus = 1", "[monitor] bogus: unknown key; known keys: addr, max_connections, max_per_host, idle_timeout, "
                  "request_timeout, connection_timeout, max_request_head, token, token_file"),
    (f"token = \"{TOKEN[:10]}\"", "[monitor] token: must be 16 to 1024 characters of A-Z a-z 0-9 - . _ ~ + / "
                                  "(= only at the end) (it has 10 characters)"),
    (f"token = \"{TOKEN} x\"", "[monitor] token: must be 16 to 1024 characters of A-Z a-z 0-9 - . _ ~ + / (= only "
                               f"at the end) (it has {len(TOKEN) + 2} characters, some of them not allowed)"),
    (f"token = \"{TOKEN}\"\ntoken_file = \"t\"", "[monitor] token and token_file: set one of them, not both"),
    ("token_file = \"missing\"", "[monitor] token_file = 'missing': cannot read "),
    ("token_file = \"t\\u0000\"", "[monitor] token_file = 't\\x00': cannot read "),  # (ValueError before)
    ("token = 5", "[monitor] token = 5: must be empty (none) or 16 to 1024 characters"),
])  # fmt: skip
def test_monitor_settings_are_checked_at_load_naming_file_key_and_what_is_allowed(tmp_path, toml, says):
    path = tmp_path / "node.toml"
    path.write_text(f'[monitor]\naddr = "127.0.0.1:0"\n{toml}\n')
    with pytest.raises(ConfigError) as exc:
        load_node_config(path)
    assert str(exc.value).startswith(f"{path}: {says}"), str(exc.value)
    if "token =" in toml:
        assert TOKEN[:10] not in str(exc.value)  # (a token is never echoed)


def test_a_token_comes_from_token_file_readable_by_its_owner_only_or_from_the_environment(tmp_path, monkeypatch):
    (tmp_path / "token").write_text(f"{TOKEN}\nignored second line\n")
    path = tmp_path / "node.toml"
    path.write_text('[monitor]\naddr = "127.0.0.1:0"\ntoken_file = "token"\n')  # (relative to the config)
    (tmp_path / "token").chmod(0o644)
    with pytest.raises(ConfigError) as exc:
        load_node_config(path)
    assert str(exc.value) == (f"{path}: [monitor] token_file = 'token': {tmp_path / 'token'} is readable by group "
                              "or others (mode 0644): it must be readable by its owner only (chmod 600)")  # fmt: skip
    (tmp_path / "token").chmod(0o640)
    with pytest.raises(ConfigError, match="mode 0640"):
        load_node_config(path)
    (tmp_path / "token").chmod(0o600)
    cfg = load_node_config(path)
    assert cfg.monitor_token == TOKEN and TOKEN not in json.dumps(monitor.node_settings(cfg))
    (tmp_path / "empty").write_text("\n")
    (tmp_path / "empty").chmod(0o600)
    path.write_text('[monitor]\ntoken_file = "empty"\n')
    with pytest.raises(ConfigError, match=r"token_file = 'empty': the file's first line is empty"):
        load_node_config(path)
    path.write_text('[monitor]\naddr = "127.0.0.1:0"\n')
    monkeypatch.setenv("ROOST_MONITOR_TOKEN", TOKEN)
    assert load_node_config(path).monitor_token == TOKEN
    path.write_text(f'[monitor]\ntoken = "{"z" * 16}"\n')  # (the config's own wins)
    assert load_node_config(path).monitor_token == "z" * 16
    monkeypatch.setenv("ROOST_MONITOR_TOKEN", "short")
    path.write_text('[monitor]\naddr = "127.0.0.1:0"\n')
    with pytest.raises(ConfigError, match=r"\[monitor\] token \(from \$ROOST_MONITOR_TOKEN\): must be 16 to 1024"):
        load_node_config(path)
    monkeypatch.delenv("ROOST_MONITOR_TOKEN")
    assert load_node_config(path).monitor_token == ""


def test_a_cluster_configs_monitor_token_file_reaches_every_member(tmp_path):
    from roost.cluster.config import load_cluster_config

    (tmp_path / "token").write_text(TOKEN)
    (tmp_path / "token").chmod(0o600)
    members = [{"id": f"n{i}", "client_addr": f"127.0.0.1:{7400 + i}", "peer_addr": f"127.0.0.1:{7500 + i}",
                "data_dir": f"d{i}", "monitor_addr": f"127.0.0.1:{8400 + i}"} for i in (1, 2)]  # fmt: skip
    cc = load_cluster_config(tmp_path / "c.toml", {"cluster": {"secret": "x" * 16}, "members": members,
                                                   "monitor": {"token_file": "token", "max_per_host": 4}})  # fmt: skip
    assert [(cc.node_config(m).monitor_token, cc.node_config(m).monitor_max_per_host) for m in ("n1", "n2")] == [
        (TOKEN, 4)
    ] * 2
    (tmp_path / "token").chmod(0o604)
    with pytest.raises(ConfigError, match="readable by group or others"):
        load_cluster_config(tmp_path / "c.toml", {"cluster": {"secret": "x" * 16}, "members": members,
                                                  "monitor": {"token_file": "token"}})  # fmt: skip


# ------------------------------------------------------------ a cluster member's health


def http_get(url: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
    except OSError:
        return 0, {}


async def test_a_members_status_names_the_monitor_port_it_bound(tmp_path):
    """``monitor_addr`` with port 0: STATUS (what roost status and top read) names the port bound,
    not 0 (the member core holds its own copy of the node settings)."""
    from roost.cluster.config import load_cluster_config
    from roost.cluster.server import ClusterNode

    member = {"id": "n1", "client_addr": "127.0.0.1:0", "peer_addr": "127.0.0.1:0", "data_dir": str(tmp_path),
              "monitor_addr": "127.0.0.1:0"}  # fmt: skip
    node = ClusterNode(load_cluster_config("<test>", {"cluster": {"secret": "x" * 16}, "members": [member]}), "n1",
                       log=EventLog("n1", "warning"))  # fmt: skip
    async with trio.open_nursery() as nursery:
        await nursery.start(node.run)
        assert node.member is not None
        shown = node.member.broker.status()["monitor"]
        assert shown == node.cfg.monitor_addr and not shown.endswith(":0")
        code, _, body = await get(f"http://{shown}/varz")
        assert code == 200 and json.loads(body)["monitor_addr"] == shown
        await node.stop()
        nursery.cancel_scope.cancel()


def status_exchange(port: int) -> tuple[int, int]:
    """HELLO then STATUS to a node: the datagrams and bytes it sent back."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(5)
        cid = os.urandom(wire.ID_LEN)
        s.sendto(wire.encode_hello(cid), ("127.0.0.1", port))
        welcome = s.recv(70000)
        s.sendto(wire.encode_status(cid, decoding.decode_untrusted_frame(welcome)[2]), ("127.0.0.1", port))
        reply = s.recv(70000)
        assert decoding.decode_untrusted_frame(reply)[0] is wire.FrameType.STATUS_REPLY
    return 2, len(welcome) + len(reply)


@pytest.mark.slow
def test_a_members_healthz_is_503_while_it_syncs_and_200_once_ready(tmp_path):
    # n2's peer port takes connections and says nothing: n1's PULL waits for the handshake
    # (handshake_timeout), syncing, before it gives up and serves alone.
    c = LocalCluster(tmp_path, n=2, cluster_extra="handshake_timeout = 3.0\n", monitor=True)
    silent = socket.create_server(("127.0.0.1", c.peer_ports["n2"]))
    proc = c.launcher.start(c.cc, str(c.config), "n1", wait=False)
    try:
        seen: list[tuple[int, str]] = []

        def ready() -> bool:
            code, doc = http_get(c.monitor("n1") + "/healthz")
            if code:
                seen.append((code, doc.get("state", "")))
            return code == 200

        wait_until(ready, timeout=30, what="n1's /healthz to say 200")
        # (the monitor binds before the member's core exists: it may say "starting" first)
        phases = [s for i, s in enumerate(seen) if i == 0 or s != seen[i - 1]]
        if phases[0] == (503, "starting"):
            phases.pop(0)
        assert phases == [(503, "syncing"), (200, "ready")], seen
        clusterz = http_get(c.monitor("n1") + "/clusterz")[1]
        assert [(m["id"], m["state"]) for m in clusterz["members"]] == [("n1", "ready"), ("n2", "down")]
        before = http_get(c.monitor("n1") + "/varz")[1]
        assert before["mode"] == "replicated"
        # (a member counts what leaves its client port where it sends it: a STATUS reply too)
        sent = status_exchange(c.client_ports["n1"])
        after = http_get(c.monitor("n1") + "/varz")[1]
        assert (after["out_datagrams"] - before["out_datagrams"], after["out_bytes"] - before["out_bytes"]) == sent
    finally:
        silent.close()
        proc.terminate()
        assert proc.wait(20) == 0
    assert (tmp_path / "run" / "n1.log").read_text().count("event=node_stopped") == 1


# ------------------------------------------------------------ real processes: roost status/top, the flood script


@pytest.mark.slow
def test_roost_status_and_top_send_the_token_from_the_environment_or_a_file(tmp_path):
    from roost.cluster.launcher import free_tcp_port
    from tests.clusterkit import Node, roost

    (tmp_path / "token").write_text(TOKEN + "\n")
    (tmp_path / "token").chmod(0o600)
    mon = f"127.0.0.1:{free_tcp_port('127.0.0.1')}"
    node = Node(tmp_path, extra=f'[monitor]\naddr = "{mon}"\ntoken_file = "token"\n')
    try:
        env = {k: v for k, v in os.environ.items() if k != "ROOST_MONITOR_TOKEN"}
        top = ["top", "--monitor", mon, "--count", "1", "--clients", "1"]
        bare = roost(*top, env=env)
        assert bare.returncode == 0 and f"http://{mon}/varz: HTTP 401: it wants a token: set ROOST_MONITOR_TOKEN " \
            "or pass --monitor-token-file" in bare.stdout, bare.stdout + bare.stderr  # fmt: skip
        for how in ({"env": {**env, "ROOST_MONITOR_TOKEN": TOKEN}, "args": []},
                    {"env": env, "args": ["--monitor-token-file", str(tmp_path / "token")]}):  # fmt: skip
            shown = roost(*top, *how["args"], env=how["env"])
            assert shown.returncode == 0 and "\ne2e " in shown.stdout and "401" not in shown.stdout, shown.stdout
        wrong = roost(*top, env={**env, "ROOST_MONITOR_TOKEN": "z" * 16})
        assert "HTTP 401: the token sent is not the endpoint's" in wrong.stdout
        status = roost("status", "--node", node.addr, env={**env, "ROOST_MONITOR_TOKEN": TOKEN})
        assert status.returncode == 0 and f"monitor http://{mon}" in status.stdout, status.stdout + status.stderr
        status = roost("status", "--node", node.addr, env=env)
        assert status.returncode == 0 and "HTTP 401" in status.stderr and "monitor http" not in status.stdout
        missing = roost(*top, "--monitor-token-file", str(tmp_path / "nope"), env=env)
        assert missing.returncode == 2 and f"--monitor-token-file {tmp_path / 'nope'}: No such file" in missing.stderr
    finally:
        assert node.stop() == 0


@pytest.mark.slow
def test_the_flood_script_against_a_node_process_meets_the_acceptance(tmp_path):
    """scripts/monitor_flood.py --spawn: a real `roost node`, 100 idle connections, then /healthz
    tries; it exits 0 only when every try was answered 200 within 100 ms."""
    import subprocess
    import sys

    from tests.clusterkit import ROOT

    r = subprocess.run([sys.executable, "scripts/monitor_flood.py", "--spawn", "--idle", "100", "--tries", "10",
                        "--interval", "0.05", "--duration-cap", "60"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "/healthz: 10 tries, 10 answered 200, 10 within 100 ms" in r.stdout, r.stdout
