"""Attacks on real `roost node` processes from loopback addresses standing in for other hosts,
with a legitimate client beside them; prints what the node did (docs/security.md).

    python scripts/attack.py exhaust [--duration 60] [--attackers 10] [--rate 1000]
    python scripts/attack.py text [--duration 60] [--members 3]

``exhaust``: ``--attackers`` processes, each bound to its own address (127.0.0.2, .3, ...),
send ``--rate`` datagrams a second for ``--duration`` seconds, in turn: a PUB from a new
producer id (the producer table), a CMDS of 8 subscriptions with kilobyte filters from one of
3 client ids (subscriptions, filter bytes), and the first fragment of a large message that
never ends, to the legitimate client's topic (its reassembly buffer). Meanwhile a legitimate
trio Client on the next address subscribes, publishes to itself every 10 ms and takes its
messages, and a raw socket on the address after it PINGs the node every 20 ms. The node runs
at its default settings. Printed: the client's messages sent, received and late, the PING
round trips (p50, p99, max, lost), the node's RSS, and its counters against their limits.

``text``: a cluster of ``--members`` members (default settings but for the cluster's own),
whose text_networks trust loopback as shipped; a victim address sends SUBs (padded to 1 KB,
``--sub-pad``: the credit a forger buys) to every member
(from the node's side, forged SUBs and the victim's own are the same datagrams) while a
publisher sends 8 KB messages of that topic to every member. Printed: the bytes the victim
sent, the bytes all members sent it, and the ratio (at most text_amplification, 3).

Every loop is bounded by ``--duration``; every process started is stopped at the end.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import multiprocessing
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from roost.client import decoding, wire  # noqa: E402
from roost.client.wire import FrameType  # noqa: E402
from roost.node.procs import free_port, free_udp_port, wait_listening  # noqa: E402


def drain(sock: socket.socket) -> int:
    """Read what a non-blocking socket holds now; the bytes read."""
    n = 0
    with contextlib.suppress(BlockingIOError):
        while data := sock.recv(65536):
            n += len(data)
    return n


def _hello(sock: socket.socket, node: tuple[str, int], cid: bytes) -> bytes:
    """A cookie for ``cid`` at this socket's address."""
    for _ in range(50):
        sock.sendto(wire.encode_hello(cid), node)
        sock.settimeout(0.2)
        try:
            while True:
                f = decoding.decode_untrusted_frame(sock.recv(65536))
                if f[0] is FrameType.WELCOME:
                    return f[2]  # type: ignore[no-any-return]
        except (TimeoutError, wire.WireError):
            continue
    raise SystemExit(f"no WELCOME from {node}")


