"""Partitioned mode with real `roost node` processes: where subscriptions live, routing, takeover."""

from __future__ import annotations

import itertools
import random
import socket
import time

import pytest
import trio

from roost.client import Client, clustermap
from tests.clusterkit import LocalCluster
from tests.polling import wait_until

R = 2  # replicas (the default)


@pytest.fixture(scope="module")
def five(tmp_path_factory):
    c = LocalCluster(tmp_path_factory.mktemp("p5"), n=5, cluster_extra='mode = "partitioned"\n')
    c.start()
    wait_until(lambda: c.status("n1")["map"]["live"] == c.ids, what="every member live in n1's map")
    yield c
    c.stop()


def owners_of(c: LocalCluster, topic: str) -> tuple[str, ...]:
    members = {m.id: (m.client_addr, m.peer_addr) for m in c.cc.members}
    cmap = clustermap.compute(0, members, members, 256, R)
    return cmap.owners[cmap.partition(topic)]


async def test_subscriptions_live_on_their_owners_and_a_publish_anywhere_reaches_them(five):
    c = five
    topics = [f"spread.{i}" for i in range(200)]
    before = sum(c.subscriptions())
    async with trio.open_nursery() as n:
        clients = [await n.start(_client, c.addr(m)) for m in c.ids]
        subs = [clients[i % 5].subscribe(t) for i, t in enumerate(topics)]
        for s in subs:
            await s.start()
        await trio.to_thread.run_sync(lambda: wait_until(lambda: sum(c.subscriptions()) - before == R * len(topics),
                                                         what="every subscription on its two owners"))  # fmt: skip
        counts = await trio.to_thread.run_sync(c.subscriptions)
        share = R * len(topics) / 5
        print(
            f"subscriptions per member {counts} for {len(topics)} subscriptions: "
            f"{[round(x / len(topics), 2) for x in counts]} of the total (replicas/5 = {R / 5})"
        )
        assert all(0.6 * share <= x - before / 5 <= 1.4 * share for x in counts), counts
        # a publish at every member, for topics owned elsewhere, reaches the subscriber
        for i, t in enumerate(topics):
            await clients[(i + 2) % 5].publish(t, f"m{i}")
        for i, s in enumerate(subs):
            with trio.fail_after(20):
                msg = await s.next()
            assert msg.payload == f"m{i}".encode()
        for s in subs:
            await s.unsubscribe()
        n.cancel_scope.cancel()


async def _client(addr: str, task_status=trio.TASK_STATUS_IGNORED) -> None:
    async with Client(addr) as cl:
        task_status.started(cl)
        await trio.sleep_forever()


async def test_a_wildcard_subscription_spans_every_partition(five):
    """A wildcard subscription is held by every member (the spanning partition), and gets the
    messages of topics in every partition, published at every member; a text client's wildcard
    SUB too."""
    c = five
    before = c.subscriptions()
    topics = [f"span.{i}.x" for i in range(40)]
    assert len({owners_of(c, t)[0] for t in topics}) == 5  # (every member is the primary of some)
    text = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        text.connect(("127.0.0.1", c.client_ports["n4"]))
        text.settimeout(10)
        async with Client(c.addr("n2")) as sc, Client(c.addr("n3")) as pc, sc.subscribe("span.*.x") as sub, \
                sc.subscribe("span.>", query="n >= 20") as q:  # fmt: skip
            text.send(b"SUB span.>\n" + b"." * 1000)  # (padded: 3x of what it sends may come back)
            await trio.to_thread.run_sync(lambda: wait_until(
                lambda: [a - b for a, b in zip(c.subscriptions(), before, strict=True)] == [3] * 5,
                what="the wildcard subscriptions on every member"))  # fmt: skip
            for i, t in enumerate(topics):
                await pc.publish(t, str(i), tags={"n": str(i)})
            await pc.publish("span.1.y", "not for span.*.x")
            with trio.fail_after(20):  # (each topic in order; topics of different primaries are not ordered)
                assert sorted([int((await sub.next()).payload) for _ in topics]) == list(range(len(topics)))
                assert sorted([int((await q.next()).payload) for _ in range(20)]) == list(range(20, 40))
            with pytest.raises(TimeoutError):
                await sub.next(timeout=0.3)
            heard = sorted(text.recv(2048).split(b"\n", 1)[1] for _ in range(len(topics) + 1))
            assert heard == sorted([str(i).encode() for i in range(len(topics))] + [b"not for span.*.x"])
            # A message larger than a datagram, in parts, through its topic's primary to a wildcard
            payload = random.Random(5).randbytes(300_000)
            await pc.publish("span.7.x", payload, wait=True, timeout=20)
            with trio.fail_after(20):
                assert (await sub.next()).payload == payload
            text.send(b"UNSUB span.>\n")
    finally:
        text.close()
    wait_until(lambda: c.subscriptions() == before, what="the wildcard subscriptions gone everywhere")


def test_text_clients_work_against_any_member(five):
    """A text client cannot follow a redirect: its SUB and PUB go to members that own
    nothing of the topic, and it hears the messages from the member it talks to."""
    c = five
    topic = next(f"text.{i}" for i in range(1000) if not {"n1", "n2"} & set(owners_of(c, f"text.{i}")))
    sub = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    pub = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sub.connect(("127.0.0.1", c.client_ports["n1"]))  # (hears only n1, as `nc -u` does)
        sub.settimeout(5)
        sub.send(f"SUB {topic}\n".encode())
        wait_until(lambda: sum(c.subscriptions(list(owners_of(c, topic)))) >= 2, what="the text SUB at its owners")
        pub.sendto(f"PUB {topic}\nhello from n2".encode(), ("127.0.0.1", c.client_ports["n2"]))
        assert sub.recv(2048) == f"MSG {topic}\nhello from n2".encode()
    finally:
        sub.close()
        pub.close()


