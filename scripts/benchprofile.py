"""Sampling profiles of the bench's processes (``scripts/bench.py --profile DIR``), by py-spy.

py-spy reads a process's Python stacks from outside (``--nonblocking``: without stopping it), so
the process runs at its normal speed, unlike an in-process profiler whose hook on every call
triples the cost of the many small calls a message takes. Each process's raw samples (one line
per distinct stack: ``frame;frame;... count``) go to ``DIR/<run>-<role>.raw``, and
:func:`summary` turns them into the table docs/performance.md shows: the functions with the most
samples of their own (self) and under them (total), as a share of the process's samples.

    python scripts/benchprofile.py DIR/W1-100-reliable-pub.raw      # the table of one profile
"""

from __future__ import annotations

import collections
import re
import shutil
import subprocess
import sys

FRAME = re.compile(r"^(?P<fn>[^ (]+) \((?P<file>[^:)]+)(?::\d+)?\)$")
IDLE = ("wait_readable", "epoll", "get_events", "select", "poll", "_sleep", "wait_for")


def start(pid: int, path: str, rate: int = 1000) -> subprocess.Popen[bytes] | None:
    """Record ``pid`` into ``path`` until it exits (None when py-spy is missing)."""
    spy = shutil.which("py-spy") or shutil.which("py-spy", path=f"{sys.prefix}/bin")
    if spy is None:
        return None
    cmd = [spy, "record", "--pid", str(pid), "--rate", str(rate), "--nonblocking", "--format", "raw", "--output", path]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _name(frame: str) -> str:
    m = FRAME.match(frame.strip())
    if not m:
        return frame.strip()
    file = m["file"].split("/")[-1]
    return f"{m['fn']} ({file})"


def summary(path: str, top: int = 18) -> str:
    """The busiest functions of one raw profile: self and total share of the samples, idle
    (waiting in the event loop's poll) shown apart."""
    own: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    samples = idle = 0
    with open(path) as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not stack or not count.isdigit():
                continue
            n = int(count)
            frames = [_name(x) for x in stack.split(";") if x and not x.startswith("process ")]
            if not frames:
                continue
            samples += n
            if frames[-1].split(" ")[0].split(".")[-1] in IDLE:
                idle += n
                continue
            own[frames[-1]] += n
            for fn in set(frames):
                total[fn] += n
    if not samples:
        return f"{path}: no samples"
    busy = samples - idle
    lines = [
        f"{samples} samples, {100 * idle / samples:.0f}% idle (in the loop's poll or a sleep); "
        f"shares below are of the {busy} busy samples",
        "",
        "| self % | total % | function |",
        "|---|---|---|",
    ]
    for fn, n in own.most_common(top):
        lines.append(f"| {100 * n / busy:5.1f} | {100 * total[fn] / busy:5.1f} | {fn} |")
    return "\n".join(lines)


if __name__ == "__main__":
    for p in sys.argv[1:]:
        print(f"## {p}\n\n{summary(p)}\n")
