"""The long fuzz campaign: the structure-aware fuzzer of tests/fuzz/ with fresh seeds, until a
number of mutated frames (or a time limit), printing frames/s as it goes.

    python scripts/fuzz.py                                  # 10,000,000 mutated frames, every target
    python scripts/fuzz.py --frames 500000 --target node,config --seed 7
    python scripts/fuzz.py --replay member:123456789        # one round again, shrunk, its trace printed

It runs in rounds; each round gives every target a few hypothesis examples (100-300 frames
each) under a seed of its own, drawn from ``--seed`` (random unless given, printed either way).
A failure is shrunk by hypothesis, printed with the frames that led to it, and the command that
replays its round is printed; the exit status is then 1. ``make test`` runs a bounded campaign of
the same targets (tests/test_fuzz.py); docs/security.md ("Fuzzing") says what is checked.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.fuzz import campaign
from tests.fuzz.campaign import Tally

#: Examples per round and target: about the shares of the campaign in make test (tests/test_fuzz.py).
PER_ROUND = {"node": 20, "member": 20, "client": 25, "config": 15}


def targets(text: str) -> list[str]:
    out = [t for t in text.split(",") if t]
    bad = [t for t in out if t not in PER_ROUND]
    if bad or not out:
        raise argparse.ArgumentTypeError(f"unknown target {bad[0] if bad else text!r}; known: {', '.join(PER_ROUND)}")
    return out


def replay(spec: str, examples: int) -> int:
    target, _, seed = spec.partition(":")
    tally = Tally()
    try:
        campaign.run(target, examples, tally, seed=int(seed))
    except Exception:
        traceback.print_exc()
        return 1
    print(f"{target} seed {seed}: no failure; {tally.line()}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=10_000_000, help="mutated frames to feed (default 10,000,000)")
    ap.add_argument("--seed", type=int, help="the seed the rounds' seeds are drawn from (default: random)")
    ap.add_argument("--target", type=targets, default=list(PER_ROUND), help="node,member,client,config (default all)")
    ap.add_argument("--max-minutes", type=float, default=240.0, help="stop after this long (default 240)")
    ap.add_argument("--replay", metavar="TARGET:SEED", help="run one target's round of that seed again")
    args = ap.parse_args(argv)
    if args.replay:
        return replay(args.replay, max(PER_ROUND.values()))
    seed = args.seed if args.seed is not None else random.SystemRandom().getrandbits(32)
    rng = random.Random(seed)
    print(f"fuzzing {', '.join(args.target)} for {args.frames:,} mutated frames, --seed {seed}", flush=True)
    tally = Tally()
    start, last = time.monotonic(), 0.0
    deadline = start + args.max_minutes * 60
    while tally.mutated < args.frames and time.monotonic() < deadline:
        for target in args.target:
            round_seed = rng.getrandbits(32)
            try:
                campaign.run(target, PER_ROUND[target], tally, seed=round_seed)
            except Exception:
                traceback.print_exc()
                print(f"\nFAILED after {tally.mutated:,} mutated frames; replay with:\n"
                      f"  python scripts/fuzz.py --replay {target}:{round_seed}", flush=True)  # fmt: skip
                return 1
            if tally.mutated >= args.frames:
                break
        if time.monotonic() - last >= 30:
            last = time.monotonic()
            shares = ", ".join(f"{t} {n:,}" for t, n in tally.per_target.items())
            print(f"[{last - start:7.0f} s] {tally.line()} ({shares})", flush=True)
    elapsed = time.monotonic() - start
    print(f"done in {elapsed:,.0f} s: {tally.line()}; {tally.frames / elapsed:,.0f} frames/s with the legitimate ones")
    if tally.mutated < args.frames:
        print(f"stopped by --max-minutes before {args.frames:,} mutated frames")
    return 0


if __name__ == "__main__":
    sys.exit(main())
