"""Cluster state figures: memory per subscription and PULL time of a state dump.

    python scripts/cluster_state.py                      # replicated, 1,000,000 subscriptions
    python scripts/cluster_state.py --subs 100000        # smaller
    python scripts/cluster_state.py --mode partitioned   # 5 partitioned members, 200,000 subscriptions

Replicated mode (the default):

1. Start member n1 of a 2-member cluster (n2 not running) on free loopback ports.
2. Fill it with ``--subs`` subscriptions: ``--clients`` binary clients (raw
   HELLO/CMDS frames, 100 commands per datagram), each subscribing to
   ``subs/clients`` topics drawn from ``--topics`` topics.
3. Memory per subscription = growth of n1's resident set (VmRSS) / subscriptions.
4. Start n2: it PULLs the dump from n1. PULL time is the time between n2's
   ``link_up peer=n1`` (when it sends the PULL) and ``pulled peer=n1`` log
   lines (transfer and merge); also reported: process start to serving.

Partitioned mode (``--mode partitioned``):

1. Start 5 members (``partitions = 256``, ``replicas = 2``) on free loopback ports.
2. Fill them with ``--subs`` subscriptions over ``--topics`` topics, each sent
   to its topic's primary: the members' map comes in a WELCOME, and each
   member gets its own raw clients (one client id, one home member, as the
   client library's router does), ``--window`` of them with a CMDS batch in
   flight at a time. A member CMDACKs only once the partition's owners hold
   the batch; the bench then polls STATUS until the members hold
   ``replicas`` x ``--subs`` subscriptions between them.
3. Per member: subscriptions held (STATUS ``subscriptions``: the index, which
   holds only partitions the member owns), held / total (ideally
   replicas / 5 = 0.40), primaries, and VmRSS growth.
4. SIGKILL one member (``--kill``), wait for the takeover (the others' maps
   leave it out, and its partitions are back to ``replicas`` copies among the
   survivors), start it again, and measure the time until it serves (client
   port bound) and until it leads its primaries again, and what it PULLed
   (its ``pulled peer=... subscriptions=...`` log lines: only the partitions
   it owns, from every peer in turn) against the full dump that a restarted
   member of a replicated cluster PULLs.

Every wait is bounded; the bench stops the processes it started (by their
PIDs) and removes its temp dir.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from typing import IO, Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from roost.client import (  # noqa: E402
    clustermap,
    decoding,
    wire,
)
from roost.client.wire import FrameType  # noqa: E402
from roost.node.procs import free_udp_port, probe_status, probe_welcome, wait_listening  # noqa: E402

Cmd = tuple[int, str, str | None, int]
MEMBERS = ("n1", "n2", "n3", "n4", "n5")
#: [cluster] settings of the partitioned bench (``--set KEY=VALUE`` overrides or adds one).
#: No snapshots: the restarted member PULLs everything it owns. A failure detector more
#: tolerant than the defaults (suspect_after 0.6 s, down_after 1.5 s): on this 2-core VM five
#: members and the bench share the cores, and a member that spends seconds in one map change
#: (see docs/performance.md) would otherwise hold every peer down at once.
BENCH_SETTINGS = {"pull_timeout": "60", "snapshot_interval": "86400", "suspect_after": "4", "down_after": "10"}


#: Every benchmark client runs on 127.0.0.1: one source host, which the node's per-host budgets
#: (docs/security.md) would stop long before a million subscriptions.
ONE_HOST = (
    f"max_subscriptions_per_host = 1000000000\nmax_filter_bytes_per_host = {1 << 40}\nmax_filter_bytes = {1 << 40}\n"
)


def free_tcp_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))  # type: ignore[union-attr]


# ---------------------------------------------------------------- member logs

_LINE = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3})Z \S+ node=\S+ event=(\S+)(.*)$")
_FIELD = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S*)')


def log_events(text: str) -> list[tuple[float, str, dict[str, str]]]:
    """(Unix time, event, fields) of every line of a member's logfmt log (node/logs.py)."""
    out = []
    for line in text.splitlines():
        m = _LINE.match(line)
        if m is None:
            continue
        t = datetime.datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S.%f").replace(tzinfo=datetime.UTC)
        out.append((t.timestamp(), m.group(2), {k: v.strip('"') for k, v in _FIELD.findall(m.group(3))}))
    return out


