"""Failover as a subscriber sees it, on real processes, from the run's event logs.

    python scripts/failover.py              # 3 runs, medians
    python scripts/failover.py --runs 5 --out run/failover

Each run starts a 3-member cluster on free loopback ports (default settings)
with the chaos tooling (scripts/chaos.py): a subscriber talks to n1, a
reliable publisher to n2 (--publish-at n1: to n1 as well), about --rate
messages a second. n1 is killed with SIGKILL and started again --down
seconds later. From the event logs (docs/eventlog.md): the gap is the
subscriber's silence across the kill (its last delivery before the kill to
its first after it); lost, duplicated and violations are scripts/check.py's
counts; and whether the restarted n1 pulled its state from a peer (its log).
With the publisher at n2 the gap is about one message interval: n2 delivers
straight to the subscriber, whose own member's death changes nothing for it.
With both at n1, both fail over after node_timeout (1.5 s). Exit status 1 if
a promise was broken or n1 did not pull.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from roost.pipeline import checker, rules  # noqa: E402
from scripts import chaos  # noqa: E402


def one_run(i: int, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    ns = argparse.Namespace(out=str(out), seed=i + 1, netns=False, config=None, loss=10.0, dup=5.0, delay=50.0,
                            rate=args.rate, duration=args.duration, settle=3.0, mode="replicated", durable=False,
                            durable_rate=50.0, durable_drain=120.0, durable_crash=0.05)  # fmt: skip
    (out / "events").mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    run = chaos.Run(ns)
    try:
        ids = chaos.start_cluster(run, ["kill"])
        run.start_worker("sub-0", ["sub", "--first", "n1", "--subs", "chaos.a:reliable", "--seed", str(i)])
        time.sleep(1.5)  # (subscribed before the first publish)
        run.start_worker("pub-0", ["pub", "--first", args.publish_at, "--mode", "reliable", "--rate", str(args.rate),
                                   "--duration", str(args.duration), "--seed", str(i)])  # fmt: skip
        kill_at = args.duration / 3
        chaos.run_plan(run, [(kill_at, kill_at + args.down, "kill", "n1")], args.duration)
        chaos.finish(run, ids)
    finally:
        run.cleanup()
    return analyse(out)


def analyse(out: Path) -> dict[str, Any]:
    """The gap from the subscriber's deliveries around the kill; the counts from the checker."""
    events = [json.loads(line) for f in sorted((out / "events").glob("*.jsonl")) for line in f.open()]
    kill = min(e["t"] for e in events if e["ev"] == "fault" and e["fault"] == "kill")
    times = sorted(e["t"] for e in events if e["ev"] == "deliver")
    before = [t for t in times if t <= kill]
    after = [t for t in times if t > kill]
    gap = (after[0] - before[-1]) if before and after else float("nan")
    report = checker.check_run(out)
    totals = report["modes"]["reliable"]["totals"]
    log = (out / "logs" / "n1.log").read_text(errors="replace").rsplit("event=node_starting", 1)[-1]
    return {
        "gap_s": gap,
        "expected": totals["acknowledged"],
        "lost": totals["lost"],
        "allowed": totals["lost"] - report["modes"]["reliable"]["lost_by_class"][rules.VIOLATION],
        "duplicated": totals["duplicated"],
        "violations": len(report["violations"]),
        "failovers": sum(1 for e in events if e["ev"] == "failover"),
        "pulled": "event=pulled" in log,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3, help="runs (default 3); medians are printed")
    ap.add_argument("--duration", type=float, default=12.0, help="seconds of publishing per run (default 12)")
    ap.add_argument("--down", type=float, default=4.0, help="seconds n1 stays dead (default 4)")
    ap.add_argument("--rate", type=float, default=200.0, help="publishes per second (default 200)")
    ap.add_argument("--publish-at", choices=["n1", "n2"], default="n2",
                    help="the publisher's member: n2 (default; n1's death does not stop n2 delivering) or n1 "
                         "(the publisher fails over too)")  # fmt: skip
    ap.add_argument("--out", help="keep the run directories here (default: a temporary directory)")
    a = ap.parse_args()
    if a.runs < 1 or a.duration < 6 or a.down <= 0 or a.down > a.duration / 2:
        ap.error("--runs >= 1, --duration >= 6 and 0 < --down <= duration / 2")
    base = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="roost-failover-"))
    results = []
    for i in range(a.runs):
        r = one_run(i, base / f"run{i + 1}", a)
        results.append(r)
        print(f"run {i + 1}: gap {r['gap_s'] * 1000:.0f} ms, acknowledged {r['expected']}, lost {r['lost']} "
              f"({r['allowed']} allowed: accepted by the killed member), duplicated {r['duplicated']}, "
              f"violations {r['violations']}, failovers {r['failovers']}, "
              f"restarted n1 pulled its state: {'yes' if r['pulled'] else 'NO'}", flush=True)  # fmt: skip
    gaps = [r["gap_s"] for r in results]
    print(f"# failover gap at the subscriber (default timeouts, node_timeout 1.5 s): median "
          f"{statistics.median(gaps) * 1000:.0f} ms, max {max(gaps) * 1000:.0f} ms over {len(gaps)} runs; "
          f"lost {sum(r['lost'] for r in results)}, duplicated {sum(r['duplicated'] for r in results)}; "
          f"run directories: {base}")  # fmt: skip
    return 0 if all(r["pulled"] and not r["violations"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
