"""Cluster state figures: memory per subscription and PULL time of a full state dump.

    python scripts/cluster_bench.py                  # 1,000,000 subscriptions
    python scripts/cluster_bench.py --subs 100000    # smaller

1. Start member n1 of a 2-member cluster (n2 not running) on free loopback ports.
2. Fill it with ``--subs`` subscriptions: ``--clients`` binary clients (raw
   HELLO/CMDS frames, 100 commands per datagram), each subscribing to
   ``subs/clients`` topics drawn from ``--topics`` topics.
3. Memory per subscription = growth of n1's resident set (VmRSS) / subscriptions.
4. Start n2: it PULLs the dump from n1. PULL time is what n2 logs for the
   transfer and merge (``event=pulled ... seconds=``); also reported: process
   start to serving.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from client import wire  # noqa: E402
from client.wire import T  # noqa: E402
from node.procs import free_udp_port, wait_listening  # noqa: E402


def free_tcp_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))  # type: ignore[union-attr]


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
        cookie = wire.decode_untrusted_frame(s.recv(70000))[2]
        cmds: list[tuple[int, str, str | None, int]] = [
            (1, f"topic.{(c * per_client + j) % topics}", None, j % 2) for j in range(per_client)
        ]
        for b in range(0, per_client, 100):
            s.sendto(wire.encode_cmds(cid, cookie, 1, b // 100 + 1, cmds[b : b + 100]), node)
            f = wire.decode_untrusted_frame(s.recv(70000))
            assert f[0] is T.CMDACK and not any(f[3]), f
            n += len(cmds[b : b + 100])
    s.close()
    return time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--subs", type=int, default=1_000_000)
    ap.add_argument("--clients", type=int, default=10_000)
    ap.add_argument("--topics", type=int, default=50_000)
    a = ap.parse_args()
    per_client = a.subs // a.clients
    tmp = tempfile.mkdtemp(prefix="roost-bench-")
    ports = {i: (free_udp_port(), free_tcp_port()) for i in ("n1", "n2")}
    cfg = os.path.join(tmp, "cluster.toml")
    with open(cfg, "w") as f:
        f.write('[cluster]\nsecret = "bench-secret-0123456789"\nchunk_subscriptions = 50000\n'
                "pull_timeout = 300\nsnapshot_interval = 86400\nmax_peer_queue = 1000\n")  # fmt: skip
        for i, (u, t) in ports.items():
            f.write(f'[[members]]\nid = "{i}"\nclient_addr = "127.0.0.1:{u}"\npeer_addr = "127.0.0.1:{t}"\n'
                    f'data_dir = "{tmp}/{i}"\n')  # fmt: skip
        f.write(f'[node]\nlog_level = "info"\n[limits]\nmax_per_host = {a.clients + 10}\n'
                f"max_clients = {a.clients + 10}\n[timeouts]\nsubscriber_timeout = 86400\n")  # fmt: skip
    logs = {i: open(os.path.join(tmp, f"{i}.log"), "w+") for i in ports}  # noqa: SIM115
    cmd = [sys.executable, "-m", "cluster.cli", "node", "--config", cfg, "--id"]
    procs = []
    try:
        n1 = subprocess.Popen([*cmd, "n1"], cwd=ROOT, stderr=logs["n1"])
        procs.append(n1)
        wait_listening(n1, "127.0.0.1", ports["n1"][0], timeout=60)
        time.sleep(0.5)
        before = rss_kib(n1.pid)
        took = populate(ports["n1"][0], a.clients, per_client, a.topics)
        time.sleep(0.5)
        after = rss_kib(n1.pid)
        total = a.clients * per_client
        print(f"# roost cluster bench: {total:,} subscriptions = {a.clients:,} clients x {per_client} "
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
        m = re.search(r"event=pulled peer=n1 subscriptions=(\d+) seconds=([\d.]+)", text)
        if m is None:
            print("n2 did not log a PULL (log level hides it?)", text[-500:])
            return 1
        print(f"PULL by a starting member: {int(m.group(1)):,} subscriptions in {float(m.group(2)):.2f} s "
              f"(process start to serving: {ready:.2f} s)")  # fmt: skip
        print(f"n2 resident memory after the PULL: {rss_kib(n2.pid) / 1024:.1f} MiB")
        return 0
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)


if __name__ == "__main__":
    sys.exit(main())
