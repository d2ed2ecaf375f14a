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

Durable mode (docs/durable.md, a partitioned cluster): ``dpub`` puts numbered
payloads (``pid:seq``) to --topics, logging ``put`` before each and ``putack``
as the partition's cumulative acknowledgement passes it; ``dsub`` reads the
durable subscription (--client, --durable) of each of --topics in turn:
get -> ``record`` for every record (its log offset and payload identity) ->
``commit`` with the cursor's new offset once the owners have it. Now and then
(--crash, seeded) it kills itself with SIGKILL after logging what it received
and before committing, as a consumer crashing mid-batch does; scripts/chaos.py
starts it again with the same client name, so the broker must give the
uncommitted records again, and the new process logs them again.

    python scripts/chaos_worker.py dpub --name dpub-0 --members ... --out RUN/events/dpub-0.jsonl \\
        --topics dur.b,dur.f,dur.i --rate 50 --duration 60
    python scripts/chaos_worker.py dsub --name dsub-0 --members ... --out RUN/events/dsub-0.jsonl \\
        --topics dur.b,dur.f --client dc-0 --durable w --crash 0.05 --crash-until UNIX_TIME
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any, TextIO

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import trio

from roost.client import Client
from roost.client.library import NodeLost, Subscription

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

    def due(self) -> bool:
        """Unflushed lines may be older than a second (an idle worker flushes now and then)."""
        return time.monotonic() - self.last_flush > 1.0

    def flush(self) -> None:
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


def primary(c: Client, topic: str) -> str | None:
    """The topic's primary in the client's map (where its durable requests go), or None."""
    cmap = c.router.cmap
    return cmap.primary(topic) if cmap is not None else None


def leader(c: Client, p: int) -> str | None:
    """Partition ``p``'s primary in the client's map, or None."""
    cmap = c.router.cmap
    return cmap.owners[p][0] if cmap is not None and cmap.owners[p] else None


async def durable_publisher(args: argparse.Namespace, log: EventLog, names: dict[Addr, str]) -> None:
    """Puts at --rate for --duration, then flushes. The library acknowledges puts per partition,
    cumulatively (client/putter.py): a put is logged ``putack`` once its partition's acknowledged
    sequence passes the one ``put`` returned."""
    rng = random.Random(args.seed)
    pid = f"{args.name}-{os.getpid()}-{rng.getrandbits(32):08x}"
    addrs = first_member(args, names, rng)
    topics = args.topics.split(",")
    async with Client(addrs[0], members=addrs[1:]) as c:
        streams = c.router.putter.streams
        waiting: dict[int, deque[tuple[int, int]]] = {}  # partition -> (library sequence, ours), in order

        def acked() -> None:
            for p, q in waiting.items():
                done = streams[p].acked
                while q and q[0][0] <= done:
                    log("putack", pid=pid, seq=q.popleft()[1], partition=p, member=leader(c, p))

        interval = 1.0 / args.rate
        end = trio.current_time() + args.duration
        next_at = trio.current_time()
        seq = 0
        while trio.current_time() < end:
            seq += 1
            topic = rng.choice(topics)
            log("put", pid=pid, seq=seq, topic=topic, member=primary(c, topic))
            p, lib = await c.put(topic, f"{pid}:{seq}")
            waiting.setdefault(p, deque()).append((lib, seq))
            acked()
            next_at += interval
            await trio.sleep_until(max(next_at, trio.current_time()))
        deadline = trio.current_time() + args.flush_timeout
        while trio.current_time() < deadline and not await c.flush(deadline - trio.current_time()):
            await trio.sleep(0.2)  # (flush gives up at once while a session is lost: it comes back)
        acked()


async def durable_subscriber(args: argparse.Namespace, log: EventLog, names: dict[Addr, str]) -> None:
    """get -> record ... -> (maybe crash) -> commit, over --topics in turn, until SIGTERM."""
    rng = random.Random(args.seed)
    addrs = first_member(args, names, rng)
    topics = args.topics.split(",")
    who = {"sub": args.name, "client": args.client, "durable": args.durable}
    born = time.time()
    async with Client(addrs[0], members=addrs[1:]) as c:
        for topic in topics:
            log("dsubscribe", **who, topic=topic, start="earliest")
        committed: dict[str, int] = {}
        while True:
            for topic in topics:
                try:
                    got = await c.get(topic, args.durable, args.batch, start="earliest", timeout=args.get_timeout,
                                      client=args.client)  # fmt: skip
                except NodeLost:
                    await trio.sleep(0.2)  # (a session tried every member: it goes on trying)
                    continue
                cmap = c.router.cmap
                assert cmap is not None  # (get waited for it)
                p, member = cmap.partition(topic), cmap.primary(topic)
                for m in got:
                    spid, _, sseq = m.payload.decode().rpartition(":")
                    log("record", **who, topic=topic, partition=p, offset=m.sequence, pid=spid, seq=int(sseq),
                        member=member)  # fmt: skip
                now = time.time()
                if got and now < args.crash_until and now - born > args.crash_after and rng.random() < args.crash:
                    log("crash", **who, topic=topic)
                    log.flush()  # (what it received is in the log: the checker expects it again)
                    os.kill(os.getpid(), signal.SIGKILL)
                at = c.position(topic, args.durable, client=args.client)
                if at is not None and at > committed.get(topic, -1):
                    try:
                        ok = await c.commit(topic, args.durable, client=args.client, timeout=args.get_timeout * 5)
                    except NodeLost:
                        ok = False
                    if ok:
                        committed[topic] = at
                        log("commit", **who, topic=topic, offset=at)
                if log.due():
                    log.flush()


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
                    role = {"pub": publisher, "sub": subscriber, "dpub": durable_publisher,
                            "dsub": durable_subscriber}[args.role]  # fmt: skip
                    await role(args, log, names)
                    nursery.cancel_scope.cancel()

                nursery.start_soon(on_signal)
                nursery.start_soon(work)
    finally:
        log.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("role", choices=["pub", "sub", "dpub", "dsub"])
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
    ap.add_argument("--topics", default="dur.b,dur.f,dur.i", help="durable topics, comma-separated (dpub, dsub)")
    ap.add_argument("--client", default="dc-0", help="the durable client name (dsub: the same after a restart)")
    ap.add_argument("--durable", default="w", help="the durable subscription's name (dsub)")
    ap.add_argument("--batch", type=int, default=100, help="records per get at most (dsub)")
    ap.add_argument("--get-timeout", type=float, default=0.15, help="seconds a get waits for --batch (dsub)")
    ap.add_argument(
        "--crash",
        type=float,
        default=0.0,
        help="chance per batch received to SIGKILL itself before the commit (dsub, seeded)",
    )
    ap.add_argument("--crash-after", type=float, default=2.0, help="seconds a process lives before it may crash")
    ap.add_argument("--crash-until", type=float, default=0.0, help="Unix time after which it no longer crashes")
    args = ap.parse_args()
    if args.rate <= 0 or args.duration <= 0 or args.batch < 1 or args.get_timeout <= 0:
        ap.error("--rate, --duration, --batch and --get-timeout must be positive")
    if not 0 <= args.crash <= 1:
        ap.error("--crash is a probability from 0 to 1")
    try:
        trio.run(main_async, args)
    except Exception as exc:  # a worker that dies says why in its log's last line
        print(f"{args.name}: {exc!r}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
