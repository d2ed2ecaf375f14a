"""The replicated cluster with real `roost node` processes on loopback."""

from __future__ import annotations

import functools
import os
import random
import socket
import subprocess
import sys
import threading
from typing import Any

import msgpack
import pytest
import trio

from roost.client import Client
from roost.cluster.peerwire import NONCE_LEN, PROTOCOL, PeerType, encode
from tests.clusterkit import ROOST, ROOT, LocalCluster, read_lines, roost, start_sub, sub_lines
from tests.polling import wait_until


@pytest.fixture
def cluster(tmp_path):
    c = LocalCluster(tmp_path)
    c.start()
    yield c
    c.stop()


def test_subscribe_at_n1_publish_at_n3_then_request_and_reply_across_members(cluster):
    sub = start_sub(cluster.addr("n1"), "t", 3)
    cluster.wait_subscriptions([1, 1, 1])
    r = roost("pub", "t", "m{n}", "--count", "3", "--node", cluster.addr("n3"))
    assert r.returncode == 0, r.stderr
    assert sub_lines(sub) == ["m0", "m1", "m2"]
    cluster.wait_subscriptions([0, 0, 0])  # (the subscriber unsubscribed as it exited)
    # n3 delivered them: the subscriber acknowledged them there with n3's own cookie, not n1's
    assert cluster.status("n3")["metrics"].get("error_bad_cookie", 0) == 0
    replier = subprocess.Popen([*ROOST, "reply", "svc", "--command", "tr a-z A-Z", "--count", "2", "--node",
                                cluster.addr("n1")], cwd=ROOT, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert replier.stderr is not None and "answering requests on svc" in replier.stderr.readline()
        cluster.wait_subscriptions([1, 1, 1])
        for text in ("hello", "again"):
            r = roost("request", "svc", text, "--node", cluster.addr("n3"), "--timeout", "10")
            assert (r.returncode, r.stdout) == (0, text.upper() + "\n"), r.stderr
        assert replier.wait(30) == 0
    finally:
        if replier.poll() is None:
            replier.kill()


async def test_wildcard_and_query_subscriptions_across_members(cluster):
    """`roost sub 'demo.>'` at n1 gets demo.a and demo.b.c published at n2 and not demox; a
    subscription with a tag query gets exactly the matching messages of a mixed stream."""
    sub = await trio.to_thread.run_sync(lambda: start_sub(cluster.addr("n1"), "demo.>", 2, extra=["-v"]))
    await trio.to_thread.run_sync(cluster.wait_subscriptions, [1, 1, 1])
    for topic in ("demox", "demo.a", "demo.b.c"):
        r = await trio.to_thread.run_sync(functools.partial(roost, "pub", topic, f"to {topic}", "--node",
                                                            cluster.addr("n2")))  # fmt: skip
        assert r.returncode == 0, r.stderr
    raw: list[Any] = await trio.to_thread.run_sync(sub_lines, sub)  # (bytes: started with extra flags)
    lines = [x.decode() for x in raw]
    assert [line.split()[0] for line in lines] == ["demo.a", "demo.b.c"], lines
    assert lines[0].endswith("to demo.a") and lines[1].endswith("to demo.b.c")

    query = "kind = 'order' AND amount > 100"
    stream = [{"kind": kind, "amount": str(amount)} for kind in ("order", "refund", "ORDER")
              for amount in (-5, 99, 100, 101, 250, 1e3)] + [{"kind": "order"}, {"amount": "500"}, {}]  # fmt: skip
    expected = [i for i, t in enumerate(stream) if t.get("kind") == "order" and float(t.get("amount", "0")) > 100]
    async with Client(cluster.addr("n1")) as sc, Client(cluster.addr("n3")) as pc, \
            sc.subscribe("shop.*", query=query) as qsub, sc.subscribe("shop.>") as every:  # fmt: skip
        await trio.to_thread.run_sync(cluster.wait_subscriptions, [2, 2, 2])
        for i, tags in enumerate(stream):
            await pc.publish(f"shop.{i % 3}", str(i), tags=tags or None)
        assert await pc.flush(10)
        got = []
        with trio.fail_after(20):
            for _ in range(len(stream)):
                got.append(int((await every.next()).payload))  # (every message arrived, in order)
            while len(got) - len(stream) < len(expected):
                got.append(int((await qsub.next()).payload))
        assert got[: len(stream)] == list(range(len(stream)))
        assert got[len(stream) :] == expected
        with pytest.raises(TimeoutError):
            await qsub.next(timeout=0.3)

    # A 900 KB reliable message (in parts, docs/protocol.md "Large messages") published at n3
    # arrives intact at n1, for a plain subscription and for a queue group's member alike.
    payload = random.Random(12).randbytes(900_000)
    async with Client(cluster.addr("n1")) as sc, Client(cluster.addr("n3")) as pc, \
            sc.subscribe("big.blob") as big, sc.subscribe("big.*", queue="w") as grp:  # fmt: skip
        await trio.to_thread.run_sync(cluster.wait_subscriptions, [2, 2, 2])
        await pc.publish("big.blob", payload, tags={"kind": "blob"}, wait=True, timeout=20)
        with trio.fail_after(20):
            m = await big.next()
            assert (m.payload, m.tags) == (payload, {"kind": "blob"})
            assert (await grp.next()).payload == payload


def _collect(p: subprocess.Popen[str], out: list[str]) -> None:
    assert p.stdout is not None
    out.extend(line.strip() for line in p.stdout)


def test_a_queue_group_across_members_shares_30000_messages_also_when_one_member_is_killed(cluster):
    """Three subscribers of one queue group, one per member; 30,000 reliable messages published at
    n2; the subscriber at n3 stops taking messages after 4,000 and is killed (kill -9) while it
    holds the ones it was given since: those go to the others once its member gives it up, and
    the group gets every message exactly once."""
    workers = {}
    got: dict[str, list[str]] = {m: [] for m in cluster.ids}
    readers = []
    try:
        for m in cluster.ids:
            pause = ["--pause-after", "4000"] if m == "n3" else []
            p = subprocess.Popen([sys.executable, "-m", "tests.queue_worker", cluster.addr(m), "jobs", "w", *pause],
                                 cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
            workers[m] = p
            assert p.stderr is not None and p.stderr.readline() == "subscribed\n"
            readers.append(threading.Thread(target=_collect, args=(p, got[m]), daemon=True))
            readers[-1].start()
        cluster.wait_subscriptions([3, 3, 3])
        pub = subprocess.Popen([*ROOST, "pub", "jobs", "{n}", "--count", "30000", "--node", cluster.addr("n2"), "-q"],
                               cwd=ROOT, stderr=subprocess.PIPE, text=True)  # fmt: skip
        victim = workers["n3"]
        assert victim.stderr is not None and victim.stderr.readline() == "paused\n"
        victim.kill()
        victim.wait(10)
        assert pub.wait(120) == 0, pub.stderr.read() if pub.stderr else ""
        wait_until(lambda: sum(map(len, got.values())) >= 30000, timeout=60,
                   what="all 30,000 messages at the group's members")  # fmt: skip
        everything = [int(x) for lines in got.values() for x in lines]
        print(
            f"per member {[len(v) for v in got.values()]}; redelivered by the members "
            f"{[cluster.status(m)['metrics'].get('queue_redelivered', 0) for m in ('n1', 'n2')]}"
        )
        assert len(got["n3"]) == 4000
        assert sorted(everything) == list(range(30000)), "lost or duplicated"
    finally:
        for p in workers.values():
            if p.poll() is None:
                p.kill()
                p.wait(10)


def test_kill9_restart_pulls_state_and_keeps_subscriptions(cluster):
    s1 = start_sub(cluster.addr("n1"), "a", 2)
    s3 = start_sub(cluster.addr("n3"), "b", 2)
    cluster.wait_subscriptions([2, 2, 2])
    cluster.kill("n2")
    # a SUB made while n2 is down
    s_new = start_sub(cluster.addr("n1"), "made_while_down", 1)
    cluster.wait_subscriptions([3, 3], ["n1", "n3"])
    cluster.start("n2")
    assert "event=pulled" in cluster.log("n2").split("event=node_starting")[-1]
    # every member, the restarted one included, shows the same count
    cluster.wait_subscriptions([3, 3, 3])
    st = cluster.status("n2")
    assert st["state"] == "ready" and all(m["state"] == "ready" for m in st["members"])
    # the restarted node serves the subscriptions it pulled, including the new one
    for topic in ("a", "b", "made_while_down"):
        assert roost("pub", topic, "from n2 {n}", "--count", "2", "--node", cluster.addr("n2")).returncode == 0
    assert sub_lines(s1) == ["from n2 0", "from n2 1"]
    assert sub_lines(s3) == ["from n2 0", "from n2 1"]
    assert sub_lines(s_new) == ["from n2 0"]


def _dial(cluster, member="n1"):
    s = socket.create_connection(("127.0.0.1", cluster.peer_ports[member]), timeout=5)
    return s


def _closed_by_peer(s) -> bool:
    s.settimeout(5)
    try:
        while s.recv(65536):
            continue
    except (ConnectionResetError, TimeoutError):
        return False
    return True


def test_peer_with_wrong_secret_is_refused_and_changes_nothing(cluster):
    sub = start_sub(cluster.addr("n1"), "t", 1)
    cluster.wait_subscriptions([1, 1, 1])
    before = cluster.status("n1")["subscriptions"]
    s = _dial(cluster)
    s.sendall(encode([PeerType.HELLO, PROTOCOL, "n2", os.urandom(NONCE_LEN), "replicated"]))
    s.settimeout(5)
    challenge = msgpack.unpackb(s.recv(65536)[4:])
    assert challenge[0] == PeerType.CHALLENGE
    s.sendall(encode([PeerType.AUTH, b"\0" * 32]))  # a MAC made without the secret
    # then try to smuggle in a PUSH that would subscribe somebody
    s.sendall(encode([PeerType.PUSH, 1, [[b"x" * 16, 2**60, "127.0.0.1", 9, "n2", [["evil", None, 2**62]], 0]]]))
    assert _closed_by_peer(s)
    wait_until(lambda: "peer_refused" in cluster.log("n1"), what="refusal logged")
    line = next(x for x in cluster.log("n1").splitlines() if "peer_refused" in x)
    assert "wrong cluster secret" in line and "node=n1" in line
    assert cluster.status("n1")["subscriptions"] == before
    sub.kill()


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"\x00\x00\x00\x05" + b"\xc1" * 5, "undecodable frame"),
        ((1 << 31).to_bytes(4, "big") + b"x" * 10, "exceeds max_frame"),
        (encode([PeerType.HELLO, "something-else/9", "n2", os.urandom(NONCE_LEN), "replicated"]), "expected HELLO"),
        (encode([PeerType.HELLO, PROTOCOL, "stranger", os.urandom(NONCE_LEN), "replicated"]), "unknown peer id"),
        (
            encode([PeerType.HELLO, PROTOCOL, "n2", os.urandom(NONCE_LEN), "partitioned/256/2"]),
            "mode, partitions and replicas must be the same",
        ),
        (encode([PeerType.PULL]), "expected HELLO"),
    ],
    ids=["garbage", "oversized", "other-protocol", "stranger", "other-shape", "pull-first"],  # (the nonces are random)
)
def test_garbage_and_oversized_peer_streams_are_refused(cluster, payload, reason):
    before = cluster.subscriptions()
    s = _dial(cluster)
    s.sendall(payload)
    assert _closed_by_peer(s)
    wait_until(lambda: reason in cluster.log("n1"), what=f"'{reason}' logged")
    assert cluster.subscriptions() == before
    assert roost("status", "--node", cluster.addr("n1")).returncode == 0  # still serving


