"""Measure the partition placements of client/ring.py: balance and what a join or a leave moves.

    python scripts/ring_balance.py                      # P=256, R=2, members n1..nN for N = 3..10
    python scripts/ring_balance.py --partitions 1024 --members 5

For each placement and N: the most loaded member over the average (primaries, and copies: primary
+ secondary), then the join of member N+1 and the worst leave of one member: primaries that
changed member and copies placed on a new member, as a ratio to the ideal (a join: P/(N+1)
primaries and R*P/(N+1) copies; a leave: what the leaving member held). docs/cluster.md records
the output.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from roost.client import ring


def measure(placement: str, n: int, partitions: int, replicas: int) -> dict[str, float]:
    ids = [f"n{i}" for i in range(1, n + 1)]
    a = ring.assign(ids, partitions, replicas, placement)
    prim, held = ring.loads(a, ids)
    out = {
        "primary max/avg": max(prim.values()) / (partitions / n),
        "copies max/avg": max(held.values()) / (partitions * min(replicas, n) / n),
    }
    joined = ring.assign([*ids, f"n{n + 1}"], partitions, replicas, placement)
    p, c = ring.moved(a, joined)
    out["join primaries/ideal"] = p / (partitions / (n + 1))
    out["join copies/ideal"] = c / (partitions * min(replicas, n + 1) / (n + 1))
    worst_p = worst_c = 0.0
    if n > replicas:
        for leaver in ids:
            rest = [m for m in ids if m != leaver]
            p, c = ring.moved(a, ring.assign(rest, partitions, replicas, placement))
            worst_p = max(worst_p, p / max(prim[leaver], 1))
            worst_c = max(worst_c, c / max(held[leaver], 1))
    out["leave primaries/share"] = worst_p
    out["leave copies/share"] = worst_c
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--partitions", type=int, default=256)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--members", type=int, nargs="*", default=list(range(3, 11)))
    a = ap.parse_args(argv)
    cols = (
        "primary max/avg",
        "copies max/avg",
        "join primaries/ideal",
        "join copies/ideal",
        "leave primaries/share",
        "leave copies/share",
    )
    print(f"P={a.partitions} R={a.replicas}")
    print(f"| placement | N | {' | '.join(cols)} |")
    print("|---|---|" + "---|" * len(cols))
    worst: dict[str, dict[str, float]] = {}
    for placement in ring.PLACEMENTS:
        for n in a.members:
            m = measure(placement, n, a.partitions, a.replicas)
            w = worst.setdefault(placement, dict.fromkeys(cols, 0.0))
            for c in cols:
                w[c] = max(w[c], m[c])
            print(f"| {placement} | {n} | " + " | ".join(f"{m[c]:.2f}" for c in cols) + " |")
    print("\nworst over N:")
    for placement, w in worst.items():
        print(f"| {placement} | all | " + " | ".join(f"{w[c]:.2f}" for c in cols) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
