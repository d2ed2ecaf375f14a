"""Where W3's latency goes, hop by hop: one W3 run of ``scripts/bench.py`` (Roost alone) with every
process's UDP sends and receives time-stamped, and each message followed through them.

Each process of the run (publisher, node, subscriber) loads a ``sitecustomize`` from a temporary
directory that wraps ``socket.sendto`` and ``socket.recvfrom`` and notes CLOCK_MONOTONIC for each
datagram carrying a bench payload (its index is found by the payload's padding); the subscriber
notes when the application took each message. A message's path is then

    made (the publisher's payload) -> publisher's sendto -> node's recvfrom -> node's sendto
    -> subscriber's recvfrom -> the application has it

and the table gives the median and 90th percentile of each step over the measured messages (the
ones after the warm-up that travelled alone or first in their datagram). The wrappers cost a
few microseconds a datagram, so the total is a little above a plain run's p50.

    python scripts/benchhops.py --mode fire
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: Loaded by every process of the run (PYTHONPATH): notes the datagrams carrying bench payloads.
SITECUSTOMIZE = """
import atexit, builtins, json, os, socket, struct, sys, time

_ns, _rec, _pad, _head = time.monotonic_ns, [], b"x" * 84, struct.Struct("!Qd")
builtins.__roost_hops__ = _rec
_sendto, _recvfrom = socket.socket.sendto, socket.socket.recvfrom


def _note(t, op, data):
    p = bytes(data).find(_pad)
    if p >= 16:
        i, made = _head.unpack_from(data, p - 16)
        _rec.append((t, op, i))
        _rec.append((int(made * 1e9), "made", i))


def sendto(self, data, *a):
    t = _ns()
    r = _sendto(self, data, *a)
    if len(data) >= 100:
        _note(t, "send", data)
    return r


def recvfrom(self, *a):
    r = _recvfrom(self, *a)
    if len(r[0]) >= 100:
        _note(_ns(), "recv", r[0])
    return r


socket.socket.sendto, socket.socket.recvfrom = sendto, recvfrom


@atexit.register
def _dump():
    if _rec:
        with open(os.path.join(os.environ["ROOST_HOPS_DIR"], f"{os.getpid()}.json"), "w") as f:
            json.dump({"argv": sys.argv, "rec": _rec}, f)
"""

STEPS = [("made", "pub_send"), ("pub_send", "node_recv"), ("node_recv", "node_send"), ("node_send", "sub_recv"),
         ("sub_recv", "sub_app")]  # fmt: skip
NAMES = {"made": "payload made", "pub_send": "publisher sendto", "node_recv": "node recvfrom",
         "node_send": "node sendto", "sub_recv": "subscriber recvfrom", "sub_app": "application has it"}  # fmt: skip


def run(mode: str, workdir: str, quick: bool = False) -> str:
    """One W3 run with the wrappers loaded; returns the bench's table row."""
    Path(workdir, "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {**os.environ, "ROOST_HOPS_DIR": workdir,
           "PYTHONPATH": os.pathsep.join([workdir, str(ROOT), os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    cmd = [sys.executable, str(ROOT / "scripts" / "bench.py"), "--workloads", "W3", "--modes", mode]
    out = subprocess.run(cmd + (["--quick"] if quick else []), env=env, capture_output=True, text=True,
                         timeout=300, check=True).stdout  # fmt: skip
    return next((line for line in out.splitlines() if line.startswith("| W3")), out.strip())


def hops(workdir: str, warmup: int = 500) -> dict[int, dict[str, int]]:
    """Each message's first time at each point of its path (ns), by index."""
    at: dict[int, dict[str, int]] = {}
    for f in Path(workdir).glob("*.json"):
        doc = json.loads(f.read_text())
        argv = " ".join(doc["argv"])
        role = "pub" if "--role pub" in argv else "sub" if "--role sub" in argv else "node"
        for t, op, i in doc["rec"]:
            key = op if op == "made" else f"{role}_{op}"
            at.setdefault(i, {}).setdefault(key, t)
    return {i: v for i, v in at.items() if i >= warmup and all(a in v and b in v for a, b in STEPS)}


def table(at: dict[int, dict[str, int]]) -> str:
    def pct(xs: list[float], q: float) -> float:
        return sorted(xs)[int(len(xs) * q)]

    rows = ["| step | p50 us | p90 us |", "|---|---|---|"]
    for a, b in STEPS:
        xs = [(v[b] - v[a]) / 1000 for v in at.values()]
        rows.append(f"| {NAMES[a]} -> {NAMES[b]} | {pct(xs, 0.5):.0f} | {pct(xs, 0.9):.0f} |")
    total = [(v["sub_app"] - v["made"]) / 1000 for v in at.values()]
    rows.append(f"| total | {pct(total, 0.5):.0f} | {pct(total, 0.9):.0f} |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=("reliable", "fire"), default="fire")
    ap.add_argument("--quick", action="store_true", help="a tenth of the messages (a smoke test)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="roost-hops-") as workdir:
        row = run(a.mode, workdir, a.quick)
        at = hops(workdir, 50 if a.quick else 500)
    if not at:
        sys.exit("no message was followed through all the hops (did the run fail?)\n" + row)
    print(f"# W3 {a.mode}, {len(at)} messages followed; the bench's own row:\n{row}\n")
    print(table(at))


if __name__ == "__main__":
    main()