def test_a_member_restarted_with_another_cluster_shape_is_refused_and_told_why(cluster):
    """Its peers refuse it (error level) and answer REFUSED, so its own log names the difference
    too (review: a member with `partitions = 128` ran alone with nothing in its log to say why).
    Nobody stops: the shape is not authenticated, so acting on it would let anyone stop a member."""
    s = _dial(cluster)
    s.sendall(encode([PeerType.HELLO, PROTOCOL, "n2", os.urandom(NONCE_LEN), "partitioned/128/2"]))
    s.settimeout(5)
    refused = msgpack.unpackb(s.recv(65536)[4:])
    assert refused[0] == PeerType.REFUSED and "must be the same" in refused[1] and "'replicated'" in refused[1]
    s.close()
    cluster.kill("n2")
    odd = cluster.tmp / "odd.toml"
    odd.write_text(cluster.config.read_text().replace("[cluster]\n", '[cluster]\nmode = "partitioned"\n', 1))
    log = cluster.tmp / "odd.log"
    with open(log, "w") as err:
        p = subprocess.Popen([sys.executable, "-m", "roost", "node", "--config", str(odd), "--id", "n2"],
                             cwd=ROOT, stderr=err)  # fmt: skip
    try:
        wait_until(lambda: "refused by the peer: peer runs 'partitioned/256/2', this member 'replicated'"
                   in log.read_text() or "peer runs 'replicated', this member 'partitioned/256/2'"
                   in log.read_text(), what="the odd member told why")  # fmt: skip
        line = next(x for x in log.read_text().splitlines() if "peer_refused" in x)
        assert line.split()[1] == "ERROR" and "node=n2" in line
        assert roost("status", "--node", cluster.addr("n1")).returncode == 0  # the others go on
        assert "ERROR node=n1 event=peer_refused" in cluster.log("n1")
    finally:
        p.kill()
        p.wait()


