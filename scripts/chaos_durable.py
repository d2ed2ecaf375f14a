"""The durable workload of a chaos run (scripts/chaos.py, partitioned mode): publishers that put,
subscribers that get and commit and crash now and then, and the driver's part in restarting them.

Durable mode (docs/durable.md) promises what reliable mode cannot: an acknowledged put survives
the death of a member, and a durable subscription's cursor lives on the cluster, so a consumer
that crashes gets again what it had not committed, and nothing it had. A chaos run checks both
on real processes: --durable (on by default in partitioned mode) adds

* ``dpub-0``, ``dpub-1``: puts of numbered payloads to three durable topics at --durable-rate;
* ``dsub-0`` (client ``dc-0``, all three topics) and ``dsub-1`` (client ``dc-1``, two of them),
  each reading its durable subscription ``w`` from the earliest offset;

and each subscriber kills itself with SIGKILL between receiving a batch and committing it, with
the seeded chance --durable-crash per batch (not in its first seconds, and not in the last 4 s
of the faults, so that the settle sees every subscriber caught up). The driver starts a killed
subscriber again at once with the same client name and a new seed; it appends to the same event
file. After the publishers ended, the driver waits (up to --durable-drain seconds) until every
subscriber has logged every acknowledged put of its topics, then the usual --settle: on a loaded
machine a subscriber can be minutes behind, and a fixed settle would make that look like loss.
It only waits; scripts/check.py judges (a subscriber still behind is reported as such).
run.json's ``durable`` says what ran, how often each subscriber was restarted and how long the
drain took.

The topics are chosen so that with the generated 3-member config (256 partitions) each member is
the primary of one durable topic (its preferred leader) and the secondary of another: every member
fault hits a durable partition's leader, and each topic has a partition of its own (a get's answer
names the subscription and partition, not the topic). With durable ``replicas`` 3 every member
holds every durable log, and the three members are the metadata quorum's voters: every member
fault hits a voter too (now and then the quorum's leader), while a majority stays up.
"""

from __future__ import annotations

import argparse
import json
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scripts.chaos import Run

TOPICS = ("dur.b", "dur.f", "dur.i")  # primaries n2, n3, n1; secondaries n1, n1, n2 (see above)
PUBLISHERS = 2
# (worker name, durable client name, subscription name, topics)
SUBSCRIBERS = (("dsub-0", "dc-0", "w", TOPICS), ("dsub-1", "dc-1", "w", TOPICS[1:]))
CRASH_AFTER = 2.0  # seconds a subscriber process lives before it may crash (each life makes progress)
QUIET_END = 4.0  # no crash in the last seconds of the faults


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--durable", action=argparse.BooleanOptionalAction, default=None,
                    help="durable publishers and subscribers (scripts/chaos_durable.py); default: on when the "
                         "cluster is partitioned, which durable mode needs")  # fmt: skip
    ap.add_argument("--durable-rate", type=float, default=50.0, help="puts per second per durable publisher")
    ap.add_argument("--durable-drain", type=float, default=120.0,
                    help="seconds at most to wait after the publishers for the durable subscribers to read every "
                         "acknowledged put (default 120)")  # fmt: skip
    ap.add_argument(
        "--durable-crash",
        type=float,
        default=0.05,
        help="chance per batch that a durable subscriber crashes before committing it (default 0.05)",
    )


def wanted(args: argparse.Namespace, mode: str) -> bool:
    """Whether the run has durable workers; ValueError when asked for in a replicated cluster."""
    if args.durable and mode != "partitioned":
        raise ValueError("--durable needs a partitioned cluster (--mode partitioned, or a config that says so)")
    if not 0 < args.durable_rate <= 1000 or not 0 <= args.durable_crash <= 1 or args.durable_drain < 0:
        raise ValueError("--durable-rate must be from 0 to 1000, --durable-crash from 0 to 1, --durable-drain >= 0")
    return mode == "partitioned" if args.durable is None else bool(args.durable)


