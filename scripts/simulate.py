"""Simulation campaigns: many seeds of the whole cluster in one process each.

    python scripts/simulate.py --seeds 10000            # seeds 0..9999 on every core
    python scripts/simulate.py --replay 4242 -v         # one seed again, every violation
    python scripts/simulate.py --seeds 300 --break no-dedup   # show that a broken build is caught
    python scripts/simulate.py --mode partitioned --seeds 200 --break early-ack   # (durable mode)

Each seed runs sim/simulation.py: N member cores and M client sessions over a
fake network and disk, with a seeded nemesis (partitions, member crashes,
client restarts), then checks the invariants of sim/check.py (and, in
partitioned mode, of the durable workload: sim/durablecheck.py). A
failing seed prints the one command that replays it. Exit status 1 if any
seed violated an invariant.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sim.breaks import BREAKS
from sim.simulation import run_seed
from sim.world import FAULTS


def _run(job: tuple[int, dict[str, Any], str | None]) -> tuple[int, list[str], dict[str, int], int]:
    seed, kw, broken = job
    check, stats = run_seed(seed, broken=broken, **kw)
    return seed, check.violations, stats, check.checked


def replay_command(seed: int, args: argparse.Namespace) -> str:
    cmd = f"python scripts/simulate.py --replay {seed} --members {args.members} --clients {args.clients}"
    cmd += f" --faults {shlex.quote(','.join(args.faults))}"  # ('' for none)
    cmd += f" --mode {args.mode}" if args.mode != "replicated" else ""
    cmd += " --no-durable" if args.no_durable else ""
    return cmd + (f" --break {args.broken}" if args.broken else "")


def parse_faults(text: str) -> list[str]:
    faults = [f for f in text.split(",") if f]
    bad = [f for f in faults if f not in FAULTS]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown fault {bad[0]!r}; known: {', '.join(FAULTS)}")
    return faults


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=200, help="how many seeds to run (default 200)")
    ap.add_argument("--start", type=int, default=0, help="first seed (default 0)")
    ap.add_argument("--members", type=int, default=3, choices=range(2, 8), metavar="2..7",
                    help="cluster members (default 3)")  # fmt: skip
    ap.add_argument("--clients", type=int, default=4, choices=range(2, 17), metavar="2..16",
                    help="client sessions, half subscribers, half publishers (default 4)")  # fmt: skip
    ap.add_argument(
        "--faults",
        type=parse_faults,
        default=list(FAULTS),
        help=f"comma-separated, from {','.join(FAULTS)} (default all; '' for none)",
    )
    ap.add_argument(
        "--mode", choices=("replicated", "partitioned"), default="replicated", help="cluster mode (default replicated)"
    )
    ap.add_argument("--no-durable", action="store_true",
                    help="partitioned mode: without the durable workload (sim/durable.py)")  # fmt: skip
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes (default: cores)")
    ap.add_argument("--replay", type=int, metavar="SEED", help="run this one seed and print its violations")
    ap.add_argument(
        "--break",
        dest="broken",
        choices=sorted(BREAKS),
        help="run a deliberately broken build, to see the simulator catch it",
    )
    ap.add_argument("-v", "--verbose", action="store_true", help="print every violation, not the first 3")
    args = ap.parse_args(argv)
    kw = {"members": args.members, "clients": args.clients, "faults": tuple(args.faults), "mode": args.mode,
          "durable": not args.no_durable}  # fmt: skip
    seeds = [args.replay] if args.replay is not None else list(range(args.start, args.start + args.seeds))
    jobs = [(s, kw, args.broken) for s in seeds]
    t0 = time.perf_counter()
    failed: list[tuple[int, list[str]]] = []
    totals = {"crashes": 0, "stops": 0, "partitions": 0, "client_restarts": 0, "client_cuts": 0, "joins": 0,
              "leaves": 0, "pauses": 0, "durable_acked": 0, "durable_consumed": 0, "durable_excused": 0}  # fmt: skip
    checked = 0
    if args.jobs > 1 and len(jobs) > 1:
        with ProcessPoolExecutor(args.jobs) as pool:
            results = list(pool.map(_run, jobs, chunksize=max(1, len(jobs) // (args.jobs * 8))))
    else:
        results = [_run(j) for j in jobs]
    for seed, violations, stats, n in results:
        checked += n
        for k in totals:
            totals[k] += stats.get(k, 0)
        if violations:
            failed.append((seed, violations))
    elapsed = time.perf_counter() - t0
    for seed, violations in failed:
        print(f"seed {seed}: {len(violations)} violation(s)")
        for v in violations if args.verbose or args.replay is not None else violations[:3]:
            print(f"  {v}")
        print(f"  replay: {replay_command(seed, args)}")
    n_viol = sum(len(v) for _, v in failed)
    print(f"{len(seeds)} seeds in {elapsed:.1f} s ({len(seeds) / elapsed:.1f} seeds/s, {args.jobs} jobs); "
          f"faults: {totals['crashes']} crashes, {totals['stops']} stops, {totals['partitions']} partitions, "
          f"{totals['client_restarts']} client restarts, {totals['client_cuts']} client cuts, "
          f"{totals['joins']} joins, {totals['leaves']} leaves, {totals['pauses']} pauses; "
          f"{checked} deliveries checked; "
          + (f"durable: {totals['durable_acked']} puts acknowledged, {totals['durable_consumed']} records "
             f"consumed, {totals['durable_excused']} lost records excused (docs/durable.md); "
             if totals["durable_acked"] else "")
          + f"{n_viol} violations in {len(failed)} seeds"
          + (f" [broken build: {args.broken}]" if args.broken else ""))  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
