"""The systems scripts/bench.py measures: Roost and its peers (NATS, Redis, Mosquitto), each
with a server on a free loopback port and the publisher and subscriber roles its usual Python
client plays (nats-py, redis-py, paho-mqtt).

Every role measures the same way, whatever the system: a payload starts with the message index
and the publisher's send time (CLOCK_MONOTONIC, shared by all processes of one Linux machine);
a subscriber records which indexes it got (lost, duplicated), the latency of each, and its own
CPU seconds, and stops after ``n`` messages or once nothing has come for ``idle`` seconds.

Modes: Roost has ``reliable`` (acknowledged, retransmitted, in order) and ``fire`` (at most
once). NATS core and Redis pub/sub are at most once (``fire``); Mosquitto has QoS 0 (``fire``)
and QoS 1 (``reliable``: at least once).
"""

from __future__ import annotations

import asyncio
import builtins
import json
import os
import select
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from roost.node.monitorhttp import process_figures
from roost.node.procs import free_port, wait_listening

HEAD = struct.Struct("!Qd")  # index, send time
_unpack, _monotonic = HEAD.unpack_from, time.monotonic  # (Tally.take's, looked up once)
#: Where scripts/benchhops.py notes when the application took each message (None: not traced).
_HOPS: list[tuple[int, str, int]] | None = getattr(builtins, "__roost_hops__", None)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: system -> the modes it has (see the module docstring)
MODES = {"roost": ("reliable", "fire"), "nats": ("fire",), "redis": ("fire",), "mosquitto": ("reliable", "fire")}
#: what to install when a peer's server is missing
INSTALL = {"nats": "apt-get install nats-server (and pip install nats-py)",
           "redis": "apt-get install redis-server (and pip install redis)",
           "mosquitto": "apt-get install mosquitto (and pip install paho-mqtt)"}  # fmt: skip
SERVER = {"nats": "nats-server", "redis": "redis-server", "mosquitto": "mosquitto"}
CLIENT = {"nats": "nats", "redis": "redis", "mosquitto": "paho.mqtt.client"}
SBIN = ("/usr/sbin", "/sbin")  # (Debian puts nats-server and mosquitto there, off a user's PATH)
#: Roost's limits in every bench run, single node or cluster member: mailboxes and a send window
#: large enough that an unpaced publisher is not refused while its subscribers catch up
ROOST_LIMITS = "[limits]\nmailbox_capacity = 200000\nsend_window = 8192\n"


def server_binary(system: str) -> str | None:
    name = SERVER[system]
    return shutil.which(name) or next((f"{d}/{name}" for d in SBIN if os.path.exists(f"{d}/{name}")), None)


def missing(system: str) -> str | None:
    """Why a peer cannot run here (its server or client library is missing), or None."""
    if system == "roost":
        return None
    if server_binary(system) is None:
        return f"{SERVER[system]} is not installed: {INSTALL[system]}"
    try:
        __import__(CLIENT[system])
    except ImportError:
        return f"the Python client {CLIENT[system]} is not installed: {INSTALL[system]}"
    return None


def cpu_seconds() -> float:
    return process_figures()["cpu_seconds"]


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) of another process, from /proc."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ------------------------------------------------------------------ servers


@dataclass
class Server:
    system: str
    proc: subprocess.Popen[bytes]
    addr: str  # what the clients connect to (a cluster: each member's, comma-separated)
    workdir: str = ""
    extra: list[subprocess.Popen[bytes]] = field(default_factory=list)  # (a cluster's other members)
    #: a cluster's wait until its members hold the subscriptions made (scripts/benchcluster.py)
    settle: Callable[[int], None] | None = None

    @property
    def processes(self) -> list[subprocess.Popen[bytes]]:
        return [self.proc, *self.extra]

    def stop(self) -> None:
        for p in self.processes:
            if p.poll() is None:
                p.terminate()
        for p in self.processes:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)


def _wait_tcp(port: int, proc: subprocess.Popen[bytes], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before listening")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port} within {timeout:g} s")