class DurableWorkers:
    """The durable workers of one run, and their restarts."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.restarts: dict[str, int] = {name: 0 for name, *_ in SUBSCRIBERS}
        self.crash_until = 0.0
        self.info: dict[str, Any] = {
            "topics": list(TOPICS), "rate": run.args.durable_rate, "crash": run.args.durable_crash,
            "publishers": [f"dpub-{i}" for i in range(PUBLISHERS)],
            "subscribers": {name: {"client": client, "durable": durable, "topics": list(topics)}
                            for name, client, durable, topics in SUBSCRIBERS},
            "restarts": self.restarts,
        }  # fmt: skip
        run.info["durable"] = self.info

    def _sub_argv(self, i: int) -> list[str]:
        name, client, durable, topics = SUBSCRIBERS[i]
        seed = self.run.args.seed * 100 + 80 + i + 1000 * self.restarts[name]  # (a new life, a new draw)
        return ["dsub", "--seed", str(seed), "--topics", ",".join(topics), "--client", client, "--durable", durable,
                "--crash", str(self.run.args.durable_crash), "--crash-after", str(CRASH_AFTER),
                "--crash-until", f"{self.crash_until:.3f}"]  # fmt: skip

    def start_subscribers(self, faults_end: float) -> None:
        """``faults_end``: the Unix time the faults stop (the end of --duration)."""
        self.crash_until = faults_end - QUIET_END
        for i, (name, *_) in enumerate(SUBSCRIBERS):
            self.run.start_worker(name, self._sub_argv(i))

    def start_publishers(self) -> None:
        args = self.run.args
        for i in range(PUBLISHERS):
            self.run.start_worker(f"dpub-{i}", ["dpub", "--seed", str(args.seed * 100 + 70 + i), "--topics",
                                                ",".join(TOPICS), "--rate", str(args.durable_rate),
                                                "--duration", str(args.duration)])  # fmt: skip

    def watch(self) -> None:
        """Start again, with the same client name, a subscriber that killed itself (SIGKILL)."""
        for i, (name, *_) in enumerate(SUBSCRIBERS):
            p = self.run.workers.get(name)
            if p is not None and p.poll() == -signal.SIGKILL:
                self.restarts[name] += 1
                self.run.start_worker(name, self._sub_argv(i))

    def settle(self, seconds: float) -> None:
        """Drain (above), then wait ``seconds`` (the run's settle), restarting crashed subscribers
        meanwhile."""
        started = time.monotonic()
        drain_end = started + self.run.args.durable_drain
        log = Progress(self.run.out / "events")
        while time.monotonic() < drain_end:
            self.watch()
            owed, read = log.owed()
            if read >= owed:
                break
            time.sleep(0.5)
        owed, read = log.owed()
        self.info["drain"] = {"seconds": round(time.monotonic() - started, 1), "owed": owed, "read": read}
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.watch()
            time.sleep(min(0.2, max(0.0, end - time.monotonic())))


class Progress:
    """What the durable workers logged so far, read incrementally: how many (subscription,
    acknowledged put) pairs are owed, and how many of them were read. Only for the drain's wait."""

    def __init__(self, events: Path) -> None:
        self.events = events
        self.pos: dict[Path, int] = {}
        self.topic: dict[tuple[str, int], str] = {}
        self.acked: set[tuple[str, int]] = set()
        self.read: dict[tuple[str, str], set[tuple[str, int]]] = {}  # (client, topic) -> messages

    def _lines(self, path: Path) -> list[dict[str, Any]]:
        with open(path, "rb") as f:
            f.seek(self.pos.get(path, 0))
            data = f.read()
        end = data.rfind(b"\n") + 1  # (a line still being written waits for the next look)
        self.pos[path] = self.pos.get(path, 0) + end
        out = []
        for line in data[:end].splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue  # (the checker reports malformed lines)
        return out

    def owed(self) -> tuple[int, int]:
        for path in sorted(self.events.glob("dpub-*.jsonl")):
            for e in self._lines(path):
                if e.get("ev") == "put":
                    self.topic[(e["pid"], e["seq"])] = e["topic"]
                elif e.get("ev") == "putack":
                    self.acked.add((e["pid"], e["seq"]))
        for path in sorted(self.events.glob("dsub-*.jsonl")):
            for e in self._lines(path):
                if e.get("ev") == "record":
                    self.read.setdefault((e["client"], e["topic"]), set()).add((e["pid"], e["seq"]))
        owed = read = 0
        for _, client, _, topics in SUBSCRIBERS:
            for topic in topics:
                got = self.read.get((client, topic), set())
                for m in self.acked:
                    if self.topic.get(m) == topic:
                        owed += 1
                        read += m in got
        return owed, read
