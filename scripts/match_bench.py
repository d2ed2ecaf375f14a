"""Matching cost of the node's subscription index (node/subscriptions.py) with many subscriptions.

For each kind of subscription (exact topics, wildcard patterns, patterns with tag queries) and each
count (by default 1,000, 10,000 and 100,000 subscriptions), fills one index the way the broker core
does, then times the matching of a stream of messages: the bare-topic lookup plus the trie walk and
query evaluation (what ``Delivery._publish`` calls for each message). Prints microseconds per
message and how many subscribers each message matched, so the cost can be read against the work:

    python scripts/match_bench.py
    python scripts/match_bench.py --counts 100000 --messages 50000 --json

Single process, one core, no sockets: a figure is Python work per message on this machine.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from roost.node.subscriptions import SubscriptionIndex

Sub = tuple[str, bytes]  # (filter, subscriber)
Msg = tuple[str, dict[str, str] | None]


def exact(n: int, rng: random.Random) -> tuple[list[Sub], Callable[[], Msg]]:
    """n subscribers, one per topic ``bench.<i>``; messages on random ones of those topics."""
    subs = [(f"bench.{i}", i.to_bytes(16, "big")) for i in range(n)]
    return subs, lambda: (f"bench.{rng.randrange(n)}", None)


def wildcard(n: int, rng: random.Random) -> tuple[list[Sub], Callable[[], Msg]]:
    """n wildcard patterns: ``region.<i>.*`` and ``region.<i>.>`` alternately, plus the topic's own
    ``region.*.<leaf>``: a message on ``region.<j>.<leaf>`` matches about 3 of them."""
    subs = []
    for i in range(n):
        who = i.to_bytes(16, "big")
        if i % 3 == 0:
            subs.append((f"region.{i // 3}.*", who))
        elif i % 3 == 1:
            subs.append((f"region.{i // 3}.>", who))
        else:
            subs.append((f"region.*.leaf{i // 3}", who))
    groups = max(1, n // 3)
    return subs, lambda: (f"region.{rng.randrange(groups)}.leaf{rng.randrange(groups)}", None)


def query(n: int, rng: random.Random) -> tuple[list[Sub], Callable[[], Msg]]:
    """n distinct query subscriptions ``orders.<i % 1000>.* where kind = 'order' AND amount > <k>``:
    a message reaches the patterns of 1/1000 of them, evaluates each of their queries and passes
    about half of them (the work grows with the filters a message reaches)."""
    subs = []
    for i in range(n):
        k = (i // 1000) % 200
        subs.append((f"orders.{i % 1000}.* where kind = 'order' AND amount > {k}", i.to_bytes(16, "big")))
    return subs, lambda: (f"orders.{rng.randrange(1000)}.x", {"kind": "order", "amount": str(rng.randrange(200))})


KINDS: dict[str, Callable[[int, random.Random], tuple[list[Sub], Callable[[], Msg]]]] = {
    "exact": exact, "wildcard": wildcard, "query": query,
}  # fmt: skip


def match_all(index: SubscriptionIndex, topic: str, tags: dict[str, str] | None) -> int:
    """What the delivery layer does per message (node/delivery.py _publish, _filtered)."""
    subs = index.match(topic, None)
    n = len(subs) if subs else 0
    if index.filters:
        for fs in index.matching_filters(topic, tags):
            group = fs.keys.get(None)
            n += len(group) if group else 0
    return n


def run(kind: str, count: int, messages: int, repeat: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    subs, next_msg = KINDS[kind](count, rng)
    index = SubscriptionIndex()
    t0 = time.perf_counter()
    for f, who in subs:
        index.add(f, None, who, 1)
    fill = time.perf_counter() - t0
    stream = [next_msg() for _ in range(messages)]
    times, matched = [], 0
    for _ in range(repeat):
        matched = 0
        t0 = time.perf_counter()
        for topic, tags in stream:
            matched += match_all(index, topic, tags)
        times.append(time.perf_counter() - t0)
    best = statistics.median(times)
    return {"kind": kind, "subscriptions": count, "messages": messages, "us_per_message": best / messages * 1e6,
            "matched_per_message": matched / messages, "fill_s": fill}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--counts",
        type=lambda v: [int(x) for x in v.split(",")],
        default=[1000, 10_000, 100_000],
        help="subscription counts, comma-separated (default 1000,10000,100000)",
    )
    ap.add_argument(
        "--kinds", type=lambda v: v.split(","), default=list(KINDS), help="exact,wildcard,query (default: all)"
    )
    ap.add_argument("--messages", type=int, default=20_000, help="messages matched per run (default 20000)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per cell; the median is shown (default 3)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true", help="one JSON object per cell instead of the table")
    args = ap.parse_args(argv)
    bad = [k for k in args.kinds if k not in KINDS]
    if bad:
        ap.error(f"unknown kind(s) {', '.join(bad)}: choose from {', '.join(KINDS)}")
    if not args.json:
        print(f"{'kind':<9} {'subscriptions':>13} {'us/message':>11} {'matched/message':>16} {'fill s':>7}")
    for kind in args.kinds:
        for count in args.counts:
            row = run(kind, count, args.messages, args.repeat, args.seed)
            if args.json:
                print(json.dumps(row))
            else:
                print(f"{kind:<9} {count:>13,} {row['us_per_message']:>11.2f} {row['matched_per_message']:>16.1f} "
                      f"{row['fill_s']:>7.2f}", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
