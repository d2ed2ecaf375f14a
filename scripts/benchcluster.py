"""scripts/bench.py's cluster and scaling runs: W6, W7, S1, S2 and S3 (Roost only).

The peers' clusters (NATS routes, Redis Cluster, Mosquitto bridges) are not set up by the bench,
so these runs have Roost rows only. Members are real ``roost node --config C --id nX`` processes
(the command ``roost cluster up`` runs, cluster/launcher.py) on free loopback ports, with a
config written like tests/clusterkit.py's LocalCluster (``write_local_config``) in a temp dir,
the bench's node limits, and the default failure detector; every process is stopped by its pid
at the end of each run, also on errors.

- **W6 replicated cluster**: 3 members; 3 publisher processes, publisher k at member k, all
  publishing to the same topic (each its own block of indexes, so a subscriber tells them
  apart); 3 subscriber processes, one per member, each due every message. Every member delivers
  what its publisher gave it straight to every subscriber, so each subscriber gets 3 streams,
  FIFO per publisher (checked per publisher). 3 x 100,000 messages, each delivered 3 times.
- **W7 partitioned cluster**: 5 members (``mode = "partitioned"``, 256 partitions, 2 replicas, as
  configs/cluster5-partitioned.toml); 100 topics, so that the hash ring spreads them; 5
  publisher processes (publisher k connects to member k, a block of indexes each, round-robin
  over the 100 topics), 10 subscriber processes on 10 topics each (subscriber k connects to
  member k mod 5). Each client routes by the map it is given: one session per primary it needs.
  Order is checked per publisher and topic (a publisher's topics have different primaries).
  5 x 40,000 messages, each delivered once.
- **S1 subscribers**: fan-out of one topic to 1, 10, 100 and 1,000 subscribers of one node.
  1,000 processes would not fit in 2 cores' memory and scheduler, so up to 10 subscriber
  processes each hold N/10 subscribers (a Client each, with its own socket and subscription:
  ``--clients`` of the sub role). The messages shrink as N grows, 200,000 deliveries in all
  (200,000 messages to 1 subscriber ... 200 to 1,000), so each run takes seconds.
- **S2 sizes**: W5's runs (16 B to 60 KB fan-in), shown again as msgs/s and MB/s by size.
- **S3 memory per subscriber mailbox** (reliable): the node's resident set (VmRSS from
  /proc/PID/status) with 1,000 idle subscribers (10 processes x 100 clients, one reliable
  subscription each) against none, divided by 1,000; then one subscriber process is stopped
  (SIGSTOP: it cannot acknowledge, so the node keeps every message in its mailbox) and a
  publisher sends it 100,000 messages of 100 bytes: RSS growth per queued message, next to the
  node's own count of the mailbox's bytes (/varz ``mailbox_bytes``).

``--quick`` takes a tenth of the messages, deliveries, idle subscribers and queued messages (S1
keeps its subscriber counts): W6 takes 2-3 s then, W7 5-10 s (on 2 cores).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from roost.cluster.config import load_cluster_config
from roost.cluster.launcher import free_tcp_port, node_command, write_local_config
from roost.node.procs import probe_status, wait_ready
from scripts.benchsystems import ROOST_LIMITS, ROOT, Server, results, said_ready, spawn, start_server, stop_all

SECRET = "roost-bench-secret-0123456789"
PARTITIONED = 'mode = "partitioned"\npartitions = 256\nreplicas = 2\n'
SUBSCRIBER_COUNTS = (1, 10, 100, 1000)
MAX_PROCESSES = 10  # subscriber processes of S1 and S3 (each holds N / 10 subscribers beyond 10)
READY_TIMEOUT = 60.0  # a member ready, the members agreeing, subscriptions replicated


def peers_skipped(runs: list[str]) -> str:
    """The note that says why these Roost-only ``runs`` have no peer rows."""
    why = []
    if {"W6", "W7"} & set(runs):
        why.append("the bench does not set up NATS, Redis or Mosquitto clustering (NATS routes, Redis Cluster, "
                   "Mosquitto bridges)")  # fmt: skip
    if {"S1", "S3"} & set(runs):
        why.append("many subscribers per process and a node's memory are measured with Roost's client and node only")
    return f"# {'/'.join(runs)}: peers skipped: {'; '.join(why)}"


def workloads(scale: int) -> dict[str, list[dict[str, Any]]]:
    """W6, W7 and S1, as scripts/bench.py's workloads(): runs of ``roost_only`` specs."""
    w7 = [[f"w7.t{10 * s + j}" for j in range(10)] for s in range(10)]
    s1 = []
    for n in SUBSCRIBER_COUNTS:
        procs = min(n, MAX_PROCESSES)
        s1.append(
            dict(
                subs=[["s1"]] * procs,
                clients=n // procs,
                n=max(20, 200_000 // scale // n),
                size=100,
                rate=0.0,
                roost_only=True,
                label=f"fan-out 1->{n}",
            )
        )
    return {
        "W6": [dict(subs=[["w6"]] * 3, n=300_000 // scale, pubs=3, members=3, partitioned=False, order="publisher",
                    size=100, rate=0.0, roost_only=True, label="3 members, 3 pubs -> 3 subs")],
        "W7": [dict(subs=w7, n=200_000 // scale, pubs=5, members=5, partitioned=True, order="topic",
                    topics=[t for ts in w7 for t in ts], size=100, rate=0.0, roost_only=True,
                    label="5 partitioned, 100 topics")],
        "S1": s1,
    }  # fmt: skip


# ------------------------------------------------------------------ a cluster of member processes


def start_cluster(members: int, partitioned: bool) -> Server:
    """``members`` member processes on free loopback ports, each ready (its own STATUS answers),
    a partitioned cluster's maps all full. The Server's ``addr`` lists every member's address,
    and its ``settle`` waits until the members hold the subscriptions made."""
    work = tempfile.mkdtemp(prefix="roost-bench-cluster-")
    cfg = Path(work) / "cluster.toml"
    ports = write_local_config(cfg, members, SECRET, cluster_extra=PARTITIONED if partitioned else "",
                               node_extra=f'[node]\nlog_level = "warning"\n{ROOST_LIMITS}')  # fmt: skip
    cc = load_cluster_config(cfg)
    ids = list(ports)
    addrs = [("127.0.0.1", ports[m][0]) for m in ids]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for m in ids:
            with open(f"{work}/{m}.log", "wb") as log:
                procs.append(subprocess.Popen(node_command(str(cfg), m), stdout=log, stderr=log, cwd=ROOT))
        for p, m in zip(procs, ids, strict=True):
            wait_ready(p, m, cc.member(m).client_addr, READY_TIMEOUT, Path(f"{work}/{m}.log"))
        if partitioned:  # (a client routes by the map it is given first: the full one)
            _until(addrs, lambda sts: all(sorted(st["map"]["live"]) == ids for st in sts), f"every map has {ids}")
    except BaseException:
        if procs:
            Server("roost", procs[0], "", work, procs[1:]).stop()
        shutil.rmtree(work, ignore_errors=True)
        raise

    def settle(subscriptions: int) -> None:
        """A member CMDACKs a replicated SUB before pushing it to its peers (a partitioned one once
        the owners hold it): publishers start once every member that delivers knows it."""
        if partitioned:  # (each index holds only partitions its member owns: replicas x in all)
            _until(addrs, lambda sts: sum(st["subscriptions"] for st in sts) == 2 * subscriptions,
                   f"{2 * subscriptions} subscriptions held in all")  # fmt: skip
        else:
            _until(addrs, lambda sts: all(st["subscriptions"] == subscriptions for st in sts),
                   f"{subscriptions} subscriptions at every member")  # fmt: skip

    return Server("roost", procs[0], ",".join(f"{h}:{p}" for h, p in addrs), work, procs[1:], settle)


def _until(addrs: list[tuple[str, int]], cond: Callable[[list[dict[str, Any]]], bool], what: str) -> None:
    """Poll every member's STATUS until ``cond`` holds for them; RuntimeError after READY_TIMEOUT."""
    deadline, sts = time.monotonic() + READY_TIMEOUT, []
    while time.monotonic() < deadline:
        sts = [st for a in addrs if (st := probe_status(*a, timeout=1.0)) is not None]
        if len(sts) == len(addrs) and cond(sts):
            return
        time.sleep(0.1)
    seen = [st.get("subscriptions") for st in sts]
    raise RuntimeError(f"cluster: not {what} within {READY_TIMEOUT:g} s (subscriptions per member: {seen})")


# ------------------------------------------------------------------ S3: memory per mailbox


def rss(pid: int) -> int:
    """Resident set of a process in bytes (VmRSS)."""
    with open(f"/proc/{pid}/status") as f:
        m = re.search(r"VmRSS:\s+(\d+) kB", f.read())
    return 1024 * int(m.group(1)) if m else 0


def _steady_rss(pid: int, timeout: float = 10.0) -> int:
    """The node's RSS once it stopped changing for a second (or after ``timeout``)."""
    deadline, last = time.monotonic() + timeout, rss(pid)
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = rss(pid)
        if now == last:
            break
        last = now
    return last


def _varz(monitor: str) -> dict[str, Any]:
    """The node's /varz. A node started from an environment with $ROOST_MONITOR_TOKEN requires
    that token (node/config.py), so it is sent when set."""
    token = os.environ.get("ROOST_MONITOR_TOKEN", "")
    auth = {"Authorization": f"Bearer {token}"} if token else {}
    req = urllib.request.Request(f"http://{monitor}/varz", headers=auth)
    with urllib.request.urlopen(req, timeout=5) as r:
        doc: dict[str, Any] = json.loads(r.read())
    return doc


def memory(scale: int) -> dict[str, Any]:
    """S3 (see the module docstring): bytes of node memory per idle subscriber and per queued
    message. No subscriber times out while it is measured (``subscriber_timeout`` 300 s)."""
    n_subs, n_msgs, t0 = 1000 // scale, 100_000 // scale, time.monotonic()
    monitor = f"127.0.0.1:{free_tcp_port('127.0.0.1')}"
    server = start_server("roost", f'[timeouts]\nsubscriber_timeout = 300\n[monitor]\naddr = "{monitor}"\n')
    pid, procs = server.proc.pid, []
    common = ["--role", "sub", "--system", "roost", "--addr", server.addr, "--mode", "reliable", "--idle", "60"]
    try:
        time.sleep(1.0)
        before = _steady_rss(pid)
        per = max(1, n_subs // MAX_PROCESSES)
        procs = [spawn([*common, "--topics", "s3.idle", "-n", "1", "--clients", str(per)])
                 for _ in range(n_subs // per)]  # fmt: skip
        said_ready(procs, READY_TIMEOUT)
        idle = _steady_rss(pid)
        stop_all(procs)  # (the node keeps their records until subscriber_timeout)
        queued = spawn([*common, "--topics", "s3.q", "-n", str(n_msgs)])
        procs.append(queued)
        said_ready([queued], READY_TIMEOUT)
        os.kill(queued.pid, signal.SIGSTOP)
        empty = _steady_rss(pid)
        procs.append(spawn(["--role", "pub", "--system", "roost", "--addr", server.addr, "--mode", "reliable",
                            "--topics", "s3.q", "-n", str(n_msgs), "--size", "100"]))  # fmt: skip
        acked = results(procs[-1:], time.monotonic() + 120)[0]["all_acked"]
        full = _steady_rss(pid)
        held = _varz(monitor)["mailbox_bytes"]
    finally:
        stop_all(procs)
        server.stop()
    return {"system": "roost", "workload": "S3", "mode": "reliable", "subscribers": n_subs,
            "rss_before": before, "rss_idle": idle, "bytes_per_subscriber": (idle - before) / n_subs,
            "queued": n_msgs, "all_acked": acked, "rss_empty": empty, "rss_full": full,
            "bytes_per_queued": (full - empty) / n_msgs, "mailbox_bytes": held,
            "seconds": round(time.monotonic() - t0, 1)}  # fmt: skip


# ------------------------------------------------------------------ scaling tables and plot


def scaling_table(rows: list[dict[str, Any]], mem: dict[str, Any] | None) -> str:
    """S1's msgs/s by subscriber count, W5's by size (msgs/s and MB/s), and S3's memory."""
    out = []
    s1 = [r for r in rows if r["workload"] == "S1"]
    if s1:
        out += ["## throughput against subscribers (S1: one publisher, one topic, one node)", "",
                "| subscribers | mode | messages | delivered msgs/s | lost | dup | cpu s node/pub/sub |",
                "|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in sorted(s1, key=lambda r: (r["mode"], r["subscribers"])):
            c = r["cpu"]
            out.append(
                f"| {r['subscribers']:,} | {r['mode']} | {r['messages']:,} | {r['msgs_per_s']:,.0f} | "
                f"{r['lost']} | {r['duplicated']} | {c['node']}/{c['publisher']}/{c['subscriber']} |"
            )
        out.append("")
    w5 = [r for r in rows if r["workload"] == "W5" and r["system"] == "roost"]
    if w5:
        out += ["## throughput against message size (W5: fan-in 1->1)", "",
                "| size B | mode | msgs/s | MB/s | lost | dup |", "|---|---|---|---|---|---|"]  # fmt: skip
        for r in sorted(w5, key=lambda r: (r["mode"], r["size"])):
            out.append(f"| {r['size']:,} | {r['mode']} | {r['msgs_per_s']:,.0f} | "
                       f"{r['msgs_per_s'] * r['size'] / 1e6:,.1f} | {r['lost']} | {r['duplicated']} |")  # fmt: skip
        out.append("")
    if mem:
        mib = 1 << 20
        out += ["## node memory per subscriber mailbox (S3, reliable)", "",
                "| what | count | node RSS before MiB | after MiB | bytes each | node's count |",
                "|---|---|---|---|---|---|",
                f"| idle subscribers (a client, a subscription, an empty mailbox) | {mem['subscribers']:,} | "
                f"{mem['rss_before'] / mib:.1f} | {mem['rss_idle'] / mib:.1f} | "
                f"{mem['bytes_per_subscriber']:,.0f} | - |",
                f"| queued 100 B messages in one stopped subscriber's mailbox | {mem['queued']:,} | "
                f"{mem['rss_empty'] / mib:.1f} | {mem['rss_full'] / mib:.1f} | {mem['bytes_per_queued']:,.0f} | "
                f"mailbox_bytes {mem['mailbox_bytes'] / mem['queued']:,.0f} each |"]  # fmt: skip
    return "\n".join(out).rstrip()


def plot_scaling(rows: list[dict[str, Any]], mem: dict[str, Any] | None, path: str) -> None:
    """msgs/s against subscribers (log scale), msgs/s and MB/s against size, and memory, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(14, 4))
    for mode in sorted({r["mode"] for r in rows}):
        s1 = sorted((r["subscribers"], r["msgs_per_s"]) for r in rows if r["workload"] == "S1" and r["mode"] == mode)
        if s1:
            a1.plot(*zip(*s1, strict=True), marker="o", label=mode)
        w5 = sorted((r["size"], r["msgs_per_s"]) for r in rows
                    if r["workload"] == "W5" and r["system"] == "roost" and r["mode"] == mode)  # fmt: skip
        if w5:
            a2.plot(*zip(*w5, strict=True), marker="o", label=f"{mode} msgs/s")
            a2.plot([s for s, _ in w5], [s * m / 1e3 for s, m in w5], marker="x", linestyle="--",
                    label=f"{mode} KB/s")  # fmt: skip
    a1.set(xscale="log", xlabel="subscribers (one topic)", ylabel="deliveries/s", title="S1 fan-out")
    a2.set(xscale="log", yscale="log", xlabel="message size, bytes", ylabel="msgs/s (o), KB/s (x)",
           title="W5 sizes, fan-in 1->1")  # fmt: skip
    if mem:
        a3.bar(["per idle subscriber", "per queued 100 B message"], [mem["bytes_per_subscriber"],
               mem["bytes_per_queued"]])  # fmt: skip
    a3.set(ylabel="node RSS bytes", title="S3 memory")
    for ax in (a1, a2):
        if ax.lines:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def scaling_path(path: str) -> str:
    """``bench.png`` -> ``bench-scaling.png``."""
    root, ext = os.path.splitext(path)
    return f"{root}-scaling{ext or '.png'}"
