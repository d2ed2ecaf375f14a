"""A publisher or subscriber process of a chaos run, logging every event (docs/eventlog.md).

    python scripts/chaos_worker.py pub --name pub-0 --members n1=127.0.0.1:7701,... \\
        --out RUN/events/pub-0.jsonl --mode reliable --rate 200 --duration 60 --seed 1
    python scripts/chaos_worker.py sub --name sub-0 --members ... --out RUN/events/sub-0.jsonl \\
        --subs chaos.a:reliable,chaos.b/k1:reliable,chaos.a:fire

A worker is an ordinary application on the trio client library: it does not
know about faults and never judges; it writes what it did and what it saw,
and scripts/check.py decides. A publisher logs ``publish`` before handing a
message to the library and ``puback`` as the cumulative acknowledgement
passes it; a subscriber logs ``subscribe`` once confirmed, ``deliver`` for
every message, ``cancel`` when a subscription ends with a reason (then it
subscribes again, as an application would), and both log ``failover`` when
the library moves to another member. The payload names the message
(``pid:seq``), so a delivery is identified without trusting anything else.
SIGTERM (or the end of --duration for a publisher, then a flush) ends it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any, TextIO

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import trio

from client import Client
from client.library import Subscription

TOPICS = ("chaos.a", "chaos.b")
KEYS = (None, "k1", "k2")


class EventLog:
    """JSON lines, flushed every second and at exit (a kill -9 of a worker loses at most a second)."""

    def __init__(self, path: str, proc: str) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.f: TextIO = open(path, "a", encoding="utf-8")  # noqa: SIM115 (closed in close())
        self.proc = proc
        self.last_flush = time.monotonic()

    def __call__(self, ev: str, **fields: Any) -> None:
        self.f.write(json.dumps({"t": time.time(), "proc": self.proc, "ev": ev, **fields}) + "\n")
        if time.monotonic() - self.last_flush > 1.0:
            self.f.flush()
            self.last_flush = time.monotonic()

    def close(self) -> None:
        self.f.flush()
        self.f.close()


def parse_members(text: str) -> dict[tuple[str, int], str]:
    """``n1=127.0.0.1:7701,...`` -> {(host, port): member id}."""
    out: dict[tuple[str, int], str] = {}
    for item in text.split(","):
        mid, _, addr = item.partition("=")
        host, _, port = addr.rpartition(":")
        out[(host, int(port))] = mid
    return out


Addr = tuple[str, int]


def first_member(args: argparse.Namespace, names: dict[Addr, str], rng: random.Random) -> list[Addr]:
    """The members in the order to try them: --first, or drawn by the seed."""
    addrs = list(names)
    rng.shuffle(addrs)
    if args.first:
        addrs.sort(key=lambda a: names[a] != args.first)
    return addrs


class Watcher:
    """Logs a failover when the client's member changes."""

    def __init__(self, client: Client, log: EventLog, names: dict[tuple[str, int], str]) -> None:
        self.client, self.log, self.names = client, log, names
        self.member = self.current()

    def current(self) -> str | None:
        node = self.client.session.node
        return self.names.get((node[0], node[1])) if node else None

    def check(self) -> str | None:
        now = self.current()
        if now != self.member:
            self.log("failover", client=self.log.proc, **{"from": self.member, "to": now})
            self.member = now
        return now


