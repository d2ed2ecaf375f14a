#!/usr/bin/env python3
"""A full-cluster crash drill for durable mode: acknowledged puts, ``kill -9`` of every member, a
restart of all, and a durable subscription that must read every record back once, in order.

    python scripts/durable_restart.py --runs 10            # configs/cluster5-partitioned.toml

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
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def roost(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "roost", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return str(v)


def write_config(source: Path, work: Path) -> Path:
    """The source config's settings and members, with data and secret under ``work``."""
    data = tomllib.loads(source.read_text())
    lines = []
    for section, table in data.items():
        if section == "members":
            continue
        lines.append(f"[{section}]")
        for k, v in table.items():
            if k == "secret_file":
                v = str(work / "cluster.secret")
            lines.append(f"{k} = {toml_value(v)}")
    for m in data["members"]:
        lines.append("[[members]]")
        for k, v in m.items():
            if k == "data_dir":
                v = str(work / "data" / m["id"])
            lines.append(f"{k} = {toml_value(v)}")
    path = work / "cluster.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def run_once(source: Path, work: Path, puts: int, timeout: float) -> tuple[bool, str]:
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    config = write_config(source, work)
    ids = [m["id"] for m in tomllib.loads(config.read_text())["members"]]
    addr = tomllib.loads(config.read_text())["members"][0]["client_addr"]
    run_dir = str(work / "run")
    up = roost("cluster", "up", str(config), "--detach", "--run-dir", run_dir, timeout=timeout)
    if up.returncode != 0:
        return False, f"cluster up failed: {up.stderr[-500:]}"
    try:
        put = roost("put", "drill", "r{n}", "--count", str(puts), "--node", addr, "--timeout", str(timeout),
                    timeout=timeout + 30)  # fmt: skip
        if put.returncode != 0:
            return False, f"roost put: {put.stderr.strip()[-300:]}"
        for mid in ids:
            roost("cluster", "kill", mid, "--run-dir", run_dir, timeout=60)
        for mid in ids:
            started = roost("cluster", "start", mid, "--run-dir", run_dir, timeout=timeout + 30)
            if started.returncode != 0:
                return False, f"cluster start {mid}: {started.stderr.strip()[-300:]}"
        t0 = time.monotonic()
        got = roost("get", "drill", "--durable", "drill", "--count", str(puts), "--node", addr, "--timeout",
                    str(timeout), timeout=timeout + 30)  # fmt: skip
        took = time.monotonic() - t0
        lines = got.stdout.splitlines()
        want = [f"r{n}" for n in range(puts)]
        if lines != want:
            firstbad = next((i for i, (a, b) in enumerate(zip(lines, want, strict=False)) if a != b), min(len(lines),
                            len(want)))  # fmt: skip
            return False, (f"read {len(lines)} of {puts}, first difference at {firstbad} "
                           f"({lines[firstbad:firstbad + 1]} for {want[firstbad:firstbad + 1]}); "
                           f"{got.stderr.strip()[-200:]}")  # fmt: skip
        return True, f"all {puts} records once and in order, read in {took:.1f} s after the restart"
    finally:
        roost("cluster", "down", "--run-dir", run_dir, timeout=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "configs" / "cluster5-partitioned.toml"))
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--puts", type=int, default=2000)
    ap.add_argument("--timeout", type=float, default=60.0, help="bound of every wait, seconds (default 60)")
    ap.add_argument("--work", default=str(ROOT / "run" / "durable-restart"))
    args = ap.parse_args(argv)
    ok = 0
    for i in range(args.runs):
        good, what = run_once(Path(args.config), Path(args.work), args.puts, args.timeout)
        ok += good
        print(f"run {i + 1}: {'OK' if good else 'FAILED'}: {what}", flush=True)
    print(f"{ok} of {args.runs} runs read every acknowledged record back once, in order")
    return 0 if ok == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