def test_subscriber_keeps_receiving_when_its_node_is_killed(cluster):
    """Subscriber and publisher both talk to n1; n1 dies mid-stream: after the
    subscriber got the first half through n1 and before the second half is sent."""
    n, half = 400, 200
    sub = start_sub(cluster.addr("n1"), "stream", n, timeout=60)
    cluster.wait_subscriptions([1, 1, 1])
    code = (
        "import sys, trio\n"
        "from roost.client import Client\n"
        "async def main():\n"
        f"    async with Client('{cluster.addr('n1')}') as c:\n"
        f"        for i in range({n}):\n"
        f"            if i == {half}:\n"
        "                await trio.to_thread.run_sync(sys.stdin.readline)  # the test kills n1 now\n"
        "            await c.publish('stream', f'm{i}')\n"
        "        assert await c.flush(20)\n"
        "        print('failovers', c.session.failovers)\n"
        "trio.run(main)\n"
    )
    pub = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert read_lines(sub, half) == [f"m{i}" for i in range(half)]  # through n1
        cluster.kill("n1")
        pout, perr = pub.communicate("go\n", timeout=60)
    finally:
        pub.kill()
    assert pub.returncode == 0, perr
    assert "failovers 1" in pout
    assert sub_lines(sub) == [f"m{i}" for i in range(half, n)]  # all, in order, once