async def publisher(args: argparse.Namespace, log: EventLog, names: dict[tuple[str, int], str]) -> None:
    rng = random.Random(args.seed)
    pid = f"{args.name}-{os.getpid()}-{rng.getrandbits(32):08x}"
    addrs = first_member(args, names, rng)
    reliable = args.mode == "reliable"
    async with Client(addrs[0], members=addrs[1:]) as c:
        w = Watcher(c, log, names)
        s = c.router  # (acked: over every session, in the sequence publish returned)
        seq = acked = 0
        lib_of: dict[int, int] = {}  # library producer sequence -> our sequence
        interval = 1.0 / args.rate
        end = trio.current_time() + args.duration
        next_at = trio.current_time()
        while trio.current_time() < end:
            member = w.check()
            seq += 1
            topic, key = rng.choice(TOPICS), rng.choice(KEYS)
            log("publish", pid=pid, seq=seq, topic=topic, key=key, mode=args.mode, member=member)
            lib = await c.publish(topic, f"{pid}:{seq}", key=key, mode=args.mode)
            if reliable:
                lib_of[lib] = seq
                while acked < s.acked:
                    acked += 1
                    ours = lib_of.pop(acked, None)
                    if ours is not None:
                        log("puback", pid=pid, seq=ours, member=w.check())
            next_at += interval
            await trio.sleep_until(max(next_at, trio.current_time()))
        with trio.move_on_after(args.flush_timeout):
            await c.flush()
        while acked < s.acked:
            acked += 1
            ours = lib_of.pop(acked, None)
            if ours is not None:
                log("puback", pid=pid, seq=ours, member=w.check())


async def subscriber(args: argparse.Namespace, log: EventLog, names: dict[tuple[str, int], str]) -> None:
    rng = random.Random(args.seed)
    addrs = first_member(args, names, rng)
    specs = []
    for item in args.subs.split(","):
        where, _, mode = item.partition(":")
        topic, _, key = where.partition("/")
        specs.append((topic, key or None, mode or "reliable"))
    async with Client(addrs[0], members=addrs[1:]) as c:
        w = Watcher(c, log, names)

        async def follow(topic: str, key: str | None, mode: str) -> None:
            while True:
                sub: Subscription = c.subscribe(topic, key, mode)
                await sub.start()
                if not sub.active:
                    log("cancel", sub=args.name, topic=topic, key=key, reason=sub.reason or "refused")
                    await trio.sleep(0.5)
                    continue
                log("subscribe", sub=args.name, topic=topic, key=key, mode=mode, member=w.check())
                async for msg in sub:
                    spid, _, sseq = msg.payload.decode().rpartition(":")
                    log("deliver", sub=args.name, topic=msg.topic, key=msg.key, mode=mode, pid=spid,
                        seq=int(sseq), member=w.check())  # fmt: skip
                log("cancel", sub=args.name, topic=topic, key=key, reason=sub.reason or "ended")
                await trio.sleep(0.2)  # then take it again, as an application would

        async def watch() -> None:
            while True:
                w.check()
                await trio.sleep(0.1)

        async with trio.open_nursery() as nursery:
            for topic, key, mode in specs:
                nursery.start_soon(follow, topic, key, mode)
            nursery.start_soon(watch)


async def main_async(args: argparse.Namespace) -> None:
    names = parse_members(args.members)
    log = EventLog(args.out, args.name)
    try:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:

                async def on_signal() -> None:
                    async for _ in signals:
                        nursery.cancel_scope.cancel()
                        return

                async def work() -> None:
                    await (publisher if args.role == "pub" else subscriber)(args, log, names)
                    nursery.cancel_scope.cancel()

                nursery.start_soon(on_signal)
                nursery.start_soon(work)
    finally:
        log.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("role", choices=["pub", "sub"])
    ap.add_argument("--name", required=True)
    ap.add_argument("--members", required=True, help="ID=HOST:PORT,... (the first one tried is drawn by --seed)")
    ap.add_argument("--out", required=True, help="the JSON-lines event file to append to")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--first", help="the member to talk to first (default: drawn by --seed)")
    ap.add_argument("--mode", choices=["reliable", "fire"], default="reliable", help="publisher mode")
    ap.add_argument("--rate", type=float, default=100.0, help="publishes per second (publisher)")
    ap.add_argument("--duration", type=float, default=30.0, help="seconds of publishing (publisher)")
    ap.add_argument("--flush-timeout", type=float, default=10.0, help="seconds to wait for the last PUBACKs")
    ap.add_argument("--subs", default="chaos.a:reliable", help="TOPIC[/KEY]:MODE,... (subscriber)")
    args = ap.parse_args()
    if args.rate <= 0 or args.duration <= 0:
        ap.error("--rate and --duration must be positive")
    try:
        trio.run(main_async, args)
    except Exception as exc:  # a worker that dies says why in its log's last line
        print(f"{args.name}: {exc!r}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