def start_server(system: str, roost_limits: str = "") -> Server:
    """One server of ``system`` on a free loopback port (Roost: a single node)."""
    work = tempfile.mkdtemp(prefix=f"roost-bench-{system}-")
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    if system == "roost":
        port = free_port()
        cfg = os.path.join(work, "node.toml")
        with open(cfg, "w") as f:
            f.write(f'[node]\nid = "bench"\nclient_addr = "127.0.0.1:{port}"\nlog_level = "warning"\n'
                    f"{ROOST_LIMITS}{roost_limits}")  # fmt: skip
        proc = subprocess.Popen([sys.executable, "-m", "roost", "node", "--config", cfg], cwd=ROOT)
        wait_listening(proc, "127.0.0.1", port)
        return Server(system, proc, f"127.0.0.1:{port}", work)
    port = free_port("127.0.0.1", socket.SOCK_STREAM)
    if system == "nats":
        proc = subprocess.Popen([server_binary(system) or "nats-server", "-a", "127.0.0.1", "-p", str(port)], **quiet)  # type: ignore[call-overload]
    elif system == "redis":
        # (no persistence; no output limit for subscribers: the default 32 MB/8 MB/60 s limit
        # disconnects a subscriber that falls behind, which would count as loss)
        proc = subprocess.Popen([server_binary(system) or "redis-server", "--port", str(port), "--bind", "127.0.0.1",
                                 "--save", "", "--appendonly", "no", "--client-output-buffer-limit", "pubsub 0 0 0"],
                                **quiet)  # type: ignore[call-overload]  # fmt: skip
    else:
        conf = os.path.join(work, "mosquitto.conf")
        with open(conf, "w") as f:  # (default max_queued_messages is 1000: QoS 1 would drop under load)
            f.write(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
                    "max_queued_messages 1000000\nmax_inflight_messages 1000\n")  # fmt: skip
        proc = subprocess.Popen([server_binary(system) or "mosquitto", "-c", conf], **quiet)  # type: ignore[call-overload]
    _wait_tcp(port, proc, SERVER[system])
    return Server(system, proc, f"127.0.0.1:{port}", work)


# ------------------------------------------------------------------ what a subscriber counts


