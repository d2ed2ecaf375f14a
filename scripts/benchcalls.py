"""CPU per client call, against a real node: what one ``await c.publish(...)`` and one message
taken with ``async for msg in sub`` cost the calling process, apart from the bench's own work
(no payload made per message, no ``Tally.take``). W1's figures are the sum of three processes
on two cores (docs/performance.md), so a change to a client's hot path shows here first, in
CPU seconds of one process, where a whole W1 run's rate moves by more than the change between
runs.

- **publish**: a connected client publishes ``-n`` messages of 100 bytes to one topic as fast
  as it can (``yield_every`` lets its I/O task send them); the figure is the process's CPU
  time over the loop, the I/O task's sends included, divided by ``-n``.
- **take**: a subscriber first lets ``-n`` messages queue (its buffer holds them all), then
  takes them with ``async for``; the figure is the CPU time of that loop alone per message.
- **baseline**: the same loop awaiting a coroutine that does nothing: what Python's loop and
  ``await`` cost before Roost's code.
- **decode**: a MSGS datagram of 130 such messages, as the node sends it in the mode, checked by
  ``decode_untrusted_frame`` in a loop (no node): what the subscriber's I/O task spends on each
  message before it is queued (a node's PUB of plain messages costs about the fire figure).

    python scripts/benchcalls.py                       # both modes, 200,000 each, 3 rounds
    python scripts/benchcalls.py --modes fire -n 50000 --rounds 5

Prints one row per mode with the median of the rounds (ns per call or message). CPU time
(``time.process_time``), not wall time, so other processes on the machine move it less, but
not at all only on a quiet machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import timeit
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from roost.client import Client, ClientConfig, decoding, wire
from scripts.benchsystems import start_server

PAYLOAD = b"x" * 100
TOPIC = "calls"


async def _nothing(topic: str, payload: bytes, mode: str = "fire") -> int:
    return 0


async def _baseline(n: int) -> float:
    t = time.process_time()
    for _ in range(n):
        await _nothing(TOPIC, PAYLOAD, mode="fire")
    return (time.process_time() - t) / n


async def _publish(addr: str, mode: str, n: int) -> float:
    async with Client(addr) as c:
        for _ in range(1000):  # (the topic's head packed, the windows warm)
            await c.publish(TOPIC, PAYLOAD, mode=mode)
        if mode == "reliable" and not await c.flush(timeout=30):
            raise SystemExit("benchcalls: the warm-up publishes were not acknowledged within 30 s")
        t = time.process_time()
        for _ in range(n):
            await c.publish(TOPIC, PAYLOAD, mode=mode)
        spent = time.process_time() - t
        if mode == "reliable" and not await c.flush(timeout=60):
            raise SystemExit("benchcalls: the publishes were not acknowledged within 60 s")
    return spent / n


async def _take(addr: str, mode: str, n: int) -> float:
    async with Client(addr, config=ClientConfig(max_buffered=n + 1000)) as s:
        async with s.subscribe(TOPIC, mode=mode) as sub:
            async with Client(addr) as c:  # (closed before the timed loop: its I/O is not counted)
                for _ in range(n):
                    await c.publish(TOPIC, PAYLOAD, mode=mode)
            recv = sub.session.recv
            with trio.move_on_after(60):  # (bounded: a fire message lost on loopback would never come)
                while recv.buffered < n:
                    await trio.sleep(0.02)
            if recv.buffered < n:
                raise SystemExit(f"benchcalls: {recv.buffered:,} of {n:,} messages queued within 60 s")
            taken = 0
            t = time.process_time()
            async for _msg in sub:
                taken += 1
                if taken == n:
                    break
            return (time.process_time() - t) / n


def _decode(mode: str) -> float:
    """A MSGS datagram of 130 messages of 100 bytes, as the node sends it in ``mode``, decoded
    (``decoding.decode_untrusted_frame``, what the subscriber's I/O task does with each): ns a
    message, best of 7 times 3,000."""
    packed = [wire.pack_plain(TOPIC, PAYLOAD)] * 130
    data = wire.encode_msgs(0, 0, packed) if mode == "fire" else \
        wire.encode_msgs(5, 1, wire.pack_messages([(TOPIC, None, None, PAYLOAD)] * 130, b"p" * 16, 1))  # fmt: skip
    decoding.decode_untrusted_frame(data)  # (the topic checked once, as a subscriber's first datagram does)
    return min(timeit.repeat(lambda: decoding.decode_untrusted_frame(data), number=3000, repeat=7)) / 3000 / 130


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--modes", default="reliable,fire", help="comma-separated: reliable, fire")
    ap.add_argument("-n", type=int, default=200_000, help="calls measured per round (default 200,000)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per mode; the median is printed (default 3)")
    a = ap.parse_args(argv)
    modes = a.modes.split(",")
    unknown = [m for m in modes if m not in ("reliable", "fire")]
    if unknown:
        ap.error(f"--modes {a.modes!r}: {unknown} not among reliable, fire")
    if a.n < 1000:
        ap.error(f"-n {a.n}: must be at least 1000")
    if a.rounds < 1:
        ap.error(f"--rounds {a.rounds}: must be at least 1")
    server = start_server("roost")
    try:
        print("| mode | baseline ns | publish ns | take ns | decode ns |")
        print("|---|---|---|---|---|")
        for mode in modes:
            rows = [(trio.run(_baseline, a.n), trio.run(_publish, server.addr, mode, a.n),
                     trio.run(_take, server.addr, mode, a.n), _decode(mode)) for _ in range(a.rounds)]  # fmt: skip
            base, pub, take, dec = (statistics.median(col) * 1e9 for col in zip(*rows, strict=True))
            print(f"| {mode} | {base:.0f} | {pub:.0f} | {take:.0f} | {dec:.0f} |", flush=True)
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