def first(events: list[tuple[float, str, dict[str, str]]], event: str, **fields: str) -> float | None:
    """The time of the first ``event`` whose fields include ``fields``."""
    for t, e, f in events:
        if e == event and all(f.get(k) == v for k, v in fields.items()):
            return t
    return None


# ---------------------------------------------------------------- replicated mode


def populate(port: int, clients: int, per_client: int, topics: int) -> float:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    s.settimeout(10)
    node = ("127.0.0.1", port)
    t0 = time.monotonic()
    n = 0
    for c in range(clients):
        cid = c.to_bytes(16, "big")
        s.sendto(wire.encode_hello(cid), node)
        cookie = decoding.decode_untrusted_frame(s.recv(70000))[2]
        cmds: list[Cmd] = [(1, f"topic.{(c * per_client + j) % topics}", None, j % 2) for j in range(per_client)]
        for b in range(0, per_client, 100):
            s.sendto(wire.encode_cmds(cid, cookie, 1, b // 100 + 1, cmds[b : b + 100]), node)
            f = decoding.decode_untrusted_frame(s.recv(70000))
            assert f[0] is FrameType.CMDACK and not any(f[3]), f
            n += len(cmds[b : b + 100])
    s.close()
    return time.monotonic() - t0


def replicated(a: argparse.Namespace) -> int:
    subs = 1_000_000 if a.subs is None else a.subs
    clients = 10_000 if a.clients is None else a.clients
    per_client = subs // clients
    tmp = tempfile.mkdtemp(prefix="roost-bench-")
    ports = {i: (free_udp_port(), free_tcp_port()) for i in ("n1", "n2")}
    cfg = os.path.join(tmp, "cluster.toml")
    with open(cfg, "w") as f:
        f.write('[cluster]\nsecret = "bench-secret-0123456789"\nchunk_subscriptions = 50000\n'
                "pull_timeout = 300\nsnapshot_interval = 86400\nmax_peer_queue = 1000\n")  # fmt: skip
        for i, (u, t) in ports.items():
            f.write(f'[[members]]\nid = "{i}"\nclient_addr = "127.0.0.1:{u}"\npeer_addr = "127.0.0.1:{t}"\n'
                    f'data_dir = "{tmp}/{i}"\n')  # fmt: skip
        f.write(f'[node]\nlog_level = "info"\n[limits]\nmax_per_host = {clients + 10}\n'
                f"max_clients = {clients + 10}\n{ONE_HOST}[timeouts]\nsubscriber_timeout = 86400\n")  # fmt: skip
    logs = {i: open(os.path.join(tmp, f"{i}.log"), "w+") for i in ports}  # noqa: SIM115
    cmd = [sys.executable, "-m", "roost", "node", "--config", cfg, "--id"]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        n1 = subprocess.Popen([*cmd, "n1"], cwd=ROOT, stderr=logs["n1"])
        procs.append(n1)
        wait_listening(n1, "127.0.0.1", ports["n1"][0], timeout=60)
        time.sleep(0.5)
        before = rss_kib(n1.pid)
        took = populate(ports["n1"][0], clients, per_client, a.topics)
        time.sleep(0.5)
        after = rss_kib(n1.pid)
        total = clients * per_client
        print(f"# roost cluster bench: {total:,} subscriptions = {clients:,} clients x {per_client} "
              f"over {a.topics:,} topics (half fire, half reliable)")  # fmt: skip
        print(f"populate via UDP: {took:.1f} s ({total / took:,.0f} subscriptions/s)")
        print(f"n1 resident memory: {before / 1024:.1f} MiB before, {after / 1024:.1f} MiB after")
        print(f"memory per subscription: {(after - before) * 1024 / total:.0f} bytes")
        t0 = time.monotonic()
        n2 = subprocess.Popen([*cmd, "n2"], cwd=ROOT, stderr=logs["n2"])
        procs.append(n2)
        wait_listening(n2, "127.0.0.1", ports["n2"][0], timeout=300)
        ready = time.monotonic() - t0
        logs["n2"].flush()
        with open(os.path.join(tmp, "n2.log")) as f:
            text = f.read()
        events = log_events(text)
        m = re.search(r"event=pulled peer=n1 subscriptions=(\d+)", text)
        sent, done = first(events, "link_up", peer="n1"), first(events, "pulled", peer="n1")
        if m is None or sent is None or done is None:
            print("n2 did not log a PULL (log level hides it?)", text[-500:])
            return 1
        print(f"PULL by a starting member: {int(m.group(1)):,} subscriptions in {done - sent:.2f} s "
              f"(process start to serving: {ready:.2f} s)")  # fmt: skip
        print(f"n2 resident memory after the PULL: {rss_kib(n2.pid) / 1024:.1f} MiB")
        return 0
    finally:
        stop(procs)
        for f in logs.values():
            f.close()
        shutil.rmtree(tmp, ignore_errors=True)


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM to each process we started that still runs, then SIGKILL to any left after 15 s."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


# ---------------------------------------------------------------- partitioned mode


def progress(what: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {what}", file=sys.stderr, flush=True)


def held_list(st: dict[str, dict[str, Any]]) -> str:
    return ", ".join(f"{m} {s['subscriptions']:,}" for m, s in st.items())


def wait_for(cond: Callable[[], bool], timeout: float, interval: float = 0.1) -> float | None:
    """Seconds until ``cond()`` held, or None if it did not within ``timeout``."""
    t0 = time.monotonic()
    while True:
        if cond():
            return time.monotonic() - t0
        if time.monotonic() - t0 >= timeout:
            return None
        time.sleep(interval)


def plan(cmap: clustermap.ClusterMap, subs: int, per_client: int, topics: int) -> dict[str, list[list[Cmd]]]:
    """Per member, its clients' subscriptions: subscription j is to ``topic.{j % topics}``
    (half fire, half reliable), sent by a client of that topic's primary."""
    by_primary: dict[str, list[Cmd]] = {m: [] for m in sorted(cmap.members)}
    for j in range(subs):
        topic = f"topic.{j % topics}"
        primary = cmap.primary(topic)
        assert primary is not None, topic
        by_primary[primary].append((1, topic, None, j % 2))
    out = {}
    for m, cmds in by_primary.items():
        clients = [cmds[i : i + per_client] for i in range(0, len(cmds), per_client)]
        for c in clients:
            if len({cmd[1] for cmd in c}) != len(c):
                raise SystemExit(f"--topics {topics} is too few for {per_client} distinct topics per client "
                                 f"among {m}'s primaries: raise --topics or --clients")  # fmt: skip
        out[m] = clients
    return out


class _Client:
    def __init__(self, session: int, cmds: list[Cmd]) -> None:
        self.session = session
        self.cid = session.to_bytes(16, "big")
        self.cookie = b""
        self.batches = [cmds[i : i + 100] for i in range(0, len(cmds), 100)]
        self.next = 0  # batches sent


def populate_partitioned(ports: dict[str, int], work: dict[str, list[list[Cmd]]], window: int,
                         timeout: float) -> tuple[float, int]:  # fmt: skip
    """Every member's clients subscribe at that member: per member one HELLO in flight at a
    time (a WELCOME does not name the client), then up to ``window`` clients with a CMDS batch
    in flight, matched to their CMDACK by (session, batch). Lost datagrams are sent again after
    2 s. Returns (seconds, datagrams sent again)."""
    session = 0
    socks: dict[str, socket.socket] = {}
    hello_q: dict[str, deque[_Client]] = {}
    ready_q: dict[str, deque[_Client]] = {}
    hello: dict[str, tuple[_Client, float] | None] = {}
    inflight: dict[str, dict[tuple[int, int], tuple[_Client, bytes, float]]] = {}
    for m, clients in work.items():
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        s.setblocking(False)
        socks[m] = s
        q: deque[_Client] = deque()
        for cmds in clients:
            session += 1
            q.append(_Client(session, cmds))
        hello_q[m], ready_q[m], hello[m], inflight[m] = q, deque(), None, {}
    by_sock = {s.fileno(): m for m, s in socks.items()}
    resent = 0
    t0 = time.monotonic()

    def send_batch(m: str, c: _Client) -> None:
        b = c.next
        c.next += 1
        data = wire.encode_cmds(c.cid, c.cookie, c.session, b + 1, c.batches[b])
        socks[m].sendto(data, ("127.0.0.1", ports[m]))
        inflight[m][(c.session, b + 1)] = (c, data, time.monotonic())

    def step(m: str) -> bool:
        """Start what can start at member m; True once its clients are all done."""
        now = time.monotonic()
        if hello[m] is None and hello_q[m]:
            c = hello_q[m].popleft()
            socks[m].sendto(wire.encode_hello(c.cid), ("127.0.0.1", ports[m]))
            hello[m] = (c, now)
        while ready_q[m] and len(inflight[m]) < window:
            send_batch(m, ready_q[m].popleft())
        return hello[m] is None and not hello_q[m] and not ready_q[m] and not inflight[m]

    try:
        while not all([step(m) for m in work]):
            now = time.monotonic()
            if now - t0 > timeout:
                raise RuntimeError(f"populate did not finish within {timeout} s")
            readable, _, _ = select.select(list(socks.values()), [], [], 0.2)
            for s in readable:
                m = by_sock[s.fileno()]
                while True:
                    try:
                        data = s.recv(70000)
                    except BlockingIOError:
                        break
                    f = decoding.decode_untrusted_frame(data)
                    if f[0] is FrameType.WELCOME:
                        h = hello[m]
                        if h is not None:
                            h[0].cookie = f[2]
                            ready_q[m].append(h[0])
                            hello[m] = None
                    elif f[0] is FrameType.CMDACK:
                        got = inflight[m].pop((f[1], f[2]), None)
                        if got is None:
                            continue  # (the answer to a datagram sent twice)
                        assert not any(f[3]), f
                        c = got[0]
                        if c.next < len(c.batches):
                            send_batch(m, c)
                    elif f[0] is FrameType.ERROR:
                        raise RuntimeError(f"{m} answered {f}")
                    # (REDIRECT: none expected, every SUB goes to its primary; counted by the member)
            for m in work:
                h = hello[m]
                if h is not None and now - h[1] > 2:
                    socks[m].sendto(wire.encode_hello(h[0].cid), ("127.0.0.1", ports[m]))
                    hello[m] = (h[0], now)
                    resent += 1
                for key, (c, data, sent) in list(inflight[m].items()):
                    if now - sent > 2:
                        socks[m].sendto(data, ("127.0.0.1", ports[m]))
                        inflight[m][key] = (c, data, now)
                        resent += 1
    finally:
        for s in socks.values():
            s.close()
    return time.monotonic() - t0, resent


class Members:
    """The 5 member processes we started, by id, their logs and their STATUS."""

    def __init__(self, tmp: str, cfg: str, ports: dict[str, tuple[int, int]]) -> None:
        self.tmp, self.cfg, self.ports = tmp, cfg, ports
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.started: list[subprocess.Popen[bytes]] = []
        self.logs: list[IO[bytes]] = []

    def start(self, m: str, log_name: str) -> subprocess.Popen[bytes]:
        log = open(os.path.join(self.tmp, log_name), "wb")  # noqa: SIM115 - closed in close()
        self.logs.append(log)
        p = subprocess.Popen([sys.executable, "-m", "roost", "node", "--config", self.cfg, "--id", m],
                             cwd=ROOT, stdout=log, stderr=log)  # fmt: skip
        self.procs[m] = p
        self.started.append(p)
        return p

    def log(self, log_name: str) -> str:
        with open(os.path.join(self.tmp, log_name)) as f:
            return f.read()

    def status(self, m: str) -> dict[str, Any] | None:
        return probe_status("127.0.0.1", self.ports[m][0], timeout=4.0)

    def statuses(self, ids: list[str]) -> dict[str, dict[str, Any]] | None:
        out = {}
        for m in ids:
            st = self.status(m)
            if st is None:
                return None
            out[m] = st
        return out

    def close(self) -> None:
        stop(self.started)
        for f in self.logs:
            f.close()


def partitioned(a: argparse.Namespace) -> int:
    subs = 200_000 if a.subs is None else a.subs
    clients = 2_000 if a.clients is None else a.clients
    per_client = max(1, subs // clients)
    ids = list(MEMBERS)
    if a.kill not in ids:
        raise SystemExit(f"--kill must be one of {', '.join(ids)}")
    tmp = tempfile.mkdtemp(prefix="roost-pbench-")
    ports = {i: (free_udp_port(), free_tcp_port()) for i in ids}
    cfg = os.path.join(tmp, "cluster.toml")
    limit = clients + 100
    settings = dict(BENCH_SETTINGS)
    for kv in a.set:
        key, sep, value = kv.partition("=")
        if not sep:
            raise SystemExit(f"--set {kv!r}: expected KEY=VALUE")
        settings[key.strip()] = value.strip()
    with open(cfg, "w") as f:
        f.write(f'[cluster]\nsecret = "bench-secret-0123456789"\nmode = "partitioned"\npartitions = {a.partitions}\n'
                f"replicas = {a.replicas}\n")  # fmt: skip
        for key, value in settings.items():
            f.write(f"{key} = {value}\n")
        for i, (u, t) in ports.items():
            f.write(f'[[members]]\nid = "{i}"\nclient_addr = "127.0.0.1:{u}"\npeer_addr = "127.0.0.1:{t}"\n'
                    f'data_dir = "{tmp}/data/{i}"\n')  # fmt: skip
        f.write(f'[node]\nlog_level = "info"\n[limits]\nmax_per_host = {limit}\n'
                f"max_clients = {limit}\n{ONE_HOST}[timeouts]\nsubscriber_timeout = 86400\n")  # fmt: skip
    c = Members(tmp, cfg, ports)
    t_start = time.monotonic()
    try:
        for m in ids:
            c.start(m, f"{m}.log")
        for m in ids:
            wait_listening(c.procs[m], "127.0.0.1", ports[m][0], timeout=60)

        def all_live(among: list[str], live: list[str]) -> Callable[[], bool]:
            def cond() -> bool:
                st = c.statuses(among)
                return st is not None and all(s.get("map", {}).get("live") == live for s in st.values())

            return cond

        if wait_for(all_live(ids, ids), 30) is None:
            print("the members did not all see each other live within 30 s")
            return 1
        time.sleep(0.5)
        before = {m: rss_kib(c.procs[m].pid) for m in ids}
        w = probe_welcome("127.0.0.1", ports["n1"][0], timeout=2.0)
        assert w is not None
        cmap = w[5]
        if cmap is None:  # (the WELCOME had no room for the map: compute it as the members do)
            members = {m: (("127.0.0.1", u), ("127.0.0.1", t)) for m, (u, t) in ports.items()}
            cmap = clustermap.compute(0, members, ids, a.partitions, a.replicas)
        work = plan(cmap, subs, per_client, a.topics)
        nclients = sum(len(x) for x in work.values())
        progress(f"populating {subs:,} subscriptions")
        took, resent = populate_partitioned({m: p[0] for m, p in ports.items()}, work, a.window, timeout=300)

        def held(among: list[str], want: int) -> Callable[[], bool]:
            def cond() -> bool:
                st = c.statuses(among)
                return st is not None and sum(s["subscriptions"] for s in st.values()) == want

            return cond

        copies = a.replicas * subs
        progress(f"populated in {took:.1f} s; waiting for {copies:,} copies")
        settled = wait_for(held(ids, copies), 60)
        progress("settled" if settled is not None else "not settled")
        time.sleep(0.5)
        st = c.statuses(ids)
        assert st is not None
        after = {m: rss_kib(c.procs[m].pid) for m in ids}
        count = {m: int(st[m]["subscriptions"]) for m in ids}
        ideal = a.replicas / len(ids)
        print(f"# roost cluster bench, partitioned: {len(ids)} members, partitions {a.partitions}, replicas "
              f"{a.replicas}; {subs:,} subscriptions from {nclients:,} clients (up to {per_client} each) "
              f"over {a.topics:,} topics (half fire, half reliable), each at its topic's primary")  # fmt: skip
        print(f"[cluster] settings: {', '.join(f'{k} = {v}' for k, v in settings.items())}")
        print(f"populate via UDP: {took:.1f} s ({subs / took:,.0f} subscriptions/s; CMDACK once both owners "
              f"hold a batch; {resent} datagrams sent again)")  # fmt: skip
        if settled is None:
            print(f"NOT replicated within 60 s: the members hold {sum(count.values()):,}, expected {copies:,}")
        else:
            print(f"replicated: the members hold {sum(count.values()):,} = {a.replicas} x {subs:,} "
                  f"({settled:.1f} s after the last CMDACK)")  # fmt: skip
        print(f"{'member':8} {'held':>10} {'held/total':>10} {'primaries':>9} {'owned':>6} "
              f"{'RSS before':>11} {'RSS after':>10} {'growth':>9} {'bytes/held':>10}")  # fmt: skip
        for m in ids:
            mp = st[m].get("map", {})
            grow = after[m] - before[m]
            print(f"{m:8} {count[m]:>10,} {count[m] / subs:>10.3f} {mp.get('primary', '?'):>9} "
                  f"{mp.get('owned', '?'):>6} "
                  f"{before[m] / 1024:>7.1f} MiB {after[m] / 1024:>6.1f} MiB {grow / 1024:>5.1f} MiB "
                  f"{grow * 1024 / max(1, count[m]):>10.0f}")  # fmt: skip
        grow_all = sum(after.values()) - sum(before.values())
        print(f"{'total':8} {sum(count.values()):>10,} {sum(count.values()) / subs:>10.3f} "
              f"{sum(int(st[m].get('map', {}).get('primary', 0)) for m in ids):>9} "
              f"{sum(int(st[m].get('map', {}).get('owned', 0)) for m in ids):>6} "
              f"{sum(before.values()) / 1024:>7.1f} MiB {sum(after.values()) / 1024:>6.1f} MiB "
              f"{grow_all / 1024:>5.1f} MiB {grow_all * 1024 / max(1, sum(count.values())):>10.0f}")  # fmt: skip
        ratios = [count[m] / subs for m in ids]
        print(f"held/total per member: {', '.join(f'{m} {r:.3f}' for m, r in zip(ids, ratios, strict=True))} "
              f"(min {min(ratios):.3f}, max {max(ratios):.3f}; ideal replicas/{len(ids)} = {ideal:.2f})")  # fmt: skip

        # ---- SIGKILL one member, wait for the takeover, start it again
        victim = a.kill
        others = [m for m in ids if m != victim]
        led = int(st[victim]["map"]["primary"])
        p = c.procs[victim]
        pid = p.pid
        p.kill()  # SIGKILL, by the PID we started
        p.wait(10)
        t_kill = time.monotonic()
        print(f"killed {victim} (pid {pid}, {count[victim]:,} subscriptions held, {led} primaries) with SIGKILL")
        gone = wait_for(all_live(others, others), 30)
        again = wait_for(held(others, copies), 60) if gone is not None else None
        st2 = c.statuses(others) or {}
        if gone is None or again is None:
            seen = "not seen" if gone is None else f"after {gone:.1f} s"
            print(f"takeover NOT complete: map without {victim} {seen}, "
                  f"survivors hold {sum(s['subscriptions'] for s in st2.values()):,} of {copies:,}")  # fmt: skip
        else:
            print(f"takeover: every survivor's map without {victim} {gone:.1f} s after the kill; its partitions "
                  f"back to {a.replicas} copies {time.monotonic() - t_kill:.1f} s after the kill (survivors hold "
                  f"{sum(s['subscriptions'] for s in st2.values()):,}: "
                  f"{held_list(st2)})")  # fmt: skip
        t0 = time.monotonic()
        p = c.start(victim, f"{victim}.restart.log")
        wait_listening(p, "127.0.0.1", ports[victim][0], timeout=120)
        serving = time.monotonic() - t0
        time.sleep(0.2)  # (the log lines of the start-up reach the file)
        events = log_events(c.log(f"{victim}.restart.log"))
        pulls = [(f["peer"], int(f["subscriptions"])) for _, e, f in events if e == "pulled"]
        failed = [(f.get("peer", "?"), f.get("reason", "?")) for _, e, f in events if e == "pull_failed"]
        t_begin, t_ready = first(events, "node_starting"), first(events, "node_ready")
        ready_subs = next((int(f["subscriptions"]) for _, e, f in events if e == "node_ready"), None)
        pulled = sum(n for _, n in pulls)
        sync = f"{t_ready - t_begin:.2f} s" if t_begin is not None and t_ready is not None else "?"
        print(f"restarted {victim} serving again {serving:.2f} s after its process started (client port "
              f"bound; start-up to ready by its log: {sync}; snapshot: none, snapshot_interval = 86400)")  # fmt: skip
        print(f"per-partition PULL by the restarted member: {pulled:,} subscriptions from {len(pulls)} peers "
              f"({', '.join(f'{peer} {n:,}' for peer, n in pulls)}){'; failed: ' + str(failed) if failed else ''}; "
              f"ready with {'?' if ready_subs is None else f'{ready_subs:,}'} held")  # fmt: skip
        print(f"  a restarted member of a replicated cluster PULLs the full dump: {subs:,} subscriptions "
              f"(this one pulled {pulled / subs:.2f} of that, and holds {(ready_subs or 0) / subs:.2f})")  # fmt: skip

        def back() -> bool:
            s = c.statuses(ids)
            return (
                s is not None
                and all(x.get("map", {}).get("live") == ids for x in s.values())
                and s[victim]["map"]["primary"] == led
                and sum(x["subscriptions"] for x in s.values()) == copies
            )

        lead = wait_for(back, 60)
        st3 = c.statuses(ids) or {}
        if lead is None:
            print(f"{victim} did NOT lead its {led} primaries again within 60 s of serving "
                  f"(held: {held_list(st3)})")  # fmt: skip
        else:
            print(f"{victim} leads its {led} primaries again {serving + lead:.2f} s after its process started; "
                  f"held: {held_list(st3)}; "
                  f"{victim} RSS {rss_kib(p.pid) / 1024:.1f} MiB")  # fmt: skip
        print(f"bench wall clock: {time.monotonic() - t_start:.1f} s")
        return 0 if settled is not None and lead is not None else 1
    finally:
        c.close()
        if a.keep:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--mode", choices=("replicated", "partitioned"), default="replicated")
    ap.add_argument(
        "--subs", type=int, default=None, help="subscriptions (default 1,000,000 replicated, 200,000 partitioned)"
    )
    ap.add_argument(
        "--clients", type=int, default=None, help="clients in all (default 10,000 replicated, 2,000 partitioned)"
    )
    ap.add_argument("--topics", type=int, default=50_000)
    ap.add_argument("--partitions", type=int, default=256, help="partitioned: partitions")
    ap.add_argument("--replicas", type=int, default=2, help="partitioned: owners per partition")
    ap.add_argument("--window", type=int, default=8, help="partitioned: clients with a batch in flight per member")
    ap.add_argument("--kill", default="n3", help="partitioned: the member killed and restarted")  # fmt: skip
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="partitioned: a [cluster] setting (TOML value), e.g. --set down_after=1.5; "
                    f"the bench sets {', '.join(f'{k}={v}' for k, v in BENCH_SETTINGS.items())}")  # fmt: skip
    ap.add_argument("--keep", action="store_true", help="partitioned: keep the temp dir (config, logs) and say where")
    a = ap.parse_args()
    return partitioned(a) if a.mode == "partitioned" else replicated(a)


if __name__ == "__main__":
    sys.exit(main())
