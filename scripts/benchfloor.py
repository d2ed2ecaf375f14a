"""The latency floor under W3: what three processes passing one datagram along cost on this
machine with no broker logic at all, so the bench's figures can be read against it.

A source sends a timestamped 100-byte datagram 2,000 times a second to a relay, which sends it
on to a sink, which measures the one-way latency (CLOCK_MONOTONIC is shared by the processes).
This is Roost's W3 path (publisher -> node -> subscriber) with every message, table and
acknowledgement taken out. Two ways:

- ``trio``: each process waits in ``trio.lowlevel.wait_readable`` and paces with
  ``trio.sleep``, as Roost's shells do;
- ``blocking``: plain blocking ``recvfrom`` and ``time.sleep`` (the kernel's part alone);
- ``trio-tasks``: as ``trio``, with the task layout of Roost's clients: the source's caller hands
  each datagram to an I/O task, and the sink's I/O task hands each to the application's task
  (a memory channel each): the cost of those two hand-offs, still with no broker logic.

    python scripts/benchfloor.py            # the three, 5,000 datagrams after 500 of warm-up
"""

from __future__ import annotations

import argparse
import math
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator

HEAD = struct.Struct("!Qd")


def _sock(port: int = 0) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", port))
    return s


def role(name: str, way: str, port: int, to: int, n: int, warmup: int) -> None:
    s = _sock(port)
    print(s.getsockname()[1], flush=True)
    if way == "blocking":
        _blocking(name, s, to, n, warmup)
    else:
        import trio

        trio.run(_trio_tasks if way == "trio-tasks" and name != "relay" else _trio, name, s, to, n, warmup)


def _paced(n: int) -> Iterator[tuple[int, float]]:
    """The source's schedule, 2,000 a second: each datagram's index and how long to wait before
    sending it (computed when asked, after the previous send)."""
    t0 = time.monotonic()
    for i in range(n):
        yield i, t0 + i / 2000 - time.monotonic()


def _datagram(i: int) -> bytes:
    """The source's datagram ``i``: its index and send time, padded to 100 bytes."""
    return HEAD.pack(i, time.monotonic()) + b"x" * 84


def _blocking(name: str, s: socket.socket, to: int, n: int, warmup: int) -> None:
    lat: list[float] = []
    if name == "source":
        for i, delay in _paced(n):
            if delay > 0:
                time.sleep(delay)
            s.sendto(_datagram(i), ("127.0.0.1", to))
        return
    for _ in range(n):
        _pass(name, s, s.recv(2048), to, warmup, lat)
    _report(lat)


def _pass(name: str, s: socket.socket, d: bytes, to: int, warmup: int, lat: list[float]) -> None:
    """A relay sends the datagram on; the sink notes its latency."""
    if name == "relay":
        s.sendto(d, ("127.0.0.1", to))
        return
    i, sent = HEAD.unpack_from(d)
    if i >= warmup:
        lat.append(time.monotonic() - sent)


async def _trio(name: str, s: socket.socket, to: int, n: int, warmup: int) -> None:
    import trio

    s.setblocking(False)
    lat: list[float] = []
    if name == "source":
        for i, delay in _paced(n):
            if delay > 0:
                await trio.sleep(delay)
            s.sendto(_datagram(i), ("127.0.0.1", to))
        return
    got = 0
    while got < n:
        await trio.lowlevel.wait_readable(s)
        while True:
            try:
                d = s.recv(2048)
            except BlockingIOError:
                break
            got += 1
            _pass(name, s, d, to, warmup, lat)
    _report(lat)


async def _trio_tasks(name: str, s: socket.socket, to: int, n: int, warmup: int) -> None:
    """The source or the sink of ``trio-tasks``: two tasks joined by a memory channel."""
    import trio

    s.setblocking(False)
    give, take = trio.open_memory_channel[bytes](math.inf)
    lat: list[float] = []
    async with trio.open_nursery() as nursery:
        if name == "source":

            async def sender() -> None:
                async for d in take:
                    s.sendto(d, ("127.0.0.1", to))

            nursery.start_soon(sender)
            for i, delay in _paced(n):
                if delay > 0:
                    await trio.sleep(delay)
                give.send_nowait(_datagram(i))
            give.close()
            return

        async def receiver() -> None:
            while True:
                await trio.lowlevel.wait_readable(s)
                while True:
                    try:
                        give.send_nowait(s.recv(2048))
                    except BlockingIOError:
                        break

        nursery.start_soon(receiver)
        for _ in range(n):
            _pass(name, s, await take.receive(), to, warmup, lat)
        nursery.cancel_scope.cancel()
    _report(lat)


def _report(lat: list[float]) -> None:
    if lat:
        lat.sort()
        print(f"{1e6 * lat[len(lat) // 2]:.0f} {1e6 * lat[int(len(lat) * 0.99)]:.0f}", flush=True)


def run(way: str, n: int, warmup: int) -> tuple[str, str]:
    def start(name: str, to: int) -> tuple[subprocess.Popen[str], int]:
        p = subprocess.Popen([sys.executable, __file__, "--role", name, "--way", way, "--to", str(to), "-n", str(n),
                              "--warmup", str(warmup)], stdout=subprocess.PIPE, text=True)  # fmt: skip
        assert p.stdout is not None
        return p, int(p.stdout.readline())

    sink, sink_port = start("sink", 0)
    relay, relay_port = start("relay", sink_port)
    source, _ = start("source", relay_port)
    try:
        source.wait(60)
        out, _ = sink.communicate(timeout=10)
        p50, p99 = out.split()
        return p50, p99
    finally:
        for p in (source, relay, sink):
            if p.poll() is None:
                p.kill()
                p.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--role", help=argparse.SUPPRESS)
    ap.add_argument("--way", default="trio", help=argparse.SUPPRESS)
    ap.add_argument("--to", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("-n", type=int, default=5500, help="datagrams sent (the first 500 are warm-up)")
    ap.add_argument("--warmup", type=int, default=500, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.role:
        role(a.role, a.way, 0, a.to, a.n, a.warmup)
        return
    print("| way | p50 us | p99 us |\n|---|---|---|")
    for way in ("blocking", "trio", "trio-tasks"):
        p50, p99 = run(way, a.n, a.warmup)
        print(f"| {way} | {p50} | {p99} |")


if __name__ == "__main__":
    main()
