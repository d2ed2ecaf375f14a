"""Write a synthetic run directory (docs/eventlog.md) whose flaws are known, to test and time
scripts/check.py: a checker is only trusted once it finds exactly what was planted.

    python scripts/gen_events.py RUN_DIR --events 1000000 --seed 1
    python scripts/gen_events.py RUN_DIR --events 5000 --seed 3 --lose 3 --dup 2 --reorder 2

The run: members n1..n3; publishers pub-0 and pub-1 (reliable, topic `orders`, keys k0..k3,
through n1 and n2), pub-2 (fire, `orders`, keys k0/k1, through n1), pub-3 (reliable, `prices`,
no key, through n3); subscribers sub-0 (`orders`, reliable), sub-1 (`orders` key k1, reliable),
sub-2 (`orders`, fire), sub-3 (`prices` and `orders` key k2, reliable), all confirmed before the
first publish, and sub-4 (`orders`, reliable) that subscribes at 40% of the run and unsubscribes
at 70%. The broker is modelled as perfect (every acknowledged message reaches every matching
subscriber once, in order), except:

- sub-4 misses every message published in the first 0.2 s after its confirmation (inside the
  checker's default 0.5 s grace; truth `grace_missed` lists the reliable ones);
- `--lose K`: K deliveries of reliable messages acknowledged by n1 or n2 are dropped (truth
  `lost`, all violations: no fault explains them);
- `--dup K`: K deliveries, in either mode, are written twice (truth `duplicated`);
- `--reorder K`: K pairs of consecutive deliveries on one reliable path swap times, so the lower
  seq arrives second (truth `reordered`: that lower seq);
- `--kill-lose K`: n3 is killed at 80% of the run (restarted 1 s later) and K deliveries to sub-3
  of pub-3 messages n3 acknowledged in the 4 s before that are dropped (truth `allowed_lost`);
- `--malformed K`: K bad lines (bad JSON, a missing field, a wrong type) at random places (truth
  `malformed`: file and line);
- `--disagree`: n2's status digest differs from the others' (truth `agreed` false).

A `loss` fault on all members for 1 s mid-run is always there (harmless: it explains nothing).
The ground truth goes to RUN_DIR/truth.json.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

EVENTS_PER_MESSAGE = 4.08  # measured average over this topology, to size a run from --events
MSG_INTERVAL = 0.0005  # seconds between two publishes (all publishers together), at least
MIN_DURATION = 10.0  # seconds of publishing at least, so that sub-4's window outlasts its grace
KILLED = "n3"

PUBLISHERS: list[tuple[str, str, str, str, list[str | None]]] = [  # proc, mode, member, topic, keys
    ("pub-0", "reliable", "n1", "orders", ["k0", "k1", "k2", "k3"]),
    ("pub-1", "reliable", "n2", "orders", ["k0", "k1", "k2", "k3"]),
    ("pub-2", "fire", "n1", "orders", ["k0", "k1"]),
    ("pub-3", "reliable", "n3", "prices", [None]),
]
SUBSCRIPTIONS: list[tuple[str, str, str | None, str, str]] = [  # sub, topic, key, mode, member
    ("sub-0", "orders", None, "reliable", "n1"),
    ("sub-1", "orders", "k1", "reliable", "n2"),
    ("sub-2", "orders", None, "fire", "n3"),
    ("sub-3", "prices", None, "reliable", "n2"),
    ("sub-3", "orders", "k2", "reliable", "n2"),
]
LATE: tuple[str, str, str | None, str, str] = ("sub-4", "orders", None, "reliable", "n1")
LATE_MISSED = 0.2  # sub-4 misses what is published this long after its confirmation

Event = dict[str, Any]


def _ev(t: float, proc: str, ev: str, **fields: Any) -> Event:
    return {"t": round(t, 6), "proc": proc, "ev": ev, **fields}


def generate(
    run_dir: str | Path,
    events: int,
    seed: int,
    lose: int = 0,
    dup: int = 0,
    reorder: int = 0,
    kill_lose: int = 0,
    malformed: int = 0,
    disagree: bool = False,
) -> dict[str, Any]:
    """Write the run to `run_dir` and return its truth (also written to truth.json)."""
    rng = random.Random(seed)
    root = Path(run_dir)
    (root / "events").mkdir(parents=True, exist_ok=True)
    for old in (root / "events").glob("*.jsonl"):
        old.unlink()
    n_msgs = max(60, round(events / EVENTS_PER_MESSAGE))
    start = 1_700_000_000.0 + seed
    first_pub = start + 1.0
    interval = max(MSG_INTERVAL, MIN_DURATION / n_msgs)
    duration = n_msgs * interval
    last_pub = first_pub + duration
    ended = last_pub + 1.0
    late_open, late_close = first_pub + 0.4 * duration, first_pub + 0.7 * duration
    kill_t = first_pub + 0.8 * duration
    pids = {proc: f"{rng.getrandbits(64):016x}" for proc, *_ in PUBLISHERS}
    files: dict[str, list[Event]] = {proc: [] for proc, *_ in PUBLISHERS}
    subs_all = [*SUBSCRIPTIONS, LATE]
    for sub, *_ in subs_all:
        files.setdefault(sub, [])
    for i, (sub, topic, key, mode, member) in enumerate(SUBSCRIPTIONS):
        files[sub].append(
            _ev(start + 0.1 + 0.01 * i, sub, "subscribe", sub=sub, topic=topic, key=key, mode=mode, member=member)
        )
    files[LATE[0]].append(
        _ev(late_open, LATE[0], "subscribe", sub=LATE[0], topic=LATE[1], key=LATE[2], mode=LATE[3], member=LATE[4])
    )

    # deliveries[(sub, pid)] = list of [t, seq, event], in seq order; a path of one subscriber process.
    deliveries: dict[tuple[str, str], list[list[Any]]] = {}
    last_t: dict[tuple[str, str], float] = {}
    meta: dict[tuple[str, int], tuple[str, str, float]] = {}  # (pid, seq) -> (proc, mode, publish t)
    grace_missed: list[list[Any]] = []
    seqs = dict.fromkeys(pids, 0)
    for n in range(n_msgs):
        proc, pmode, member, topic, keys = PUBLISHERS[n % len(PUBLISHERS)]
        pid = pids[proc]
        seqs[proc] += 1
        seq = seqs[proc]
        key = keys[rng.randrange(len(keys))]
        t = first_pub + n * interval
        meta[(pid, seq)] = (proc, pmode, t)
        files[proc].append(_ev(t, proc, "publish", pid=pid, seq=seq, topic=topic, key=key, mode=pmode, member=member))
        if pmode == "reliable":
            files[proc].append(_ev(t + 0.0003 + 0.0004 * rng.random(), proc, "puback", pid=pid, seq=seq, member=member))
        served: set[str] = set()
        for sub, stopic, skey, smode, _ in subs_all:
            if stopic != topic or (skey is not None and skey != key) or sub in served:
                continue
            if sub == LATE[0]:
                if not late_open < t < late_close:
                    continue
                if t < late_open + LATE_MISSED:
                    if pmode == "reliable":
                        grace_missed.append([pid, seq, sub])
                    continue
            served.add(sub)
            dmode = "fire" if "fire" in (pmode, smode) else "reliable"
            path = (sub, pid)
            dt = max(t + 0.0005 + 0.002 * rng.random(), last_t.get(path, 0.0) + 0.00001)
            last_t[path] = dt
            deliveries.setdefault(path, []).append(
                [
                    dt,
                    seq,
                    _ev(dt, sub, "deliver", sub=sub, topic=topic, key=key, mode=dmode, pid=pid, seq=seq, member=member),
                ]
            )

    # Plant the flaws on distinct messages, away from the run's edges and from sub-4.
    used: set[tuple[str, int]] = set()
    lo_t, hi_t = first_pub + 0.05 * duration, first_pub + 0.75 * duration
    candidates = [
        (path, i)
        for path, lst in sorted(deliveries.items())
        if path[0] != LATE[0]
        for i in range(len(lst) - 1)
        if lo_t < meta[(path[1], lst[i][1])][2] < hi_t
    ]
    rng.shuffle(candidates)
    truth: dict[str, Any] = {"lost": [], "allowed_lost": [], "duplicated": [], "reordered": []}
    dropped: set[int] = set()
    extra: list[Event] = []

    def take(want: int, label: str, ok: Any) -> list[tuple[tuple[str, str], int]]:
        got: list[tuple[tuple[str, str], int]] = []
        for path, i in candidates:
            if len(got) == want:
                break
            lst = deliveries[path]
            pair = [(path[1], lst[i][1]), (path[1], lst[i + 1][1])]
            if any(m in used for m in pair) or not ok(path, lst, i):
                continue
            used.update(pair)
            got.append((path, i))
        if len(got) < want:
            raise SystemExit(f"gen_events: only {len(got)} places for {want} {label}; use more --events")
        return got

    def reliable_by(members: tuple[str, ...]) -> Any:
        def ok(path: tuple[str, str], lst: list[list[Any]], i: int) -> bool:
            ev = lst[i][2]
            return bool(ev["mode"] == "reliable" and ev["member"] in members)

        return ok

    for path, i in take(lose, "losses", reliable_by(("n1", "n2"))):
        dropped.add(id(deliveries[path][i][2]))
        truth["lost"].append([path[1], deliveries[path][i][1], path[0]])
    for path, i in take(dup, "duplicates", lambda p, lst, i: True):
        ev = deliveries[path][i][2]
        extra.append({**ev, "t": round(ev["t"] + 0.0003, 6)})
        truth["duplicated"].append([path[1], ev["seq"], path[0]])
    for path, i in take(reorder, "reorderings", reliable_by(("n1", "n2", "n3"))):
        a, b = deliveries[path][i][2], deliveries[path][i + 1][2]
        a["t"], b["t"] = b["t"], a["t"]
        truth["reordered"].append([path[1], a["seq"], path[0]])
    faults = [
        _ev(
            first_pub + 0.5 * duration,
            "nemesis",
            "fault",
            fault="loss",
            target="all",
            phase="start",
            params={"percent": 10},
        ),
        _ev(first_pub + 0.5 * duration + 1.0, "nemesis", "fault", fault="loss", target="all", phase="end"),
    ]
    if kill_lose:
        faults += [
            _ev(kill_t, "nemesis", "fault", fault="kill", target=KILLED, phase="start", params={"signal": 9}),
            _ev(kill_t + 1.0, "nemesis", "fault", fault="kill", target=KILLED, phase="end"),
        ]

        def before_kill(path: tuple[str, str], lst: list[list[Any]], i: int) -> bool:
            ev = lst[i][2]  # (lost only if published within the checker's horizon before the kill)
            return bool(
                ev["member"] == KILLED
                and ev["mode"] == "reliable"
                and ev["sub"] == "sub-3"
                and kill_t - 4.0 < ev["t"] < kill_t
            )

        for path, i in take(kill_lose, "losses before the kill", before_kill):
            dropped.add(id(deliveries[path][i][2]))
            truth["allowed_lost"].append([path[1], deliveries[path][i][1], path[0], "allowed: serving member died"])
    truth["killed"] = {"member": KILLED, "t": kill_t} if kill_lose else None

    for lst in deliveries.values():
        for _, _, ev in lst:
            if id(ev) not in dropped:
                files[ev["proc"]].append(ev)
    for ev in extra:
        files[ev["proc"]].append(ev)
    for sub, topic, key, _, _ in subs_all:
        files[sub].append(
            _ev(late_close if sub == LATE[0] else last_pub + 0.5, sub, "unsubscribe", sub=sub, topic=topic, key=key)
        )
    files["nemesis"] = faults
    digest = f"{rng.getrandbits(128):032x}"
    files["status"] = [
        _ev(
            ended - 0.2,
            "status",
            "status",
            member=m,
            state="ready",
            subscriptions=6,
            digest=(f"{rng.getrandbits(128):032x}" if disagree and m == "n2" else digest),
        )
        for m in ("n1", "n2", "n3")
    ]

    lines: dict[str, list[str | None]] = {}
    total = 0
    for proc, evs in files.items():
        evs.sort(key=lambda e: e["t"])
        lines[proc] = [json.dumps(e, separators=(",", ":")) for e in evs]
        total += len(evs)
    bad = [
        '{"t": 1.5, "proc": "sub-0", "ev": "deliver", "sub": "sub-0"',  # cut short: bad JSON
        '{"t": 1.5, "proc": "pub-0", "ev": "publish", "pid": "ab", "topic": "orders"}',  # no seq
        '{"t": 1.5, "proc": "sub-0", "ev": "deliver", "sub": "sub-0", "topic": "orders", "key": null, '
        '"mode": "reliable", "pid": "ab", "seq": "7", "member": "n1"}',  # seq is a string
        "[1, 2, 3]",
    ]
    procs = sorted(lines)
    for _ in range(malformed):
        target = lines[procs[rng.randrange(len(procs))]]
        target.insert(rng.randrange(len(target) + 1), None)  # a placeholder, numbered below
    truth["malformed"] = []
    for proc in procs:
        out = []
        for lineno, line in enumerate(lines[proc], 1):
            if line is None:
                line = bad[len(truth["malformed"]) % len(bad)]
                truth["malformed"].append([f"{proc}.jsonl", lineno])
            out.append(line)
        (root / "events" / f"{proc}.jsonl").write_text("\n".join(out) + "\n")

    run = {
        "seed": seed,
        "config": "synthetic",
        "config_text": "[timeouts]\nsubscriber_timeout = 10.0\n",
        "duration": round(ended - start, 3),
        "faults": "loss" + (",kill" if kill_lose else ""),
        "members": {
            m: {"client": f"127.0.0.1:74{i}1", "peer": f"127.0.0.1:75{i}1"} for i, m in enumerate(("n1", "n2", "n3"))
        },
        "netns": False,
        "started": start,
        "ended": ended,
        "version": 1,
    }
    (root / "run.json").write_text(json.dumps(run, indent=1) + "\n")
    for k in ("lost", "allowed_lost", "duplicated", "reordered"):
        truth[k].sort()
    truth.update(
        events=total,
        messages=n_msgs,
        grace_missed=sorted(grace_missed),
        agreed=not disagree,
        late={"sub": LATE[0], "open": late_open, "close": late_close},
    )
    (root / "truth.json").write_text(json.dumps(truth, indent=1) + "\n")
    return truth


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("run_dir")
    ap.add_argument("--events", type=int, default=10_000, help="about this many events (default 10000)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--lose", type=int, default=0, help="drop K reliable deliveries (violations)")
    ap.add_argument("--dup", type=int, default=0, help="write K deliveries twice")
    ap.add_argument("--reorder", type=int, default=0, help="swap K pairs of deliveries on reliable paths")
    ap.add_argument("--kill-lose", type=int, default=0, help="kill n3 and drop K of its deliveries (allowed)")
    ap.add_argument("--malformed", type=int, default=0, help="insert K malformed lines")
    ap.add_argument("--disagree", action="store_true", help="give n2 a different status digest")
    a = ap.parse_args(argv)
    truth = generate(a.run_dir, a.events, a.seed, a.lose, a.dup, a.reorder, a.kill_lose, a.malformed, a.disagree)
    print(
        f"{a.run_dir}: {truth['events']} events, {truth['messages']} messages; lost {len(truth['lost'])}, "
        f"allowed {len(truth['allowed_lost'])}, duplicated {len(truth['duplicated'])}, "
        f"reordered {len(truth['reordered'])}, malformed {len(truth['malformed'])}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