class Tally:
    """What one subscriber saw: each index once (lost, duplicated), order, latency.

    ``n`` messages are due to it out of the publishers' ``space`` indexes (a subscriber of some
    topics gets some of them); latencies count from index ``warmup`` on. Order is what each
    mode promises: FIFO per publisher (``publishers`` of them, each with an equal block of the
    indexes, the last one the rest), and with ``topics`` > 1 per publisher and topic (index mod
    ``topics``, the publisher's round-robin): in a partitioned cluster a publisher's topics go
    through different primaries, so only each topic's order holds."""

    def __init__(self, n: int, space: int = 0, warmup: int = 0, publishers: int = 1, topics: int = 1) -> None:
        self.n, self.seen, self.got, self.dups, self.ooo = n, bytearray(space or n), 0, 0, 0
        self.warmup, self.publishers, self.topics = warmup, publishers, topics
        self.block = max(1, len(self.seen) // publishers)
        self.lasts = [-1] * (publishers * topics)  # the last index of each (publisher, topic) stream
        self.single = publishers * topics == 1  # (one stream: its index is 0)
        self.lat: list[float] = []
        self.first = self.last_t = 0.0

    def take(self, payload: bytes) -> bool:
        """Count one message; True once all ``n`` came. (The same work for every system's
        subscriber, so it is kept short: its lookups local, one stream's index computed as 0.)"""
        now = _monotonic()
        idx, sent = _unpack(payload)
        if not self.first:
            self.first = now
        self.last_t = now
        seen = self.seen
        if idx >= len(seen) or seen[idx]:
            self.dups += 1
            return False
        seen[idx] = 1
        self.got = got = self.got + 1
        stream = 0 if self.single else min(idx // self.block, self.publishers - 1) * self.topics + idx % self.topics
        lasts = self.lasts
        if idx < lasts[stream]:
            self.ooo += 1
        lasts[stream] = idx
        if idx >= self.warmup:
            self.lat.append(now - sent)
        if _HOPS is not None:
            _HOPS.append((int(now * 1e9), "app", idx))
        return got >= self.n

    def idle_for(self, idle: float, start: float) -> bool:
        """Nothing came for ``idle`` seconds (before the first message: four times that)."""
        return time.monotonic() - (self.last_t or start) >= idle * (1 if self.last_t else 4)

    def result(self, cpu0: float) -> dict[str, Any]:
        return Tally.merged([self], cpu0)

    @staticmethod
    def merged(tallies: list[Tally], cpu0: float) -> dict[str, Any]:
        """What the subscribers of one process saw, summed (its role's result)."""
        firsts = [t.first for t in tallies if t.first]
        return {"received": sum(t.got for t in tallies), "lost": sum(t.n - t.got for t in tallies),
                "duplicated": sum(t.dups for t in tallies), "out_of_order": sum(t.ooo for t in tallies),
                "first": min(firsts, default=0.0), "last": max(t.last_t for t in tallies),
                "latencies": [x for t in tallies for x in t.lat], "cpu": cpu_seconds() - cpu0}  # fmt: skip


def payload(i: int, pad: bytes) -> bytes:
    return HEAD.pack(i, time.monotonic()) + pad


async def _pace(t0: float, i: int, rate: float, sleep: Any) -> None:
    """Wait until message ``i`` is due at ``rate`` a second from ``t0`` (paced workloads, W3;
    an unpaced loop does not call it: awaiting it costs ~0.1 us a message)."""
    delay = t0 + i / rate - time.monotonic()
    if delay > 0:
        await sleep(delay)


# ------------------------------------------------------------------ Roost (trio)


async def roost_sub(addr: str, topics: list[str], mode: str, n: int, idle: float, space: int, warmup: int,
                    clients: int = 1, publishers: int = 1, order_topics: int = 1) -> dict[str, Any]:  # fmt: skip
    """``clients`` subscribers in this process (each a Client of its own, with its own socket and
    a subscription to every topic: scripts/benchcluster.py's 1,000 subscribers do not fit in
    1,000 processes), ready once all are subscribed, done once all have their ``n``."""
    import trio

    from roost.client import Client, ClientConfig

    cpu0 = cpu_seconds()
    tallies = [Tally(n, space, warmup, publishers, order_topics) for _ in range(clients)]
    subscribed, finished, done = [0], [0], trio.Event()

    async def subscriber(tally: Tally) -> None:
        async with Client(addr, config=ClientConfig(max_buffered=1_000_000)) as c, trio.open_nursery() as nursery:

            async def one(topic: str) -> None:
                async with c.subscribe(topic, mode=mode) as sub:
                    subscribed[0] += 1
                    if subscribed[0] == clients * len(topics):
                        print("ready", flush=True)
                    async for msg in sub:  # (the README's way)
                        if tally.take(msg.payload):
                            finished[0] += 1
                            if finished[0] == clients:
                                done.set()
                            return

            for t in topics:
                nursery.start_soon(one, t)

    async with trio.open_nursery() as nursery:

        async def watchdog() -> None:
            start = time.monotonic()
            while not done.is_set() and not all(t.idle_for(idle, start) for t in tallies):
                with trio.move_on_after(idle / 4):
                    await done.wait()
            nursery.cancel_scope.cancel()

        for tally in tallies:
            nursery.start_soon(subscriber, tally)
        nursery.start_soon(watchdog)
    return Tally.merged(tallies, cpu0)


async def roost_pub(addr: str, topics: list[str], mode: str, n: int, size: int, rate: float,
                    offset: int = 0) -> dict[str, Any]:  # fmt: skip
    """Indexes ``offset`` ... ``offset + n - 1`` (several publishers: a block each), index i to
    topic i mod len(topics)."""
    import trio

    from roost.client import Client
    from roost.client.wire import WireError

    pad, cpu0 = b"x" * max(0, size - HEAD.size), cpu_seconds()
    async with Client(addr) as c:
        t0 = time.monotonic()
        k = len(topics)
        try:
            for i in range(offset, offset + n):
                if rate:  # (unpaced: no await of a pacing coroutine per message, as in mosquitto_pub)
                    await _pace(t0, i - offset, rate, trio.sleep)
                await c.publish(topics[i % k], payload(i, pad), mode=mode)
        except WireError as e:  # (a fire message larger than a datagram: the run cannot be made)
            return {"refused": str(e)}
        t1 = time.monotonic()
        ok = await c.flush(timeout=60) if mode == "reliable" else True
    return {"sent": n, "publish_s": t1 - t0, "all_acked": ok, "cpu": cpu_seconds() - cpu0}


# ------------------------------------------------------------------ NATS (nats-py, asyncio)


async def nats_sub(addr: str, topics: list[str], mode: str, n: int, idle: float, space: int,
                    warmup: int) -> dict[str, Any]:  # fmt: skip
    import nats

    cpu0, tally = cpu_seconds(), Tally(n, space, warmup)
    nc = await nats.connect(f"nats://{addr}")
    done = asyncio.Event()

    async def cb(msg: Any) -> None:
        if tally.take(msg.data):
            done.set()

    for t in topics:  # (no pending limit: a slow consumer must not drop what it is counting)
        await nc.subscribe(t, cb=cb, pending_msgs_limit=-1, pending_bytes_limit=-1)
    await nc.flush()
    print("ready", flush=True)
    await _idle_wait(done, tally, idle)
    await nc.close()
    return tally.result(cpu0)


async def nats_pub(addr: str, topics: list[str], mode: str, n: int, size: int, rate: float) -> dict[str, Any]:
    import nats

    pad, cpu0, k = b"x" * max(0, size - HEAD.size), cpu_seconds(), len(topics)
    nc = await nats.connect(f"nats://{addr}", flush_timeout=60)
    t0 = time.monotonic()
    for i in range(n):
        if rate:
            await _pace(t0, i, rate, asyncio.sleep)
        await nc.publish(topics[i % k], payload(i, pad))
    t1 = time.monotonic()
    await nc.flush(timeout=60)
    await nc.close()
    return {"sent": n, "publish_s": t1 - t0, "all_acked": True, "cpu": cpu_seconds() - cpu0}


async def _idle_wait(done: asyncio.Event, tally: Tally, idle: float) -> None:
    """Until every message came, or none came for ``idle`` seconds (after the first)."""
    start = time.monotonic()
    while not done.is_set():
        try:
            await asyncio.wait_for(done.wait(), timeout=idle / 4)
        except TimeoutError:
            if tally.idle_for(idle, start):
                return


# ------------------------------------------------------------------ Redis (redis-py asyncio)


async def redis_sub(addr: str, topics: list[str], mode: str, n: int, idle: float, space: int,
                    warmup: int) -> dict[str, Any]:  # fmt: skip
    import redis.asyncio as aioredis

    host, port = addr.rsplit(":", 1)
    cpu0, tally = cpu_seconds(), Tally(n, space, warmup)
    r = aioredis.Redis(host=host, port=int(port))
    ps = r.pubsub()
    await ps.subscribe(*topics)
    for _ in topics:  # (the subscribe confirmations)
        await ps.get_message(timeout=5)
    print("ready", flush=True)
    done = asyncio.Event()

    async def reader() -> None:
        async for m in ps.listen():
            if m["type"] == "message" and tally.take(m["data"]):
                done.set()
                return

    task = asyncio.create_task(reader())
    await _idle_wait(done, tally, idle)
    task.cancel()
    await ps.aclose()
    await r.aclose()
    return tally.result(cpu0)


async def redis_pub(addr: str, topics: list[str], mode: str, n: int, size: int, rate: float) -> dict[str, Any]:
    import redis.asyncio as aioredis

    host, port = addr.rsplit(":", 1)
    pad, cpu0, k = b"x" * max(0, size - HEAD.size), cpu_seconds(), len(topics)
    r = aioredis.Redis(host=host, port=int(port))
    t0 = time.monotonic()
    for i in range(n):  # (one PUBLISH per message, each answered: the usual way)
        if rate:
            await _pace(t0, i, rate, asyncio.sleep)
        await r.publish(topics[i % k], payload(i, pad))
    t1 = time.monotonic()
    await r.aclose()
    return {"sent": n, "publish_s": t1 - t0, "all_acked": True, "cpu": cpu_seconds() - cpu0}


# ------------------------------------------------------------------ Mosquitto (paho-mqtt, its own thread)


QUEUE_SIZE = 15  # paho's MQTT_ERR_QUEUE_SIZE


def _mqtt(addr: str) -> Any:
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    host, port = addr.rsplit(":", 1)
    c = mqtt.Client(CallbackAPIVersion.VERSION2)
    c.max_inflight_messages_set(1000)
    c.max_queued_messages_set(0)
    c.connect(host, int(port))
    return c


def mosquitto_sub(addr: str, topics: list[str], mode: str, n: int, idle: float, space: int,
                    warmup: int) -> dict[str, Any]:  # fmt: skip
    cpu0, tally, done = cpu_seconds(), Tally(n, space, warmup), threading.Event()
    c = _mqtt(addr)
    subscribed = threading.Event()
    c.on_message = lambda _c, _u, msg: done.set() if tally.take(msg.payload) else None
    c.on_subscribe = lambda *_: subscribed.set()
    c.loop_start()
    c.subscribe([(t, 1 if mode == "reliable" else 0) for t in topics])
    subscribed.wait(10)
    print("ready", flush=True)
    start = time.monotonic()
    while not done.wait(idle / 4):
        if tally.idle_for(idle, start):
            break
    c.disconnect()
    c.loop_stop()
    return tally.result(cpu0)


def mosquitto_pub(addr: str, topics: list[str], mode: str, n: int, size: int, rate: float) -> dict[str, Any]:
    pad, cpu0, k, qos = b"x" * max(0, size - HEAD.size), cpu_seconds(), len(topics), 1 if mode == "reliable" else 0
    c = _mqtt(addr)
    c.loop_start()
    t0 = time.monotonic()
    info = None
    for i in range(n):
        if rate:
            delay = t0 + i / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        info = c.publish(topics[i % k], payload(i, pad), qos=qos)
        while info.rc == QUEUE_SIZE:  # (QoS 1: 65,535 message ids in flight, the next one taken: wait)
            time.sleep(0.001)
            info = c.publish(topics[i % k], payload(i, pad), qos=qos)
    t1 = time.monotonic()
    if info is not None:
        info.wait_for_publish(60)
    c.disconnect()
    c.loop_stop()
    return {"sent": n, "publish_s": t1 - t0, "all_acked": True, "cpu": cpu_seconds() - cpu0}


def run_role(role: str, system: str, addr: str, topics: list[str], mode: str, n: int, size: int, rate: float,
             idle: float, space: int, warmup: int, offset: int = 0, clients: int = 1, publishers: int = 1,
             order_topics: int = 1) -> dict[str, Any]:  # fmt: skip
    """Play one role in this process (scripts/bench.py starts one process per role). Several
    publishers (``offset``, ``publishers``, ``order_topics``) and several subscribers in one
    process (``clients``) are Roost's only: the cluster and scaling runs (scripts/benchcluster.py)."""
    if system == "roost":
        import trio

        if role == "sub":
            return trio.run(roost_sub, addr, topics, mode, n, idle, space, warmup, clients, publishers, order_topics)
        return trio.run(roost_pub, addr, topics, mode, n, size, rate, offset)
    if (offset, clients, publishers, order_topics) != (0, 1, 1, 1):
        raise ValueError(f"{system}: one publisher and one subscriber per process only (Roost's runs have more)")
    if system == "mosquitto":
        return mosquitto_sub(addr, topics, mode, n, idle, space, warmup) if role == "sub" else \
            mosquitto_pub(addr, topics, mode, n, size, rate)  # fmt: skip
    sub, pub = {"nats": (nats_sub, nats_pub), "redis": (redis_sub, redis_pub)}[system]
    if role == "sub":
        return asyncio.run(sub(addr, topics, mode, n, idle, space, warmup))
    return asyncio.run(pub(addr, topics, mode, n, size, rate))


# ------------------------------------------------------------------ role processes


def spawn(args: list[str]) -> subprocess.Popen[str]:
    """A role process (``scripts/bench.py --role ...``): a subscriber prints ``ready`` once
    subscribed, every role its result as one JSON line at the end."""
    return subprocess.Popen([sys.executable, os.path.join(ROOT, "scripts", "bench.py"), *args],
                            stdout=subprocess.PIPE, text=True, cwd=ROOT)  # fmt: skip


def said_ready(procs: list[subprocess.Popen[str]], timeout: float) -> None:
    """Until every subscriber process has said ``ready``, ``timeout`` seconds for all of them;
    RuntimeError when one exits first or time runs out (the caller stops them)."""
    deadline = time.monotonic() + timeout
    for p in procs:
        assert p.stdout is not None
        readable, _, _ = select.select([p.stdout], [], [], max(0.0, deadline - time.monotonic()))
        line = p.stdout.readline().strip() if readable else ""
        if line != "ready":
            why = f"exited with {p.poll()}" if p.poll() is not None else f"not ready within {timeout:g} s"
            raise RuntimeError(f"a subscriber process (pid {p.pid}) {why}: {line[:200]!r}")


def results(procs: list[subprocess.Popen[str]], deadline: float) -> list[dict[str, Any]]:
    """Each role process's JSON result, waiting until ``deadline`` (time.monotonic()) at most
    (subprocess.TimeoutExpired then; the caller stops them)."""
    out = []
    for p in procs:
        stdout, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        lines = stdout.strip().splitlines()
        if p.returncode != 0 or not lines:
            raise RuntimeError(f"a role process (pid {p.pid}) exited with {p.returncode}")
        out.append(json.loads(lines[-1]))
    return out


def stop_all(procs: list[subprocess.Popen[str]]) -> None:
    """Kill the role processes that still run (by their pid) and reap them."""
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(10)