def _attacker(index: int, node: tuple[str, int], rate: int, until: float, topic: str, out: Any) -> None:
    """One attacking host: a socket on its own address; a bounded, paced loop."""
    host = f"127.0.0.{2 + index}"
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((host, 0))
    cids = [os.urandom(16) for _ in range(3)]
    cookies = [_hello(sock, node, cid) for cid in cids]
    sock.setblocking(False)
    sent = n = 0
    batches = [0, 0, 0]
    filler = "k{j} = '" + "v" * 20 + "{n:09d}'"
    start = time.monotonic()
    while (now := time.monotonic()) < until:
        due = int((now - start) * rate)
        while n < due:
            kind, c = n % 3, (n // 3) % 3
            if kind == 0:  # a new producer
                msg = [wire.pack_message("attack", None, None, b"x")]
                data = wire.encode_pub(cids[c], cookies[c], os.urandom(16), 1, 1, False, msg)
            elif kind == 1:  # 8 subscriptions of ~1 KB filters
                batches[c] += 1
                cmds: list[tuple[int, str, str | None, int]] = [
                    (1, f"a.{index}.{n}.{i}.* where " + " AND ".join(filler.format(j=j, n=n * 8 + i)
                                                                     for j in range(22)), None, 0)
                    for i in range(8)]  # fmt: skip
                data = wire.encode_cmds(cids[c], cookies[c], 1, batches[c], cmds)
            else:  # the first fragment of a message that never ends, on the client's topic
                tag = {wire.PART_TAG: f"{os.urandom(4).hex()} 0 100 60000"}
                msg = [wire.pack_message(topic, None, tag, b"p" * 600)]
                data = wire.encode_pub(cids[c], cookies[c], os.urandom(16), 1, 1, False, msg)
            with contextlib.suppress(BlockingIOError):  # (a full socket buffer: that datagram is not sent)
                sock.sendto(data, node)
                sent += 1
            n += 1
            drain(sock)  # (the node's answers are not read: they only must not fill our buffer)
        time.sleep(0.002)
    out.put(sent)


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _cpu(pid: int) -> float:
    """CPU seconds ``pid`` has used (user + system)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _varz(monitor: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{monitor}/varz", timeout=5) as r:
        return json.load(r)  # type: ignore[no-any-return]


async def _legit(node: str, duration: float, pid: int) -> dict[str, Any]:
    """The legitimate client (from 127.0.0.1, a host no attacker uses): its own messages, PING
    round trips from a raw socket of its own, and the node's RSS each second."""
    from roost import Client

    host, port = node.split(":")
    addr = (host, int(port))
    rtts: list[float] = []
    lost_pings = 0
    rss: list[int] = []
    got: list[int] = []
    sent = 0
    until = trio.current_time() + duration
    slow: collections.Counter[int] = collections.Counter()  # second of the run -> pings over 5 ms
    async with Client(node) as c, c.subscribe("legit.t", mode="reliable") as sub, trio.open_nursery() as nursery:

        async def take() -> None:
            async for m in sub:
                got.append(int(m.payload))

        nursery.start_soon(take)
        ping = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
        await ping.bind(("127.0.0.1", 0))
        cid = os.urandom(16)
        await ping.sendto(wire.encode_hello(cid), addr)
        with trio.fail_after(5):
            cookie = decoding.decode_untrusted_frame(await ping.recv(65536))[2]
        token = 0
        next_pub = next_ping = next_rss = trio.current_time()
        while (now := trio.current_time()) < until:
            if now >= next_pub:
                await c.publish("legit.t", str(sent).encode(), mode="reliable")
                sent += 1
                next_pub += 0.01
            if now >= next_ping:
                token += 1
                t0 = time.perf_counter()
                await ping.sendto(wire.encode_ping(cid, cookie, token, 0, 0), addr)
                with trio.move_on_after(0.5) as scope:
                    while True:
                        f = decoding.decode_untrusted_frame(await ping.recv(65536))
                        if f[0] is FrameType.PONG and f[1] == token:
                            rtts.append(time.perf_counter() - t0)
                            if rtts[-1] > 0.005:
                                slow[int(duration - (until - now))] += 1
                            cookie = f[3]
                            break
                if scope.cancelled_caught:
                    lost_pings += 1
                next_ping += 0.02
            if now >= next_rss:
                rss.append(_rss(pid))
                next_rss += 1.0
            await trio.sleep(0.001)
        with trio.move_on_after(10):
            while len(set(got)) < sent:
                await trio.sleep(0.05)
        nursery.cancel_scope.cancel()
    rtts.sort()
    return {"legit_sent": sent, "legit_received": len(got), "legit_unique": len(set(got)),
            "pings": len(rtts), "pings_lost": lost_pings,
            "ping_rtt_p50_ms": round(1000 * statistics.median(rtts), 3) if rtts else None,
            "ping_rtt_p99_ms": round(1000 * rtts[int(0.99 * (len(rtts) - 1))], 3) if rtts else None,
            "ping_rtt_max_ms": round(1000 * rtts[-1], 3) if rtts else None,
            "node_rss_max_mb": round(max(rss) / 1e6, 1) if rss else None,
            "pings_over_5ms_by_second": dict(sorted(slow.items()))}  # fmt: skip


def _start_node(tmp: Path) -> tuple[subprocess.Popen[bytes], int, int]:
    port, monitor = free_udp_port(), free_port("127.0.0.1", socket.SOCK_STREAM)
    cfg = tmp / "node.toml"
    cfg.write_text(f'[node]\nid = "victim"\nclient_addr = "127.0.0.1:{port}"\n'
                   f'[monitor]\naddr = "127.0.0.1:{monitor}"\n')  # fmt: skip
    with open(tmp / "node.log", "w") as log:
        node = subprocess.Popen([sys.executable, "-m", "roost", "node", "--config", str(cfg)], cwd=ROOT, stderr=log)
    wait_listening(node, "127.0.0.1", port, timeout=30)
    return node, port, monitor


def exhaust(a: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="roost-attack-"))
    node, port, monitor = _start_node(tmp)
    procs: list[multiprocessing.Process] = []
    try:
        rss0, cpu0 = _rss(node.pid), _cpu(node.pid)
        until = time.monotonic() + a.duration
        q: Any = multiprocessing.Queue()
        procs = [multiprocessing.Process(target=_attacker, args=(i, ("127.0.0.1", port), a.rate, until, "legit.t", q))
                 for i in range(a.attackers)]  # fmt: skip
        for p in procs:
            p.start()
        r = trio.run(_legit, f"127.0.0.1:{port}", a.duration, node.pid)
        sent = sum(q.get(timeout=30) for _ in procs)
        v = _varz(monitor)
        limits = v["config"]
        r.update({
            "duration_s": a.duration, "attackers": a.attackers, "attack_datagrams": sent,
            "node_rss_start_mb": round(rss0 / 1e6, 1), "node_alive": node.poll() is None,
            "node_cpu_share": round((_cpu(node.pid) - cpu0) / a.duration, 3),
            "load_average_1m": os.getloadavg()[0],
            "subscriptions": v["subscriptions"], "max_subscriptions": limits.get("max_subscriptions"),
            "producers": v["producers"], "max_producers": limits.get("max_producers"),
            "refused": {k: n for k, n in v["counters"].items() if k.startswith("refused_") or k == "producers_evicted"},
        })  # fmt: skip
        return r
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
        node.terminate()
        node.wait(10)


