#!/usr/bin/env python3
"""A full-cluster crash drill for durable mode: acknowledged puts, ``kill -9`` of every member, a
restart of all, and a durable subscription that must read every record back once, in order.

    python scripts/durable_restart.py --runs 10            # configs/cluster5-partitioned.toml
    python scripts/durable_restart.py --port-shift 30000   # its ports moved (beside a cluster on them)

Each run copies the config's members and settings into a fresh directory under ``--work`` (its own
data directories and secret, so it touches nothing of a cluster you run), starts the members with
``roost cluster up --detach``, puts ``--puts`` numbered records to one topic with ``roost put``
(each acknowledged, or the run fails), kills every member with SIGKILL (``roost cluster kill``),
starts every one again (``roost cluster start``), and reads the topic with ``roost get --durable``
from the earliest offset. It prints, per run, whether every record came back once and in order,
and how long the read took after the last member was started; the exit status is 1 if any run
failed. Every wait is bounded (``--timeout``).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from scripts.durable_cluster import roost, write_config  # noqa: E402


class Outcome(NamedTuple):
    """One run: every record read back once and in order, what happened, and the seconds from the
    last member's start (its ``roost cluster start`` returned: it serves) to the end of the read
    (``roost get`` as a new process: its interpreter's start is in it); None if the read failed."""

    ok: bool
    what: str
    read_s: float | None
    start_s: float | None = None  # (from the first member's start to the last one serving, one after another)


def run_once(source: Path, work: Path, puts: int, timeout: float, port_shift: int = 0,
             hosts: Mapping[str, str] | None = None) -> Outcome:  # fmt: skip
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    config = write_config(source, work, port_shift, hosts)
    members = tomllib.loads(config.read_text())["members"]
    ids = [m["id"] for m in members]
    addr = members[0]["client_addr"]
    run_dir = str(work / "run")
    up = roost("cluster", "up", str(config), "--detach", "--run-dir", run_dir, timeout=timeout)
    if up.returncode != 0:
        return Outcome(False, f"cluster up failed: {up.stderr[-500:]}", None)
    try:
        put = roost("put", "drill", "r{n}", "--count", str(puts), "--node", addr, "--timeout", str(timeout),
                    timeout=timeout + 30)  # fmt: skip
        if put.returncode != 0:
            return Outcome(False, f"roost put: {put.stderr.strip()[-300:]}", None)
        for mid in ids:
            roost("cluster", "kill", mid, "--run-dir", run_dir, timeout=60)
        t_start = time.monotonic()
        for mid in ids:
            started = roost("cluster", "start", mid, "--run-dir", run_dir, timeout=timeout + 30)
            if started.returncode != 0:
                return Outcome(False, f"cluster start {mid}: {started.stderr.strip()[-300:]}", None)
        t0 = time.monotonic()
        start_s = t0 - t_start
        got = roost("get", "drill", "--durable", "drill", "--count", str(puts), "--node", addr, "--timeout",
                    str(timeout), timeout=timeout + 30)  # fmt: skip
        took = time.monotonic() - t0
        lines = got.stdout.splitlines()
        want = [f"r{n}" for n in range(puts)]
        if lines != want:
            firstbad = next((i for i, (a, b) in enumerate(zip(lines, want, strict=False)) if a != b), min(len(lines),
                            len(want)))  # fmt: skip
            return Outcome(False, (f"read {len(lines)} of {puts} in {took:.1f} s, first difference at {firstbad} "
                                   f"({lines[firstbad:firstbad + 1]} for {want[firstbad:firstbad + 1]}); "
                                   f"{got.stderr.strip()[-200:]}"), None)  # fmt: skip
        return Outcome(True, f"all {puts} records once and in order, read in {took:.2f} s after the restart "
                             f"(starting the members in turn took {start_s:.1f} s)", took, start_s)  # fmt: skip
    finally:
        roost("cluster", "down", "--run-dir", run_dir, timeout=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "configs" / "cluster5-partitioned.toml"))
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--puts", type=int, default=2000)
    ap.add_argument("--timeout", type=float, default=60.0, help="bound of every wait, seconds (default 60)")
    ap.add_argument("--work", default=str(ROOT / "run" / "durable-restart"))
    ap.add_argument("--port-shift", type=int, default=0, help="every port of the config moved by this much")
    args = ap.parse_args(argv)
    ok = 0
    for i in range(args.runs):
        out = run_once(Path(args.config), Path(args.work), args.puts, args.timeout, args.port_shift)
        ok += out.ok
        print(f"run {i + 1}: {'OK' if out.ok else 'FAILED'}: {out.what}", flush=True)
    print(f"{ok} of {args.runs} runs read every acknowledged record back once, in order")
    return 0 if ok == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