async def test_killing_a_primary_keeps_the_reliable_subscription_with_a_short_gap(tmp_path):
    c = LocalCluster(tmp_path, n=5, cluster_extra='mode = "partitioned"\n')
    c.start()
    try:
        await trio.to_thread.run_sync(lambda: wait_until(lambda: c.status("n1")["map"]["live"] == c.ids,
                                                         what="every member live"))  # fmt: skip
        topic = next(f"gap.{i}" for i in range(1000) if not {"n1", "n2"} & set(owners_of(c, f"gap.{i}")))
        primary = owners_of(c, topic)[0]
        total, rate, kill_at = 800, 200.0, 200
        arrivals: list[tuple[float, int]] = []
        async with Client(c.addr("n1")) as sc, Client(c.addr("n2")) as pc, sc.subscribe(topic) as sub:

            async def receive() -> None:
                async for msg in sub:
                    arrivals.append((time.monotonic(), int(msg.payload)))
                    if arrivals[-1][1] == total - 1:
                        return

            async with trio.open_nursery() as n:
                n.start_soon(receive)
                for i in range(total):
                    if i == kill_at:
                        await trio.to_thread.run_sync(c.kill, primary)
                    await pc.publish(topic, str(i))
                    await trio.sleep(1 / rate)
                with trio.fail_after(30):
                    assert await pc.flush(20)
                    while not arrivals or arrivals[-1][1] != total - 1:
                        await trio.sleep(0.05)
                n.cancel_scope.cancel()
        got = [x for _, x in arrivals]
        gap = max(b - a for (a, _), (b, _) in itertools.pairwise(arrivals))
        lost = sorted(set(range(total)) - set(got))
        print(
            f"killed the primary {primary} of {topic!r}: longest gap {gap * 1000:.0f} ms, "
            f"{len(lost)} of {total} lost (in the dead primary's mailbox), {len(got) - len(set(got))} duplicates"
        )
        assert len(got) == len(set(got))  # no duplicates
        assert gap < 2.0
        assert all(kill_at - 100 <= x < kill_at + 100 for x in lost), lost  # only around the kill
        assert set(range(kill_at + 100, total)) <= set(got)  # the subscription lives on
    finally:
        c.stop()


def forwarded(c: LocalCluster) -> int:
    """Messages the members forwarded to another member, in total."""
    return sum(c.status(m)["metrics"].get("forwarded_out", 0) for m in c.ids)


async def test_a_client_learns_the_map_and_publishes_straight_to_the_primaries(five):
    """The client library routes by the map from WELCOME: a publisher connected to one member
    sends each topic to its primary (nothing forwarded), a subscriber connected to another
    subscribes at the primaries, and everything arrives; a text PUB through a member that is
    not the primary is still forwarded."""
    c = five
    primaries = {owners_of(c, f"route.{i}")[0]: f"route.{i}" for i in range(200)}
    assert set(primaries) == set(c.ids)
    topics = sorted(primaries.values())
    burst = sorted({owners_of(c, f"burst.{i}")[0]: f"burst.{i}" for i in range(200)}.values())  # (to each member)
    per_topic = 5
    before = await trio.to_thread.run_sync(forwarded, c)
    async with Client(c.addr("n1")) as pub, Client(c.addr("n2")) as sub:
        assert pub.router.cmap is not None and pub.router.cmap.live == frozenset(c.ids)  # from WELCOME
        for t in burst:  # (one burst, no checkpoint: each publish that opens a session starts its I/O)
            await pub.publish(t, "nobody's", mode="fire")
        assert len(pub._conn.socks) == len(pub.router.sessions) == len(c.ids)
        subs = [sub.subscribe(t) for t in topics]
        for s in subs:
            await s.start()
            assert s.active
        # a session per member (each leads one of the topics), the first one (n2's) among them
        assert sorted(s.node for s in sub.router.sessions) == sorted(c.cc.member(m).client_addr for m in c.ids)
        for i in range(per_topic):
            for t in topics:
                await pub.publish(t, f"{t}:{i}")
        assert await pub.flush(20)
        for t, s in zip(topics, subs, strict=True):
            with trio.fail_after(20):
                got = [(await s.next()).payload for _ in range(per_topic)]
            assert got == [f"{t}:{i}".encode() for i in range(per_topic)]
        assert len(pub.router.sessions) == len(c.ids)  # one per member: each leads one of the topics
        after = await trio.to_thread.run_sync(forwarded, c)
        print(
            f"forwarded by the members while a routing client published {per_topic * len(topics)} "
            f"messages: {after - before}"
        )
        assert after - before == 0
        # A text client cannot be redirected: its PUB through a non-primary is forwarded.
        topic = next(t for t in topics if owners_of(c, t)[0] != "n1")
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as text:
            text.sendto(f"PUB {topic}\nby text".encode(), ("127.0.0.1", c.client_ports["n1"]))
        s = subs[topics.index(topic)]
        with trio.fail_after(20):
            assert (await s.next()).payload == b"by text"
        assert await trio.to_thread.run_sync(forwarded, c) == after + 1
