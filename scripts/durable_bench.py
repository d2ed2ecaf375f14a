"""Durable mode figures: put throughput per fsync policy, latency, disk bytes per message, recovery.

    python scripts/durable_bench.py                          # every figure, 1 GB recovery
    python scripts/durable_bench.py --puts 20000 --recovery-mb 200
    python scripts/durable_bench.py --policies always --skip-recovery

For each fsync policy (``--policies``, default always,interval,never):

1. Start a 2-member partitioned cluster (``partitions = 1``, ``replicas = 2``: every put is
   stored on both members) on free loopback ports, ``[durable] fsync = <policy>``.
2. Throughput: one client process puts ``--puts`` messages of ``--size`` bytes as fast as the
   put window allows (the library's ``Client.put``), and waits for the last acknowledgement:
   msgs/s = puts / (first put to last acknowledgement).
3. Latency: ``--latency-puts`` puts one at a time, each waiting for its acknowledgement (put ->
   PUTACK, p50/p99), while a durable reader (``Client.get`` with a 1 ms poll) measures put ->
   delivery to the reader (end to end, p50/p99).
4. Disk bytes per message: the size of the primary's log files / messages stored.

Recovery (``--recovery-mb``, default 1024): write a log of that size straight to a member's
data dir with node/segmentlog.py (100-byte payloads in real record bodies), start the member,
and time from process start to ``logs_read`` (every record scanned, CRCs checked, producers and
cursors rebuilt) and to serving. Also its resident memory after the scan.

Every wait is bounded; the processes started are stopped by PID; the temp dir is removed.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgpack
import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from roost.client.library import Client  # noqa: E402
from roost.cluster.config import load_cluster_config  # noqa: E402
from roost.cluster.launcher import Launcher, write_local_config  # noqa: E402
from roost.node.procs import wait_listening  # noqa: E402
from roost.node.segmentlog import Record, SegmentLog  # noqa: E402


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


class Cluster:
    def __init__(self, root: Path, n: int, durable: str) -> None:
        self.root = root
        self.config = root / "cluster.toml"
        ports = write_local_config(self.config, n, "bench-secret-0123456789",
                                   cluster_extra='mode = "partitioned"\npartitions = 1\n' + durable)  # fmt: skip
        self.ports = {m: p[0] for m, p in ports.items()}
        self.cc = load_cluster_config(self.config)
        self.launcher = Launcher(str(root / "run"))

    def start(self, *members: str, timeout: float = 600) -> None:
        ids = members or tuple(self.ports)
        procs = [self.launcher.start(self.cc, str(self.config), m, wait=False) for m in ids]
        for p, m in zip(procs, ids, strict=True):
            wait_listening(p, "127.0.0.1", self.ports[m], timeout=timeout)

    def log(self, m: str) -> str:
        return (self.root / "run" / f"{m}.log").read_text()

    def addr(self, m: str) -> str:
        return f"127.0.0.1:{self.ports[m]}"

    def stop(self) -> None:
        self.launcher.down()


async def throughput(addr: str, puts: int, size: int) -> float:
    payload = b"x" * size
    async with Client(addr) as c:
        await c.put("bench", payload, wait=True)  # (the map, the primary's claim: before the clock starts)
        t0 = time.perf_counter()
        for _ in range(puts):
            await c.put("bench", payload)
        if not await c.flush(timeout=300):
            st = {p: (s.acked, s.next_seq) for p, s in c.router.putter.streams.items()}
            raise RuntimeError(f"puts not acknowledged within 300 s ({time.perf_counter() - t0:.1f} s, {st}, "
                               f"lost {c.router.lost})")  # fmt: skip
        return puts / (time.perf_counter() - t0)


async def latency(addr: str, puts: int, size: int) -> tuple[list[float], list[float]]:
    acks: list[float] = []
    e2e: list[float] = []
    sent: dict[bytes, float] = {}
    async with Client(addr) as c, Client(addr) as reader, trio.open_nursery() as n:
        await c.put("lat", b"warm", wait=True)
        await reader.get("lat", "bench", 1, start="latest", timeout=0.01)  # (the cursor at the end)
        done = trio.Event()

        async def read() -> None:
            while not done.is_set():
                for m in await reader.get("lat", "bench", 100, timeout=0.05):
                    t = sent.get(m.payload[:12])
                    if t is not None:
                        e2e.append(time.perf_counter() - t)
                await reader.commit("lat", "bench")

        n.start_soon(read)
        for i in range(puts):
            tag = b"%012d" % i
            t0 = sent[tag] = time.perf_counter()
            await c.put("lat", tag + b"x" * max(0, size - 12), wait=True)
            acks.append(time.perf_counter() - t0)
        with trio.move_on_after(10):
            while len(e2e) < puts:
                await trio.sleep(0.01)
        done.set()
    return acks, e2e


def log_bytes(root: Path, member: str) -> int:
    return sum(f.stat().st_size for f in (root / "data" / member / "log").rglob("*.log"))


def policy_run(a: argparse.Namespace, root: Path, policy: str) -> dict[str, Any]:
    c = Cluster(root, 2, f'[durable]\nfsync = "{policy}"\n')
    c.start()
    try:
        rate = trio.run(throughput, c.addr("n1"), a.puts, a.size)
        acks, e2e = trio.run(latency, c.addr("n2"), a.latency_puts, a.size)
        stored = a.puts + a.latency_puts + 2
    finally:
        c.stop()
    per_msg = max(log_bytes(root, m) for m in ("n1", "n2")) / stored
    return {"policy": policy, "msgs_per_s": rate, "ack_p50_ms": pct(acks, 0.5) * 1e3,
            "ack_p99_ms": pct(acks, 0.99) * 1e3, "e2e_p50_ms": pct(e2e, 0.5) * 1e3, "e2e_p99_ms": pct(e2e, 0.99) * 1e3,
            "delivered": len(e2e), "bytes_per_msg": per_msg}  # fmt: skip


def recovery(a: argparse.Namespace, root: Path) -> dict[str, Any]:
    c = Cluster(root, 1, "")
    logdir = root / "data" / "n1" / "log" / "p00000"
    log, _ = SegmentLog.open(logdir, segment_bytes=64 << 20)
    pid = os.urandom(16)
    target = a.recovery_mb << 20
    body0 = msgpack.packb([1, 2])
    log.append([Record(0, 1, body0)])
    offset, t0 = 1, time.perf_counter()
    while log.size < target:
        batch = [Record(o, 1_700_000_000_000 + o, msgpack.packb([1, 0, "bench", None, None, b"p" * a.size, pid, o]))
                 for o in range(offset, offset + 10_000)]  # fmt: skip
        log.append(batch)
        offset += len(batch)
    log.close()
    size = log.size
    print(f"  wrote {size / 2**20:.0f} MiB, {offset:,} records in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    subprocess.run(["sync"], check=False)
    t0 = time.perf_counter()
    c.start(timeout=1800)
    serving = time.perf_counter() - t0
    try:
        deadline = time.monotonic() + 1800
        while "event=logs_read" not in c.log("n1") and time.monotonic() < deadline:
            time.sleep(0.1)
        pid_ = c.launcher.pid_of("n1")
        rss = 0
        if pid_ is not None:
            m = re.search(r"VmRSS:\s+(\d+)", Path(f"/proc/{pid_}/status").read_text())
            rss = int(m.group(1)) if m else 0
    finally:
        c.stop()
    return {"log_mib": size / 2**20, "records": offset, "serving_s": serving, "rss_mib": rss / 1024}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policies", default="always,interval,never")
    ap.add_argument("--puts", type=int, default=50_000)
    ap.add_argument("--latency-puts", type=int, default=1000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--recovery-mb", type=int, default=1024)
    ap.add_argument("--skip-recovery", action="store_true")
    a = ap.parse_args()
    for p in a.policies.split(","):
        if p not in ("always", "interval", "never"):
            ap.error(f"--policies: {p!r} is not always, interval or never")
    print(f"# durable_bench {datetime.date.today()} on {platform.node()} ({os.cpu_count()} cores); "
          f"{a.puts} puts of {a.size} B, 2 members, replicas 2", flush=True)  # fmt: skip
    print("| fsync | puts/s | put->ack p50 / p99 ms | put->reader p50 / p99 ms | disk bytes/msg |")
    print("|---|---|---|---|---|")
    for p in a.policies.split(","):
        root = Path(tempfile.mkdtemp(prefix=f"durable-bench-{p}-"))
        try:
            r = policy_run(a, root, p)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        print(f"| {p} | {r['msgs_per_s']:,.0f} | {r['ack_p50_ms']:.2f} / {r['ack_p99_ms']:.2f} | "
              f"{r['e2e_p50_ms']:.2f} / {r['e2e_p99_ms']:.2f} ({r['delivered']}) | {r['bytes_per_msg']:.0f} |",
              flush=True)  # fmt: skip
    if not a.skip_recovery:
        root = Path(tempfile.mkdtemp(prefix="durable-bench-rec-"))
        try:
            r = recovery(a, root)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        print(f"\nrecovery: {r['log_mib']:.0f} MiB log, {r['records']:,} records: member serving after "
              f"{r['serving_s']:.1f} s (process start to client port bound, after the scan), "
              f"VmRSS {r['rss_mib']:.0f} MiB")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