def test_status_lists_members_and_queues(cluster):
    st = cluster.status("n2")
    assert st["node"] == "n2" and st["mode"] == "replicated"
    assert [m["id"] for m in st["members"]] == ["n1", "n2", "n3"]
    assert all({"state", "subscriptions", "clients", "queue"} <= set(m) for m in st["members"])
    human = roost("status", "--node", cluster.addr("n2"))
    assert "n1" in human.stdout and "QUEUE" in human.stdout and "ready" in human.stdout


def test_cold_start_of_the_whole_cluster_restores_from_snapshots(tmp_path):
    import socket as s

    c = LocalCluster(tmp_path)
    c.start()
    try:
        text = s.socket(s.AF_INET, s.SOCK_DGRAM)
        text.bind(("127.0.0.1", 0))
        text.sendto(b"SUB kept\n", ("127.0.0.1", c.client_ports["n2"]))
        c.wait_subscriptions([1, 1, 1])
        c.stop()  # SIGTERM: every member writes its snapshot (fsync) on the way out
        for m in c.ids:
            assert (tmp_path / "data" / m / "state.msgpack").stat().st_size > 0
        c.start()  # the first member up has nobody to PULL from: it loads its snapshot
        runs = [c.log(m).split("event=node_starting")[-1] for m in c.ids]
        assert any("event=loaded_snapshot" in r for r in runs)
        assert all("event=loaded_snapshot" in r or "event=pulled" in r for r in runs)
        assert c.subscriptions() == [1, 1, 1]
        # (a text subscriber renews its SUB, as FASTPUSS clients do: what n2 may send it is 3x
        # what it sent since n2 started, and the renewal pads for the message; n3 relays via n2)
        text.sendto(b"SUB kept\n" + b"." * 20, ("127.0.0.1", c.client_ports["n2"]))
        c.wait_subscriptions([1, 1, 1])
        assert roost("pub", "kept", "after the restart", "--node", c.addr("n3")).returncode == 0
        text.settimeout(5)
        assert text.recv(1000) == b"MSG kept\nafter the restart"
    finally:
        c.stop()


