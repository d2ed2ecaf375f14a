"""Failover as a subscriber sees it, with default timeouts.

A 3-member cluster runs as local processes on free loopback ports (default
settings). A subscriber and a publisher both talk to n1; the publisher sends
a numbered message every 5 ms. n1 is killed with SIGKILL; both clients fail
over to another member. The gap is the longest silence between two
consecutive messages at the subscriber after the kill was ordered (the last
message before the outage to the first after it). Each run
also counts lost, duplicated and out-of-order messages.

    python scripts/failover.py            # 3 runs, median gap
    python scripts/failover.py --runs 5
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import trio  # noqa: E402

from client import Client  # noqa: E402
from cluster.config import load_cluster_config  # noqa: E402
from cluster.launcher import Launcher, write_local_config  # noqa: E402
from node.procs import wait_listening  # noqa: E402


async def one_run(node: str, launcher: Launcher, n: int, kill_at: int) -> dict[str, float]:
    arrivals: list[tuple[float, int]] = []
    killed_at = 0.0
    async with Client(node) as sub_c, Client(node) as pub_c:
        async with sub_c.subscribe("failover", mode="reliable") as sub:

            async def publish() -> None:
                nonlocal killed_at
                for i in range(n):
                    await pub_c.publish("failover", b"%d" % i)
                    if i == kill_at:
                        killed_at = time.monotonic()
                        await trio.to_thread.run_sync(launcher.kill, "n1")
                    await trio.sleep(0.005)
                await pub_c.flush(30)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(publish)
                with trio.move_on_after(60):
                    async for m in sub:
                        arrivals.append((time.monotonic(), int(m.payload)))
                        if int(m.payload) == n - 1:
                            break
    seqs = [s for _, s in arrivals]
    times = [t for t, _ in arrivals]
    # the longest silence the subscriber lived through once the kill was ordered
    gaps = [b - a for a, b in itertools.pairwise(times) if b > killed_at]
    gap = max(gaps) if gaps else float("nan")
    return {
        "gap_s": gap,
        "lost": n - len(set(seqs)),
        "duplicated": len(seqs) - len(set(seqs)),
        "out_of_order": sum(1 for a, b in itertools.pairwise(seqs) if b < a),
        "sub_failovers": sub_c.session.failovers,
        "pub_failovers": pub_c.session.failovers,
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("-n", type=int, default=600)
    a = ap.parse_args()
    results = []
    for run in range(a.runs):
        tmp = Path(tempfile.mkdtemp(prefix="roost-failover-"))
        cfg = tmp / "cluster.toml"
        ports = write_local_config(cfg, 3, node_extra='[node]\nlog_level = "info"\n')
        launcher = Launcher(str(tmp / "run"))
        cc = load_cluster_config(cfg)
        procs = [launcher.start(cc, str(cfg), m, wait=False) for m in ports]
        try:
            for p, (udp, _) in zip(procs, ports.values(), strict=True):
                wait_listening(p, "127.0.0.1", udp, timeout=60)
            r = trio.run(one_run, f"127.0.0.1:{ports['n1'][0]}", launcher, a.n, a.n // 3)
        finally:
            launcher.down()
        results.append(r)
        print(f"run {run + 1}: gap {r['gap_s'] * 1000:.0f} ms, lost {r['lost']}, duplicated {r['duplicated']}, "
              f"out of order {r['out_of_order']}, failovers sub {r['sub_failovers']} pub {r['pub_failovers']}",
              flush=True)  # fmt: skip
    gaps = [r["gap_s"] for r in results]
    print(f"# failover gap as the subscriber sees it (default timeouts, node_timeout 1.5 s): "
          f"median {statistics.median(gaps) * 1000:.0f} ms, max {max(gaps) * 1000:.0f} ms over {len(gaps)} runs; "
          f"lost {sum(r['lost'] for r in results)}, duplicated {sum(r['duplicated'] for r in results)}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
