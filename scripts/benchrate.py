"""The throughput floor under W1: what a publisher, a relay and a subscriber in Python, with the
README's API shape and nothing of a broker's logic, can move on this machine, so that W1's
figures can be read against it (scripts/benchfloor.py is W3's latency floor).

Three trio processes on loopback, as W1 has them, each message its own msgpack array at every
hop, as Roost's PUB and MSGS carry them (Roost's reliable path; its fire runs, PUBRUN and
MSGSRUN, carry a datagram's topic once and its payloads alone, and are not bounded by this:
docs/protocol.md, "Runs"):

- the **publisher** calls ``await pub.publish(topic, payload)`` per message (a coroutine that
  packs the message with msgpack and adds it to a batch; a batch of 256 messages or 16 KB leaves
  as one datagram), with the bench's own per-message work: ``payload`` (unpaced, as W1 is);
- the **relay** drains its socket, unpacks each datagram and packs each message again for the
  subscriber (what a node does in fire mode, without checks, tables or windows);
- the **subscriber**'s I/O task drains its socket, unpacks each datagram and queues each
  message's payload alone, made a ``Message`` (``message_of``) when the application takes it
  with ``async for msg in sub`` and the bench's ``Tally.take``, as W1's subscriber does (and as
  Roost's queue holds a subscription's own topic's plain messages: client/receive.py,
  ``SubState``).

No acknowledgements, no windows, no checks of the bytes: a fire floor. The figures are msgs/s at
the subscriber (first message to last, as scripts/bench.py counts them), lost, and each
process's CPU seconds after its imports (the relay stops once nothing came for 2 s).

    python scripts/benchrate.py             # 200,000 messages of 100 bytes, 3 runs
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import select
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scripts.benchsystems import Tally, cpu_seconds, payload

BATCH, DATAGRAM, BUFFER = 256, 16_000, 8 << 20
TOPIC = "bench"


def _sock() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, BUFFER)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, BUFFER)
    s.bind(("127.0.0.1", 0))
    s.setblocking(False)
    print(s.getsockname()[1], flush=True)
    return s


def _frame(packed: list[bytes]) -> bytes:
    """One datagram: a msgpack array of the packed messages (array 32 header: any count)."""
    return b"\xdd" + len(packed).to_bytes(4, "big") + b"".join(packed)


async def _drain(s: socket.socket, each: Any, idle: float = math.inf) -> None:
    """Wait for the socket, then read it dry, ``each`` on every datagram; until nothing came
    for ``idle`` seconds after the first."""
    import trio

    wait = math.inf
    while True:
        with trio.move_on_after(wait):
            await trio.lowlevel.wait_readable(s)
        if not _ready(s):
            return
        wait = idle
        while True:
            try:
                each(s.recv(65536))
            except BlockingIOError:
                break


def _ready(s: socket.socket) -> bool:
    return bool(select.select([s], [], [], 0)[0])


def _send(s: socket.socket, data: bytes, dest: tuple[str, int]) -> int:
    """Send, or count a datagram the full send buffer refused (1): a floor does not retry."""
    try:
        s.sendto(data, dest)
    except BlockingIOError:
        return 1
    return 0


async def source(to: int, n: int, size: int) -> dict[str, Any]:
    import msgpack
    import trio

    s, pack, cpu0 = _sock(), msgpack.Packer().pack, cpu_seconds()
    dest = ("127.0.0.1", to)

    class Pub:
        def __init__(self) -> None:
            self.batch: list[bytes] = []
            self.bytes = self.refused = 0

        async def publish(self, topic: str, data: bytes) -> int:
            m = pack([topic, None, None, data])
            self.batch.append(m)
            self.bytes += len(m)
            if len(self.batch) >= BATCH or self.bytes >= DATAGRAM:
                self.flush()
                await trio.lowlevel.checkpoint()
            return 0

        def flush(self) -> None:
            if self.batch:
                self.refused += _send(s, _frame(self.batch), dest)
                self.batch, self.bytes = [], 0

    pub, pad = Pub(), b"x" * (size - 16)
    for i in range(n):
        await pub.publish(TOPIC, payload(i, pad))
    pub.flush()
    return {"cpu": cpu_seconds() - cpu0, "refused": pub.refused}


async def relay(to: int) -> dict[str, Any]:
    import msgpack

    s, pack, unpack, cpu0 = _sock(), msgpack.Packer().pack, msgpack.unpackb, cpu_seconds()
    dest, refused = ("127.0.0.1", to), [0]

    def each(d: bytes) -> None:
        refused[0] += _send(s, _frame([pack(m) for m in unpack(d)]), dest)

    await _drain(s, each, 2.0)
    return {"cpu": cpu_seconds() - cpu0, "refused": refused[0]}


async def sink(n: int, idle: float) -> dict[str, Any]:
    import msgpack
    import trio

    from roost.client.receive import Message, message_of

    s, unpack, cpu0 = _sock(), msgpack.unpackb, cpu_seconds()
    queue: collections.deque[bytes] = collections.deque()
    tally = Tally(n)

    class Sub:
        def __init__(self) -> None:
            self.ready = trio.Event()

        def each(self, d: bytes) -> None:
            queue.extend([m[3] for m in unpack(d)])  # (one topic: the payload alone, as Roost's)
            self.ready.set()

        def __aiter__(self) -> Sub:
            return self

        async def __anext__(self) -> Message:
            while not queue:
                self.ready = trio.Event()
                await self.ready.wait()
            return message_of((TOPIC, None, None, queue.popleft(), None))

    sub = Sub()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_drain, s, sub.each)

        async def watchdog() -> None:
            start = time.monotonic()
            while not tally.idle_for(idle, start):
                await trio.sleep(idle / 4)
            nursery.cancel_scope.cancel()

        nursery.start_soon(watchdog)
        async for msg in sub:
            if tally.take(msg.payload):
                break
        nursery.cancel_scope.cancel()
    return tally.result(cpu0)


def run(n: int, size: int) -> dict[str, Any]:
    def start(*args: str) -> tuple[subprocess.Popen[str], int]:
        p = subprocess.Popen([sys.executable, __file__, *args], stdout=subprocess.PIPE, text=True)
        assert p.stdout is not None
        return p, int(p.stdout.readline())

    procs: list[subprocess.Popen[str]] = []
    try:
        sub, sub_port = start("--role", "sink", "-n", str(n))
        procs.append(sub)
        rel, rel_port = start("--role", "relay", "--to", str(sub_port))
        procs.append(rel)
        pub, _ = start("--role", "source", "--to", str(rel_port), "-n", str(n), "--size", str(size))
        procs.append(pub)
        pub_out = json.loads(pub.communicate(timeout=120)[0])
        sub_out = json.loads(sub.communicate(timeout=120)[0])
        rel_out = json.loads(rel.communicate(timeout=120)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    span = sub_out["last"] - sub_out["first"]
    if not sub_out["received"] or span <= 0:
        raise SystemExit(f"benchrate: the subscriber got {sub_out['received']} of {n} messages: no rate to report")
    return {"msgs_per_s": sub_out["received"] / span, "lost": sub_out["lost"],
            "refused": pub_out["refused"] + rel_out["refused"],
            "cpu": (rel_out["cpu"], pub_out["cpu"], sub_out["cpu"])}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--role", help=argparse.SUPPRESS)
    ap.add_argument("--to", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("-n", type=int, default=200_000, help="messages (default 200,000, as W1)")
    ap.add_argument("--size", type=int, default=100, help="payload bytes (default 100, at least 16)")
    ap.add_argument("--repeat", type=int, default=3, help="runs (the table shows each and the median)")
    a = ap.parse_args()
    if a.role:
        import trio

        roles = {"relay": lambda: relay(a.to), "source": lambda: source(a.to, a.n, a.size),
                 "sink": lambda: sink(a.n, 2.0)}  # fmt: skip
        print(json.dumps(trio.run(roles[a.role])), flush=True)
        return
    if a.size < 16 or a.n < 1 or a.repeat < 1:
        ap.error("--size must be at least 16 (the index and send time), -n and --repeat at least 1")
    print("| run | msgs/s | lost | refused sends | cpu s relay/pub/sub |\n|---|---|---|---|---|")
    rates = []
    for i in range(a.repeat):
        r = run(a.n, a.size)
        rates.append(r["msgs_per_s"])
        cpu = "/".join(f"{c:.2f}" for c in r["cpu"])
        print(f"| {i + 1} | {r['msgs_per_s']:,.0f} | {r['lost']} | {r['refused']} | {cpu} |", flush=True)
    print(f"| median | {statistics.median(rates):,.0f} | | | |")


if __name__ == "__main__":
    main()