async def test_snapshot_writes_and_fsyncs_run_off_the_event_loop(tmp_path, monkeypatch):
    """A member's file I/O happens in worker threads; the core hears PersistDone only after the fsyncs."""
    import os
    import threading

    import trio

    from roost.cluster.config import load_cluster_config
    from roost.cluster.server import ClusterNode
    from tests.polling import eventually

    data = {
        "cluster": {"secret": "x" * 16},
        "members": [{"id": "n1", "client_addr": "127.0.0.1:0", "peer_addr": "127.0.0.1:0", "data_dir": str(tmp_path)}],
    }
    node = ClusterNode(load_cluster_config("<test>", data), "n1")
    fsynced_in: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        fsynced_in.append(threading.current_thread().name)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    async with trio.open_nursery() as nursery:
        addr = await nursery.start(node.run)
        sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
        await sock.sendto(b"SUB t\n", addr)
        await eventually(lambda: node.member.broker.index.count == 1, what="the text SUB")
        await node.stop()
        nursery.cancel_scope.cancel()
    sock.close()
    assert len(fsynced_in) == 2  # the file, then its directory
    assert threading.main_thread().name not in fsynced_in
    assert node.member.phase == "stopped" and node.member.persisted == node.member.broker.changes
    assert (tmp_path / "state.msgpack").exists()


@pytest.mark.parametrize("busy", ["client", "peer"])
def test_member_that_cannot_bind_exits_with_a_one_line_error(tmp_path, busy):
    """A member whose client (UDP) or peer (TCP) port is taken says so and exits 1, without waiting for a signal."""
    c = LocalCluster(tmp_path, n=1)
    if busy == "client":
        blocker = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        port = c.client_ports["n1"]
    else:
        blocker = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        port = c.peer_ports["n1"]
    with blocker:
        blocker.bind(("127.0.0.1", port))
        if busy == "peer":
            blocker.listen()
        r = roost("node", "--config", str(c.config), "--id", "n1", timeout=30)
    assert r.returncode == 1, r.stderr
    assert f"n1: cannot bind 127.0.0.1:{port}" in r.stderr
    assert "Traceback" not in r.stderr and "event=node_ready" not in r.stderr


async def test_sends_left_by_a_full_buffer_outside_the_udp_task_go_out(tmp_path):
    """A send that hit a full socket buffer while a timer or a peer link was fed
    must not wait for the next client datagram to go out."""
    import trio
    import trio.testing

    from roost.cluster.config import load_cluster_config
    from roost.cluster.events import Datagrams
    from roost.cluster.server import ClusterNode
    from tests.polling import eventually

    quiet = {"heartbeat_interval": 10.0, "suspect_after": 20.0, "down_after": 40.0, "link_idle_timeout": 30.0,
             "snapshot_interval": 60.0}  # fmt: skip
    data = {
        "cluster": {"secret": "x" * 16, **quiet},  # no timer fires during the test
        "members": [{"id": "n1", "client_addr": "127.0.0.1:0", "peer_addr": "127.0.0.1:0", "data_dir": str(tmp_path)}],
    }
    node = ClusterNode(load_cluster_config("<test>", data), "n1")

    class FullOnce:
        """The member's socket, with a send buffer full for the first send."""

        def __init__(self, sock: socket.socket) -> None:
            self.sock, self.full = sock, True

        def sendto(self, data: bytes, addr: tuple[str, int]) -> int:
            if self.full:
                self.full = False
                raise BlockingIOError
            return self.sock.sendto(data, addr)

        def __getattr__(self, name: str) -> object:
            return getattr(self.sock, name)

    sub = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
    await sub.bind(("127.0.0.1", 0))
    async with trio.open_nursery() as nursery:
        addr = await nursery.start(node.run)
        await sub.sendto(b"SUB t\n", addr)
        await eventually(lambda: node.member.broker.index.count == 1, what="the text SUB")
        await trio.testing.wait_all_tasks_blocked()  # the UDP task waits for a datagram
        assert node._sock is not None
        node._sock = FullOnce(node._sock)  # type: ignore[assignment]
        node._feed(Datagrams([(b"PUB t\nhello", ("127.0.0.1", 9))]))  # fed from this task, not the UDP task
        assert node._udp_pending  # left for later by the full buffer
        with trio.fail_after(3):  # the next timer is 10 s away: only the UDP task can send it
            assert await sub.recv(1000) == b"MSG t\nhello"
        await node.stop()
        nursery.cancel_scope.cancel()
    sub.close()


