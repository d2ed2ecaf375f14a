"""The asyncio client's latency policy (client/turns.py, the trio client's too), against a node
process: on a quiet path a publish is sent before it returns, and so is a burst of them; on a
busy one it waits for the loop's turn; a wait on a sparse path has its message before the turn
that brought it sends the ACK."""

from __future__ import annotations

import asyncio
import math
import time

import pytest

import roost.asyncio
from roost.client import decoding
from roost.client.session import ClientConfig
from roost.client.turns import CALLER
from roost.client.udp import send_now
from roost.client.wire import FrameType
from tests.clusterkit import Node

#: Clients that ping once a minute: no PING lands inside the tests' counts
QUIET = {"ping_interval": 60.0, "node_timeout": 180.0}


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    n = Node(tmp_path_factory.mktemp("aio"), extra="[timeouts]\nsubscriber_timeout = 180.0\n")
    yield n
    n.stop()


def client(node, send=send_now, **config) -> roost.asyncio.Client:
    return roost.asyncio.Client(node.addr, config=ClientConfig(**{**QUIET, **config}), send=send)


def test_a_burst_on_a_quiet_path_is_sent_call_by_call_and_what_follows_waits(node):
    async def main() -> None:
        async with client(node, idle_gap=60.0, idle_burst=3) as c:
            await asyncio.sleep(0.05)  # (connected, nothing under way)
            pub = c.session.pub
            came = c._turns.came[CALLER]
            c._turns.busy_at = -math.inf  # (quiet for longer than idle_gap)
            for i in range(3):
                await c.publish("t.aio", str(i), mode="fire")
                assert pub.fire_unsent == 0  # (sent before publish returned)
            await c.publish("t.aio", b"3", mode="fire")  # (the burst is spent: the loop's turn sends it)
            assert pub.fire_unsent == 1
            assert await c.flush(5) and pub.fire_unsent == 0
            assert c._turns.came[CALLER] == came  # (the callers' turns took no datagram)

    asyncio.run(main())


def test_no_call_makes_a_turn_of_its_own_with_idle_gap_inf(node):
    async def main() -> None:
        async with client(node, idle_gap=math.inf) as c:
            await asyncio.sleep(0.05)
            for i in range(3):
                await c.publish("t.never", str(i), mode="fire")
                assert c.session.pub.fire_unsent == i + 1  # (queued for the loop's turn)
            assert await c.flush(5)

    asyncio.run(main())


def test_a_sparse_waits_message_comes_before_its_ack_leaves(node):
    """After a wait of idle_gap or more, the turn that brings a reliable message holds the ACK
    for a turn scheduled after the waiting task ran: the application has its message first."""
    order: list[str] = []

    def noted(sock, datagrams):
        order.extend("ACK" for _, d in datagrams if decoding.decode_untrusted_frame(d)[0] is FrameType.ACK)
        return send_now(sock, datagrams)

    async def main() -> None:
        async with client(node, noted, idle_gap=1e-9) as c, client(node) as p:
            async with c.subscribe("t.held", mode="reliable") as sub:
                with pytest.raises(TimeoutError):
                    await sub.next(timeout=0.01)  # (a wait of idle_gap or more: the path is sparse)
                got: list[bytes] = []

                async def waiter() -> None:
                    got.append((await sub.next(timeout=10)).payload)
                    order.append("got")

                task = asyncio.create_task(waiter())
                await asyncio.sleep(0.01)
                order.clear()
                await p.publish("t.held", b"one")
                await asyncio.wait_for(task, 10)
                for _ in range(100):  # (the held ACK leaves at the next turn)
                    if "ACK" in order:
                        break
                    await asyncio.sleep(0.01)
                assert got == [b"one"] and order == ["got", "ACK"]

    asyncio.run(main())


def test_a_publish_on_a_quiet_path_leaves_though_its_turn_brings_a_waiters_message(node):
    """A caller's turn on a quiet path holds nothing: when it also brings the message a task in a
    sparse wait is waiting for, the publish's datagram still leaves before the call returns (only
    the loop's turns hold sends for a waiter, as in the trio shell)."""

    async def main() -> None:
        async with client(node, idle_gap=1e-9) as c, client(node) as p:
            async with c.subscribe("t.both", mode="reliable") as sub:
                with pytest.raises(TimeoutError):
                    await sub.next(timeout=0.01)  # (a wait of idle_gap or more: the path is sparse)
                task = asyncio.create_task(sub.next(timeout=10))
                await asyncio.sleep(0.01)  # (the waiter waits, holding what the loop's turns send)
                await p.publish("t.both", b"one")
                time.sleep(0.05)  # (the loop blocked: the message waits in c's socket, unread)
                c._turns.busy_at = -math.inf  # (quiet: the publish makes the turn itself)
                came = c._turns.came[CALLER]
                await c.publish("t.other", b"mine", mode="fire")
                assert c._turns.came[CALLER] == came + 1  # (the caller's turn brought the message)
                assert c.session.pub.fire_unsent == 0  # (and the publish left before it returned)
                assert (await asyncio.wait_for(task, 10)).payload == b"one"

    asyncio.run(main())
