"""Roost side by side with NATS, Redis and Mosquitto: the same workloads, one run, one table.

Every role is its own process on loopback: the server, the publisher, each subscriber
(scripts/benchsystems.py says how each system is driven and measured). Each subscriber checks
every message by the index in its payload and measures one-way latency against the publisher's
send time (CLOCK_MONOTONIC, shared by the processes of one machine).

Workloads (100-byte messages unless said):

- W1 fan-in: one publisher, one subscriber, 200,000 messages
- W2 fan-out: one publisher, ten subscribers, 20,000 messages each
- W3 latency: 2,000 messages/s paced, 5,000 measured after 500 of warm-up
- W4 many topics: 1,000 topics, 100 subscribers on 10 topics each, 100,000 messages
- W5 sizes: fan-in at 16 B, 1 KB, 8 KB and 60 KB
- W6 replicated cluster: 3 members, a publisher at each (the same topic), a subscriber at each,
  3 x 100,000 messages, each subscriber due all 300,000: aggregate msgs/s, node CPU summed
- W7 partitioned cluster: 5 members, 100 topics, 5 publishers, 10 subscribers on 10 topics each,
  200,000 messages
- S1 subscribers: fan-out of one topic to 1, 10, 100 and 1,000 subscribers (beyond 10, 10
  processes of many clients each), 200,000 deliveries per run
- S2 sizes: W5's runs, as msgs/s and MB/s by size
- S3 memory: the node's RSS per idle subscriber (1,000) and per message queued in a stopped
  subscriber's mailbox (100,000)

W6, W7 and S1-S3 are Roost's only (scripts/benchcluster.py says how they run, and why the peers
are skipped there); they print the same rows, and the scaling runs a table (and with --plot a
second PNG, ``X.png`` -> ``X-scaling.png``) of their own. ``--quick`` takes a tenth of every count
(not S1's subscriber counts).

    python scripts/bench.py                                  # Roost alone, W1-W5
    python scripts/bench.py --peers nats,redis,mosquitto     # and its peers, in the same run
    python scripts/bench.py --workloads W1,W3 --modes reliable --repeat 3 --json
    python scripts/bench.py --workloads W6,W7                # the clusters
    python scripts/bench.py --scaling --plot bench.png       # S1-S3: bench.png, bench-scaling.png

A peer whose server or client is missing is skipped, and the script says how to install it.
A run Roost's client refuses is skipped with a note saying why: W5's 60 KB fire run, as a fire
message must fit one datagram (``max_datagram``, 16,384 bytes by default).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from scripts import benchcluster, benchprofile  # noqa: E402
from scripts.benchsystems import (  # noqa: E402
    MODES,
    missing,
    process_cpu,
    results,
    run_role,
    said_ready,
    spawn,
    start_server,
    stop_all,
)

SYSTEMS = ("roost", "nats", "redis", "mosquitto")
READY_TIMEOUT = 120.0  # every subscriber process subscribed (1,000 subscribers take a few seconds)
RUN_TIMEOUT = 600.0  # the publishers and subscribers of one run done


def workloads(scale: int) -> dict[str, list[dict[str, Any]]]:
    """Workload -> its runs (a run: subscribers and their topics, messages, size, rate)."""
    w4 = [[f"w4.t{10 * s + j}" for j in range(10)] for s in range(100)]
    return {
        "W1": [dict(subs=[["w1"]], n=200_000 // scale, size=100, rate=0.0, label="fan-in 1->1")],
        "W2": [dict(subs=[["w2"]] * 10, n=20_000 // scale, size=100, rate=0.0, label="fan-out 1->10")],
        "W3": [dict(subs=[["w3"]], n=5_500 // scale, size=100, rate=2000.0, warmup=500 // scale,
                    label="latency, 2,000 msg/s")],
        "W4": [dict(subs=w4, n=100_000 // scale, size=100, rate=0.0, topics=[t for ts in w4 for t in ts],
                    label="1,000 topics, 100 subs x 10")],
        "W5": [dict(subs=[["w5"]], n=max(1000, n // scale), size=size, rate=0.0, label=f"fan-in {size} B")
               for size, n in ((16, 200_000), (1024, 100_000), (8192, 40_000), (60_000, 10_000))],
    }  # fmt: skip


class Refused(Exception):
    """Roost's client refused the run's messages (a fire message must fit one datagram: W5's
    60 KB does not with the default max_datagram): the run is skipped with a note."""


def run_once(system: str, workload: str, mode: str, spec: dict[str, Any], profile: str = "") -> dict[str, Any]:
    """One run: a fresh server (a cluster for W6/W7), the subscribers (each says ready), then the
    publishers. With ``profile`` (a directory), py-spy samples Roost's node (a cluster's first
    member), first publisher and first subscriber (scripts/benchprofile.py) into
    ``<workload>-<size>-<mode>-<role>.raw`` there."""
    spies: list[subprocess.Popen[bytes] | None] = []
    t0 = time.monotonic()

    def spy(pid: int, role: str) -> None:
        if profile and system == "roost":
            os.makedirs(profile, exist_ok=True)
            spies.append(benchprofile.start(pid, os.path.join(profile, f"{workload}-{spec['size']}-{mode}-{role}.raw")))

    server = benchcluster.start_cluster(spec["members"], spec["partitioned"]) if spec.get("members") else \
        start_server(system)  # fmt: skip
    addrs, procs = server.addr.split(","), []
    spy(server.proc.pid, "node")
    node_cpu0 = sum(process_cpu(p.pid) for p in server.processes)
    topics = spec.get("topics") or spec["subs"][0]
    n_total, n_pubs, clients = spec["n"], spec.get("pubs", 1), spec.get("clients", 1)
    share = {t: 0 for t in topics}  # (what each subscriber is due: messages go round-robin over topics)
    for i in range(len(topics)):
        share[topics[i]] = n_total // len(topics) + (1 if i < n_total % len(topics) else 0)
    order = len(topics) if spec.get("order") == "topic" else 1
    common = ["--system", system, "--mode", mode, "--publishers", str(n_pubs)]
    idle = "5" if spec["rate"] else "3"
    try:
        for k, sub_topics in enumerate(spec["subs"]):
            due = sum(share[t] for t in sub_topics)
            procs.append(spawn(["--role", "sub", *common, "--addr", addrs[k % len(addrs)], "--topics",
                                ",".join(sub_topics), "-n", str(due), "--space", str(n_total), "--warmup",
                                str(spec.get("warmup", 0)), "--idle", idle, "--clients", str(clients),
                                "--order-topics", str(order)]))  # fmt: skip
        subs = list(procs)
        spy(subs[0].pid, "sub")
        said_ready(subs, READY_TIMEOUT)
        if server.settle is not None:
            server.settle(sum(len(t) for t in spec["subs"]) * clients)
        per = n_total // n_pubs
        for k in range(n_pubs):  # (publisher k: a block of indexes at member k)
            n_k = per if k < n_pubs - 1 else n_total - per * k
            procs.append(spawn(["--role", "pub", *common, "--addr", addrs[k % len(addrs)], "--topics", ",".join(topics),
                                "-n", str(n_k), "--offset", str(per * k), "--size", str(spec["size"]),
                                "--rate", str(spec["rate"])]))  # fmt: skip
        spy(procs[len(subs)].pid, "pub")
        deadline = time.monotonic() + RUN_TIMEOUT
        pub_out = results(procs[len(subs) :], deadline)
        refused = [p["refused"] for p in pub_out if "refused" in p]
        if refused:
            raise Refused(refused[0])
        sub_out = results(subs, deadline)
        node_cpu = sum(process_cpu(p.pid) for p in server.processes) - node_cpu0
    finally:
        stop_all(procs)
        server.stop()
        for sp in spies:
            if sp is not None:
                sp.wait(30)
    delivered = sum(r["received"] for r in sub_out)
    got = [r for r in sub_out if r["received"]]
    span = max(r["last"] for r in got) - min(r["first"] for r in got) if got else 0.0
    lat = sorted(x for r in sub_out for x in r["latencies"])
    return {
        "system": system, "workload": workload, "mode": mode, "label": spec["label"], "size": spec["size"],
        "subscribers": len(spec["subs"]) * clients, "messages": n_total, "delivered": delivered,
        "msgs_per_s": delivered / span if span > 0 else 0.0,
        "lost": sum(r["lost"] for r in sub_out), "duplicated": sum(r["duplicated"] for r in sub_out),
        "out_of_order": sum(r["out_of_order"] for r in sub_out),
        "p50_us": 1e6 * lat[len(lat) // 2] if lat else None,
        "p99_us": 1e6 * lat[int(len(lat) * 0.99)] if lat else None,
        "max_us": 1e6 * lat[-1] if lat else None,
        "cpu": {"node": round(node_cpu, 2), "publisher": round(sum(p["cpu"] for p in pub_out), 2),
                "subscriber": round(sum(r["cpu"] for r in sub_out), 2)},
        "all_acked": all(p["all_acked"] for p in pub_out), "seconds": round(time.monotonic() - t0, 1),
    }  # fmt: skip


def median_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians of the rates and latencies over repeats; lost and duplicated summed."""
    out = dict(rows[0])
    for k in ("msgs_per_s", "p50_us", "p99_us", "max_us", "seconds"):
        vals = [r[k] for r in rows if r[k] is not None]
        out[k] = statistics.median(vals) if vals else None
    for k in ("lost", "duplicated", "out_of_order", "delivered"):
        out[k] = sum(r[k] for r in rows)
    out["cpu"] = {k: round(statistics.median(r["cpu"][k] for r in rows), 2) for k in rows[0]["cpu"]}
    out["runs"] = len(rows)
    return out