async def test_a_hung_disk_does_not_hold_a_stopping_member_past_stop_timeout(tmp_path):
    import threading

    import trio

    from roost.cluster.config import load_cluster_config
    from roost.cluster.server import ClusterNode
    from tests.polling import eventually

    disk = threading.Event()
    data = {
        "cluster": {"secret": "x" * 16, "stop_timeout": 0.2},
        "members": [{"id": "n1", "client_addr": "127.0.0.1:0", "peer_addr": "127.0.0.1:0", "data_dir": str(tmp_path)}],
    }
    node = ClusterNode(load_cluster_config("<test>", data), "n1", fsync_file=lambda f: disk.wait(30))  # (hangs)
    sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
    try:
        with trio.fail_after(10):  # (30 s, the hung fsync, if it held the member)
            async with trio.open_nursery() as nursery:
                addr = await nursery.start(node.run)
                await sock.sendto(b"SUB t\n", addr)
                await eventually(lambda: node.member.broker.index.count == 1, what="the text SUB")
                await node.stop()  # the last snapshot's fsync never returns
                nursery.cancel_scope.cancel()
    finally:
        disk.set()
        sock.close()
    assert node.member.phase == "stopping"  # it never heard PersistDone, and exited anyway


@pytest.mark.alone  # (its nft table is the chaos runs', and it bounds the heal in time: tests/conftest.py)
def test_a_subscription_taken_while_members_are_cut_apart_is_live_everywhere_soon_after_the_heal(tmp_path):
    """A subscription confirmed by n1 while n1's peer links were cut must reach the
    others promptly after the heal (their dead links noticed by the silence on them, closed
    and dialled again), not after TCP's retransmit back-off. Clients still reach every member."""
    import time

    from roost.cluster.config import load_cluster_config
    from roost.cluster.launcher import Launcher, write_local_config
    from roost.node.procs import wait_listening
    from scripts.faults import FaultTable

    hosts = ["127.0.0.21", "127.0.0.22", "127.0.0.23"]
    cfg = tmp_path / "cluster.toml"
    ports = write_local_config(cfg, 3, "cut-test-secret-0123456789", hosts=hosts,
                               node_extra='[node]\nlog_level = "info"\n')  # fmt: skip
    cc = load_cluster_config(cfg)
    launcher = Launcher(str(tmp_path / "run"))
    procs = [launcher.start(cc, str(cfg), m, wait=False) for m in ports]
    sub = None
    try:
        for p, host, (udp, _) in zip(procs, hosts, ports.values(), strict=True):
            wait_listening(p, host, udp, timeout=60)
        n1, n2 = f"{hosts[0]}:{ports['n1'][0]}", f"{hosts[1]}:{ports['n2'][0]}"
        log = tmp_path / "run" / "n1.log"
        with FaultTable() as ft:
            cut = ft.cut([hosts[0]], hosts[1:])
            wait_until(lambda: log.read_text().count("event=link_down") >= 2, timeout=15, what="dead links")
            sub = start_sub(n1, "after-cut", 1, timeout=30)  # confirmed by n1 alone
            ft.heal(cut)
            healed = time.monotonic()
            got = None
            while got is None and time.monotonic() - healed < 10:
                roost("pub", "after-cut", "hello", "--node", n2, timeout=30)  # published at n2 only
                if sub.poll() is not None:
                    got = time.monotonic()
            assert got is not None, "the subscription never reached n2"
            assert got - healed < 4.0, f"live at n2 only {got - healed:.1f} s after the heal"
        assert sub.stdout is not None and sub.stdout.read().strip() == "hello"
    finally:
        if sub is not None and sub.poll() is None:
            sub.kill()
        launcher.down()