def text(a: argparse.Namespace) -> dict[str, Any]:
    """Forged SUBs for a victim address at every member while 8 KB messages are published."""
    from roost.cluster.launcher import write_local_config

    tmp = Path(tempfile.mkdtemp(prefix="roost-attack-"))
    config = tmp / "cluster.toml"
    ports = write_local_config(
        config,
        a.members,
        node_extra='[node]\nlog_level = "warning"\n'
        + ("" if a.text_amplification is None else f"[limits]\ntext_amplification = {a.text_amplification}\n"),
    )
    members: list[subprocess.Popen[bytes]] = []
    try:
        for mid in ports:
            with open(tmp / f"{mid}.log", "w") as log:
                members.append(subprocess.Popen([sys.executable, "-m", "roost", "node", "--config", str(config),
                                                 "--id", mid], cwd=ROOT, stderr=log))  # fmt: skip
        for p, (udp, _) in zip(members, ports.values(), strict=True):
            wait_listening(p, "127.0.0.1", udp, timeout=60)
        addrs = [("127.0.0.1", udp) for udp, _ in ports.values()]
        victim = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        victim.bind(("127.0.0.40", 0))
        victim.setblocking(False)
        pub = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        body = b"m" * 8192
        sub_datagram = b"SUB amp\n" + b"." * a.sub_pad  # (its body is ignored: it buys credit)
        bytes_in = bytes_out = subs = msgs = 0
        start = time.monotonic()
        next_sub = next_pub = start
        while (now := time.monotonic()) < start + a.duration:
            if now >= next_sub:  # a padded SUB to every member, 10 a second (as forged ones would come)
                for addr in addrs:
                    victim.sendto(sub_datagram, addr)
                    bytes_in += len(sub_datagram)
                    subs += 1
                next_sub += 0.1
            if now >= next_pub:  # 8 KB messages of that topic at every member, 100 a second
                for addr in addrs:
                    pub.sendto(b"PUB amp\n" + body, addr)
                    msgs += 1
                next_pub += 0.01
            bytes_out += drain(victim)
            time.sleep(0.001)
        end = time.monotonic() + 1.0  # what was on its way
        while time.monotonic() < end:
            try:
                bytes_out += len(victim.recv(65536))
            except BlockingIOError:
                time.sleep(0.01)
        amp = 3.0 if a.text_amplification is None else a.text_amplification
        return {"duration_s": a.duration, "members": a.members, "text_amplification": amp,
                "subs_sent": subs, "sub_bytes": len(sub_datagram), "victim_bytes_sent": bytes_in,
                "messages_published": msgs, "published_bytes": msgs * (len(body) + 8),
                "victim_bytes_received": bytes_out, "ratio": round(bytes_out / bytes_in, 3)}  # fmt: skip
    finally:
        for p in members:
            p.terminate()
        for p in members:
            p.wait(10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("attack", choices=["exhaust", "text"])
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--attackers", type=int, default=10)
    ap.add_argument("--rate", type=int, default=1000, help="datagrams a second from each attacking host")
    ap.add_argument("--members", type=int, default=3)
    ap.add_argument("--text-amplification", type=float, help="text: the members' setting (0: the bound off, as before)")
    ap.add_argument("--sub-pad", type=int, default=1016, help="text: bytes of padding in each SUB (1 KB datagrams)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if not 1 <= a.duration <= 600 or not 1 <= a.attackers <= 200 or not 1 <= a.rate <= 100_000:
        raise SystemExit("--duration 1..600, --attackers 1..200, --rate 1..100000")
    r = exhaust(a) if a.attack == "exhaust" else text(a)
    print(json.dumps(r, indent=1) if a.json else r)


if __name__ == "__main__":
    main()