def ratios(rows: list[dict[str, Any]]) -> list[str]:
    """Roost's msgs/s (and W3 latency) over each peer's, for the same workload and size: the
    peer's row of the same mode, else its only mode."""
    lines = []
    for r in rows:
        if r["system"] != "roost":
            continue
        for peer in SYSTEMS[1:]:
            same = [p for p in rows if p["system"] == peer and p["workload"] == r["workload"]
                    and p["size"] == r["size"]]  # fmt: skip
            match = [p for p in same if p["mode"] == r["mode"]] or same
            if not match or not match[0]["msgs_per_s"]:
                continue
            q = match[0]
            text = f"{r['workload']} {r['label']:28} roost {r['mode']:8} / {peer} {q['mode']:8}: " \
                   f"{r['msgs_per_s'] / q['msgs_per_s']:5.2f}x msgs/s"  # fmt: skip
            if r["workload"] == "W3" and r["p50_us"] and q["p50_us"]:
                text += f", p50 {r['p50_us'] / q['p50_us']:.2f}x, p99 {r['p99_us'] / q['p99_us']:.2f}x " \
                        "(lower is better)"  # fmt: skip
            lines.append(text)
    return lines


def table(rows: list[dict[str, Any]]) -> str:
    def us(x: float | None) -> str:
        return f"{x:,.0f}" if x is not None else "-"

    out = ["| workload | system | mode | msgs/s | lost | dup | p50 us | p99 us | max us | cpu s node/pub/sub |",
           "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        c = r["cpu"]
        out.append(f"| {r['workload']} {r['label']} | {r['system']} | {r['mode']} | {r['msgs_per_s']:,.0f} | "
                   f"{r['lost']} | {r['duplicated']} | {us(r['p50_us'])} | {us(r['p99_us'])} | {us(r['max_us'])} | "
                   f"{c['node']}/{c['publisher']}/{c['subscriber']} |")  # fmt: skip
    return "\n".join(out)


def plot(rows: list[dict[str, Any]], path: str) -> None:
    """msgs/s of each workload (and size) by system and mode, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(r["workload"], r["size"]) for r in rows}, key=lambda g: (g[0], g[1]))
    series = sorted({(r["system"], r["mode"]) for r in rows})
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(groups)), 4))
    width = 0.8 / max(1, len(series))
    for i, (system, mode) in enumerate(series):
        ys = [next((r["msgs_per_s"] for r in rows if (r["workload"], r["size"], r["system"], r["mode"]) ==
                    (w, s, system, mode)), 0) for w, s in groups]  # fmt: skip
        ax.bar([g + i * width for g in range(len(groups))], ys, width, label=f"{system} {mode}")
    ax.set_xticks([g + 0.4 - width / 2 for g in range(len(groups))])
    ax.set_xticklabels([f"{w}\n{s} B" for w, s in groups])
    ax.set_ylabel("messages/s delivered")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peers", default="", help="comma list of nats, redis, mosquitto")
    ap.add_argument(
        "--workloads",
        default="",
        help="comma list of W1..W7, S1..S3 (default W1-W5; with --scaling, only the scaling runs)",
    )
    ap.add_argument("--scaling", action="store_true", help="the scaling runs too: S1, S2 (W5's runs) and S3")
    ap.add_argument("--modes", default="reliable,fire", help="comma list of reliable, fire")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each, medians reported (S3 runs once)")
    ap.add_argument("--quick", action="store_true", help="a tenth of the messages (a smoke test)")
    ap.add_argument("--json", action="store_true", help="one JSON row per line instead of the table")
    ap.add_argument(
        "--plot",
        default="",
        metavar="PNG",
        help="write a bar chart of msgs/s there (and the scaling runs' plot to PNG-scaling.png)",
    )
    ap.add_argument(
        "--profile",
        default="",
        metavar="DIR",
        help="sample Roost's node, publisher and a subscriber with py-spy; profiles go there",
    )
    # (a role in a child process)
    ap.add_argument("--role", choices=("sub", "pub"), help=argparse.SUPPRESS)
    ap.add_argument("--system", default="roost", help=argparse.SUPPRESS)
    ap.add_argument("--addr", help=argparse.SUPPRESS)
    ap.add_argument("--topics", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="reliable", help=argparse.SUPPRESS)
    ap.add_argument("-n", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--space", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--warmup", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--size", type=int, default=100, help=argparse.SUPPRESS)
    ap.add_argument("--rate", type=float, default=0.0, help=argparse.SUPPRESS)
    ap.add_argument("--idle", type=float, default=3.0, help=argparse.SUPPRESS)
    ap.add_argument("--offset", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--clients", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--publishers", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--order-topics", type=int, default=1, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.role:
        print(json.dumps(run_role(a.role, a.system, a.addr, a.topics.split(","), a.mode, a.n, a.size, a.rate,
                                  a.idle, a.space, a.warmup, a.offset, a.clients, a.publishers,
                                  a.order_topics)), flush=True)  # fmt: skip
        return
    from tqdm import tqdm

    systems = ["roost"]
    for peer in filter(None, a.peers.split(",")):
        if peer not in SYSTEMS[1:]:
            sys.exit(f"bench: unknown peer {peer!r}; known: {', '.join(SYSTEMS[1:])}")
        why = missing(peer)
        if why:
            print(f"# skipped {peer}: {why}", file=sys.stderr)
        else:
            systems.append(peer)
    scale = 10 if a.quick else 1
    every = {**workloads(scale), **benchcluster.workloads(scale)}
    names = a.workloads or ("" if a.scaling else "W1,W2,W3,W4,W5")
    chosen = [w.strip().upper() for w in names.split(",") if w.strip()] + (["S1", "S2", "S3"] if a.scaling else [])
    for w in chosen:
        if w not in [*every, "S2", "S3"]:
            sys.exit(f"bench: unknown workload {w!r}; known: {', '.join([*every, 'S2', 'S3'])}")
    scaling, memory = bool({"S1", "S2", "S3"} & set(chosen)), "S3" in chosen
    chosen = list(dict.fromkeys("W5" if w == "S2" else w for w in chosen if w != "S3"))  # (S2 is W5's runs)
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    plan = [(s, w, m, spec) for w in chosen for spec in every[w] for s in systems for m in modes
            if (m in MODES[s] or (m == modes[0] and not set(modes) & set(MODES[s])))
            and (s == "roost" or not spec.get("roost_only"))]  # fmt: skip
    only = [w for w in chosen if any(spec.get("roost_only") for spec in every[w])] + (["S3"] if memory else [])
    skipped = benchcluster.peers_skipped(only) if len(systems) > 1 and only else ""
    if skipped and a.json:
        print(skipped, file=sys.stderr)
    rows, mem, notes = [], None, []
    started = time.time()
    with tqdm(total=len(plan) * a.repeat + memory, unit="run", file=sys.stderr, disable=None) as bar:
        for system, w, mode, spec in plan:
            mode = mode if mode in MODES[system] else MODES[system][0]
            runs: list[dict[str, Any]] = []
            bar.set_description(f"{w} {system} {mode}")
            try:
                for _ in range(a.repeat):
                    runs.append(run_once(system, w, mode, spec, a.profile))
                    bar.update()
            except Refused as e:
                notes.append(f"# {w} {spec['label']} {system} {mode}: skipped: {e}")
                print(notes[-1], file=sys.stderr)
                bar.update(a.repeat - len(runs))
                continue
            except (RuntimeError, OSError, subprocess.SubprocessError, ValueError) as e:
                # (one run that fails, a peer's client giving up say, costs its row, not the whole run)
                notes.append(f"# {w} {spec['label']} {system} {mode}: FAILED: {e}")
                print(notes[-1], file=sys.stderr)
                bar.update(a.repeat - len(runs))
                continue
            row = median_row(runs)
            rows.append(row)
            if a.json:
                print(json.dumps(row), flush=True)
        if memory:
            bar.set_description("S3 roost memory")
            mem = benchcluster.memory(scale)
            bar.update()
            if a.json:
                print(json.dumps(mem), flush=True)
    if a.plot:
        if any(r["workload"] != "S1" for r in rows):
            plot([r for r in rows if r["workload"] != "S1"], a.plot)
        if scaling:
            benchcluster.plot_scaling(rows, mem, benchcluster.scaling_path(a.plot))
    if a.profile:
        for name in sorted(os.listdir(a.profile)):
            if name.endswith(".raw"):
                path = os.path.join(a.profile, name)
                with open(path[:-4] + ".md", "w") as f:
                    f.write(f"## {name[:-4]}\n\n{benchprofile.summary(path)}\n")
    if a.json:
        return
    print(f"# roost bench: {os.cpu_count()} cores, python {sys.version.split()[0]}, {len(systems)} system(s), "
          f"median of {a.repeat} run(s), {time.time() - started:.0f} s")  # fmt: skip
    for note in [skipped, *notes]:
        if note:
            print(note)
    if rows:
        print(table(rows))
    for line in ratios(rows):
        print(line)
    if scaling:
        print()
        print(benchcluster.scaling_table(rows, mem))


if __name__ == "__main__":
    main()
