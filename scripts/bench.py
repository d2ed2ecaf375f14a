"""Roost benchmark: fan-in and fan-out, fire and reliable, plus paced latency.

Every role is its own process (node, publisher, each subscriber) on loopback.
Payloads carry the message index and the publisher's send time
(CLOCK_MONOTONIC, shared by all processes of one Linux machine), so each
subscriber counts lost, duplicated and out-of-order messages and measures
latency by itself.

    python scripts/bench.py                 # all scenarios, default sizes
    python scripts/bench.py --quick         # a smaller run for a smoke test
    python scripts/bench.py --only fanin    # one scenario
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import time
from typing import Any

import trio

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from roost.client import Client, ClientConfig  # noqa: E402
from roost.node.procs import free_udp_port, wait_listening  # noqa: E402

HEAD = struct.Struct("!Qd")  # index, send time


# ------------------------------------------------------------------ roles


async def run_sub(node: str, topic: str, mode: str, n: int, idle: float) -> dict[str, Any]:
    seen = bytearray(n)
    got = dups = ooo = 0
    last_idx = -1
    lat: list[float] = []
    first_t = last_t = 0.0
    cfg = ClientConfig(max_buffered=1_000_000)
    async with Client(node, config=cfg) as c, c.subscribe(topic, mode=mode) as sub:
        print("ready", flush=True)
        while got < n:
            with trio.move_on_after(idle) as scope:
                msg = await sub.next()
            if scope.cancelled_caught:
                break
            now = time.monotonic()
            idx, sent = HEAD.unpack_from(msg.payload)
            if got == 0 and not first_t:
                first_t = now
            last_t = now
            if idx >= n or seen[idx]:
                dups += 1
                continue
            seen[idx] = 1
            got += 1
            if idx < last_idx:
                ooo += 1
            last_idx = idx
            lat.append(now - sent)
        reason = sub.reason
    return {
        "received": got, "lost": n - got, "duplicates": dups, "out_of_order": ooo,
        "first": first_t, "last": last_t, "latencies": lat, "reason": reason,
        "client_dups_dropped": c.router.duplicates,
    }  # fmt: skip


async def run_pub(node: str, topic: str, mode: str, n: int, size: int, rate: float) -> dict[str, Any]:
    pad = b"x" * max(0, size - HEAD.size)
    async with Client(node) as c:
        t0 = time.monotonic()
        for i in range(n):
            if rate:
                due = t0 + i / rate
                delay = due - time.monotonic()
                if delay > 0:
                    await trio.sleep(delay)
            await c.publish(topic, HEAD.pack(i, time.monotonic()) + pad, mode=mode)
        t1 = time.monotonic()
        ok = await c.flush(timeout=30) if mode == "reliable" else True
        t2 = time.monotonic()
    return {"sent": n, "publish_s": t1 - t0, "acked_s": t2 - t0, "all_acked": ok}


# ------------------------------------------------------------------ driver


def spawn(args: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), *args],
        stdout=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip


def start_node(port: int) -> subprocess.Popen[bytes]:
    cfg = os.path.join(ROOT, "run", f"bench-{port}.toml")
    os.makedirs(os.path.dirname(cfg), exist_ok=True)
    with open(cfg, "w") as f:
        f.write(f'[node]\nid = "bench"\nclient_addr = "127.0.0.1:{port}"\nlog_level = "warning"\n'
                "[limits]\nmailbox_capacity = 200000\nsend_window = 8192\n")  # fmt: skip
    node = subprocess.Popen([sys.executable, "-m", "roost", "node", "--config", cfg], cwd=ROOT)
    wait_listening(node, "127.0.0.1", port)
    return node


def scenario(name: str, mode: str, subs: int, n: int, size: int, rate: float) -> dict[str, Any]:
    port = free_udp_port()
    node = start_node(port)
    addr = f"127.0.0.1:{port}"
    topic = f"bench.{name}"
    try:
        idle = "3" if not rate else "5"
        procs = [spawn(["--role", "sub", "--node", addr, "--topic", topic, "--mode", mode,
                        "-n", str(n), "--idle", idle]) for _ in range(subs)]  # fmt: skip
        for p in procs:
            assert p.stdout is not None
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError("subscriber failed to start")
        pub = spawn(["--role", "pub", "--node", addr, "--topic", topic, "--mode", mode, "-n", str(n),
                     "--size", str(size), "--rate", str(rate)])  # fmt: skip
        pub_out, _ = pub.communicate(timeout=300)
        results = [json.loads(p.communicate(timeout=300)[0]) for p in procs]
    finally:
        node.terminate()
        node.wait(10)
    p = json.loads(pub_out)
    delivered = sum(r["received"] for r in results)
    start = min(r["first"] for r in results if r["received"]) if delivered else 0
    end = max(r["last"] for r in results if r["received"]) if delivered else 0
    lat = sorted(x for r in results for x in r["latencies"])
    out = {
        "scenario": name, "mode": mode, "subscribers": subs, "messages": n, "size": size,
        "paced_rate": rate, "delivered": delivered,
        "lost": sum(r["lost"] for r in results), "duplicated": sum(r["duplicates"] for r in results),
        "out_of_order": sum(r["out_of_order"] for r in results),
        "delivered_per_s": delivered / (end - start) if end > start else 0.0,
        "publish_per_s": n / p["publish_s"] if p["publish_s"] else 0.0,
        "p50_ms": 1000 * lat[len(lat) // 2] if lat else None,
        "p99_ms": 1000 * lat[int(len(lat) * 0.99)] if lat else None,
        "cancel_reasons": sorted({str(r["reason"]) for r in results if r["reason"]}),
    }  # fmt: skip
    return out


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians of the rates and latencies; lost/duplicated/out-of-order summed over runs."""
    r = dict(runs[0])
    for k in ("delivered_per_s", "publish_per_s", "p50_ms", "p99_ms"):
        vals = [x[k] for x in runs if x[k] is not None]
        r[k] = statistics.median(vals) if vals else None
    for k in ("lost", "duplicated", "out_of_order", "delivered"):
        r[k] = sum(x[k] for x in runs)
    r["runs"] = len(runs)
    r["cancel_reasons"] = sorted({c for x in runs for c in x["cancel_reasons"]})
    return r


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--role", choices=("sub", "pub"))
    ap.add_argument("--node")
    ap.add_argument("--topic")
    ap.add_argument("--mode", default="reliable")
    ap.add_argument("-n", type=int, default=0)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--rate", type=float, default=0.0)
    ap.add_argument("--idle", type=float, default=3.0)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", choices=("fanin", "fanout", "latency"))
    ap.add_argument("--json", action="store_true", help="print one JSON line per scenario")
    ap.add_argument("--repeat", type=int, default=1, help="run each scenario N times, report medians")
    a = ap.parse_args()
    if a.role == "sub":
        print(json.dumps(trio.run(run_sub, a.node, a.topic, a.mode, a.n, a.idle)))
        return
    if a.role == "pub":
        print(json.dumps(trio.run(run_pub, a.node, a.topic, a.mode, a.n, a.size, a.rate)))
        return
    scale = 10 if a.quick else 1
    plan = []
    for mode in ("fire", "reliable"):
        if a.only in (None, "fanin"):
            plan.append(("fanin", mode, 1, 200_000 // scale, 100, 0.0))
        if a.only in (None, "fanout"):
            plan.append(("fanout", mode, 10, 20_000 // scale, 100, 0.0))
        if a.only in (None, "latency"):
            plan.append(("latency", mode, 1, 6_000 // scale, 100, 2000.0))
    print(f"# roost bench on {os.cpu_count()} cores, python {sys.version.split()[0]}, "
          f"median of {a.repeat} run(s); lost/dup/ooo summed over runs")
    hdr = f"{'scenario':8} {'mode':8} {'subs':>4} {'msgs/sub':>8} {'delivered/s':>11} " \
          f"{'lost':>6} {'dup':>4} {'ooo':>4} {'p50 ms':>7} {'p99 ms':>7}"  # fmt: skip
    print(hdr)
    for sc in plan:
        r = median_of([scenario(*sc) for _ in range(a.repeat)])
        if a.json:
            print(json.dumps(r))
            continue
        p50 = f"{r['p50_ms']:.2f}" if r["p50_ms"] is not None else "-"
        p99 = f"{r['p99_ms']:.2f}" if r["p99_ms"] is not None else "-"
        print(f"{r['scenario']:8} {r['mode']:8} {r['subscribers']:>4} {r['messages']:>8} "
              f"{r['delivered_per_s']:>11,.0f} {r['lost']:>6} {r['duplicated']:>4} "
              f"{r['out_of_order']:>4} {p50:>7} {p99:>7}"
              + (f"  cancelled: {','.join(r['cancel_reasons'])}" if r["cancel_reasons"] else ""),
              flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
