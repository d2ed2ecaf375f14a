"""The monitoring endpoint: its documents from a core driven by hand, then the HTTP server of a
real node in this process, then a real cluster member's /healthz through its start-up."""

from __future__ import annotations

import contextlib
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
from roost.node import monitor
from roost.node.config import NodeConfig
from roost.node.logs import EventLog
from roost.node.server import NodeServer
from tests.clusterkit import LocalCluster
from tests.corekit import connect, make_core
from tests.polling import wait_until

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
        ("text", "127.0.0.1:7000")]
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
        ("a", None), ("a", "k1"), ("a", "k2"), ("b", None), ("c.*", "k"), ("c.*", None), ("d.>", None)]
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
    pub.send(wire.encode_pub(pub.cid, pub.cookie, pub.pid, pub.seq, pub.seq, True,
                             [wire.pack_message("a.b", "k", None, b"4")]), 0.0)  # (a keyed message)
    hit = monitor.subsz(core, {"topic": "a.b"})
    assert [(s["filter"], s["key"], s["reliable"], s["matches"]) for s in hit["subscriptions"]] == [
        ("a.*", None, 0, 4), ("a.>", "k", 1, 1), ("a.b", None, 1, 3)]
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
    status = {"state": "ready", "members": [{"id": "n1", "state": "ready", "queue": 0},
                                            {"id": "n2", "state": "down", "queue": 12}], "map": {"epoch": 4}}
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
    """Did the server close ``stream`` (end of file) within ``within`` seconds?"""
    with trio.move_on_after(within):
        return await stream.receive_some(1024) == b""
    return False


async def test_connections_beyond_the_limit_are_refused_and_silent_ones_are_let_go():
    """[monitor] max_connections silent clients hold every slot: one more is closed at once,
    not queued; connection_timeout frees the slots, and /healthz answers again."""
    async with monitored_node(monitor_max_connections=2, monitor_connection_timeout=1.0) as (_, url, port):
        silent = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(2)]
        await silent[0].send_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")  # (served, then silent)
        extra = await trio.open_tcp_stream("127.0.0.1", port)
        assert await closed_by_server(extra, within=0.5)
        assert (await silent[0].receive_some(1024)).startswith(b"HTTP/1.1 200 ")
        for s in silent:  # (idle_timeout is 10 s: only connection_timeout can end these)
            assert await closed_by_server(s, within=5)
        assert (await get(url + "/healthz"))[0] == 200
        for s in [*silent, extra]:
            await s.aclose()


async def test_an_idle_connection_is_closed_after_idle_timeout():
    log = io.StringIO()
    async with monitored_node(log, monitor_idle_timeout=0.3) as (_, _url, port):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        assert await closed_by_server(stream, within=5)
        await stream.aclose()
        # a request whose announced body never comes is not answered (and is no error)
        got = await raw(port, b"GET /varz HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\n")
        assert got == b"" and "monitor_error" not in log.getvalue()


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
        assert decoding.decode_untrusted_frame(reply)[0] is wire.T.STATUS_REPLY
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
