"""Chaos runs on real processes: a cluster, a workload, a seeded nemesis, an event log.

    python scripts/chaos.py --duration 120 --faults kill,pause,partition,loss --seed 1 --out run/chaos1
    python scripts/check.py run/chaos1
    python scripts/chaos.py --netns --duration 120 --faults kill,pause,partition,loss --out run/chaos2
    python scripts/chaos.py --netns --mode partitioned --duration 120 --faults kill,pause,partition,loss --out run/c3

Jepsen's shape: real `roost node` processes (on loopback ports, or one per
network namespace with --netns, clients in a namespace of their own),
publisher and subscriber processes (scripts/chaos_worker.py: reliable and
fire, whole-topic and keyed subscriptions) that log everything they do and
see, and a nemesis that injects faults from a seeded schedule and logs them:

* kill: SIGKILL a member, start it again 2-5 s later (it PULLs its state);
* pause: SIGSTOP a member, SIGCONT 1-4 s later;
* partition: cut one member off from everyone (nft drop rules on its ports,
  or inside its namespace) for 2-5 s;
* loss / dup: drop / duplicate a share (--loss, --dup percent) of the
  cluster's packets for 3-8 s;
* delay: hold packets --delay ms (needs NFQUEUE, see scripts/faults.py);
* join (partitioned mode, once): a 4th member ``j1`` joins a third of the way in
  (``roost node --join`` through a member no fault holds), on an address of its own
  (member faults are drawn from the config's members, so they hit the voters, not it);
* leave (partitioned mode, once): a member no fault holds and that is not a voter of the
  durable metadata quorum (``[durable] quorum``: a voter cannot leave, the request is refused)
  leaves at 60 % of the run (``roost cluster leave``'s request); it delivers what it holds and
  exits by itself. With the generated config the three members are the voters, so the leaver is
  the joiner; with no non-voter to take, the leave is skipped and the run says so (its progress
  output and run.json's ``leave``). Kills, pauses and partitions still hit voters.

In partitioned mode a durable workload runs too (--durable, on by default there; --no-durable
leaves it out): publishers that put, durable subscribers that get and commit and now and then
crash between the two and are started again (scripts/chaos_durable.py).

At most one member is down (killed, paused or cut off) at a time, so a
majority stays up. After --duration everything is healed, the publishers
flush, the subscribers get --settle seconds, each member's status (with a
digest of its subscriptions) is recorded, and everything is stopped. The run
directory holds run.json, events/*.jsonl (docs/eventlog.md) and the members'
logs; scripts/check.py judges it. Every rule lives in one nft table that is
deleted on exit; processes, rules and namespaces are cleaned up even on
Ctrl-C. A progress line shows what is going on. One run at a time per
machine: runs share the loopback addresses, the namespaces and the table.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from roost.cluster import admin  # noqa: E402
from roost.cluster.config import ClusterConfig, load_cluster_config  # noqa: E402
from roost.cluster.launcher import free_tcp_port, node_command, write_local_config  # noqa: E402
from roost.cluster.secretfile import ensure_secret_file, secret_path, shown  # noqa: E402
from roost.node.config import read_toml  # noqa: E402
from roost.node.procs import free_udp_port  # noqa: E402
from scripts import chaos_durable  # noqa: E402

FAULTS = ("kill", "pause", "partition", "loss", "dup", "delay", "join", "leave")
MEMBER_FAULTS = ("kill", "pause", "partition")  # one member down at a time
MEMBERSHIP = ("join", "leave")  # once each per run, at fixed points, apart from the drawn faults
# Without --netns each member has a loopback address of its own (and dials its peers from
# it), so a fault can single a member out by address; the workers use 127.0.0.1.
LOOPBACK_HOSTS = ("127.0.0.11", "127.0.0.12", "127.0.0.13")
JOINER, JOINER_HOST = "j1", "127.0.0.14"
CLIENT_HOST = 4  # with --netns: members in namespaces 1..3, the workers in the 4th
NETNS_CONFIG = ROOT / "configs" / "netns3.toml"  # (with --netns: its members, in the mode of --mode)


class Run:
    """Everything a run started, so that one ``cleanup`` undoes it."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Path(args.out)
        self.rng = random.Random(args.seed)
        self.members: dict[str, subprocess.Popen[bytes]] = {}
        self.workers: dict[str, subprocess.Popen[bytes]] = {}
        self.paused: set[str] = set()
        self.held: set[str] = set()  # members a member fault holds now (killed, paused, cut off)
        self.joined: dict[str, tuple[tuple[str, int], tuple[str, int]]] = {}  # id -> (client, peer) address
        self.left: set[str] = set()
        self.join_seed = ""  # the peer address the joiner asked (a restart asks it again)
        self.table: Any = None  # scripts/faults.FaultTable, once a network fault is wanted
        self.netns: list[str] = []
        self.events = 0
        self.nemesis = open(self.out / "events" / "nemesis.jsonl", "a", encoding="utf-8")  # noqa: SIM115
        self.cc: ClusterConfig
        self.config = ""
        self.info: dict[str, Any] = {}
        self.durable: chaos_durable.DurableWorkers | None = None
        self.log_from: dict[str, int] = {}  # member -> size of its log when it was last started

    # ------------------------------------------------------------ logging

    def fault(self, fault: str, target: str, phase: str, **params: Any) -> None:
        ev = {"t": time.time(), "proc": "nemesis", "ev": "fault", "fault": fault, "target": target, "phase": phase}
        if params:
            ev["params"] = params
        self.nemesis.write(json.dumps(ev) + "\n")
        self.nemesis.flush()

    # ------------------------------------------------------------ processes

    def ns_of(self, mid: str) -> str | None:
        return self.netns[self.cc.index_of(mid)] if self.netns else None

    @property
    def client_ns(self) -> str | None:
        return self.netns[CLIENT_HOST - 1] if self.netns else None

    def prefix(self, ns: str | None) -> list[str]:
        return ["ip", "netns", "exec", ns] if ns else []

    def start_member(self, mid: str) -> None:
        log = open(self.out / "logs" / f"{mid}.log", "ab")  # noqa: SIM115 (the child holds it)
        self.log_from[mid] = log.tell()  # (wait_serving reads this life's lines only)
        cmd = node_command(self.config, mid)
        if mid in self.joined:  # (the same command restarts it: the JOIN is idempotent)
            (ch, cp), (ph, pp) = self.joined[mid]
            cmd += ["--join", self.join_seed, "--client-addr", f"{ch}:{cp}", "--peer-addr", f"{ph}:{pp}",
                    "--data-dir", str(self.out / "data" / mid)]  # fmt: skip
        self.members[mid] = subprocess.Popen(
            [*self.prefix(self.ns_of(mid)), *cmd], cwd=ROOT, stdout=log, stderr=log,
        )  # fmt: skip
        log.close()

    def ever(self) -> list[str]:
        """Every member of the run: the config's and those that joined."""
        return [*(m.id for m in self.cc.members), *self.joined]

    def current(self) -> list[str]:
        """Members now: those of the run less those that left."""
        return [m for m in self.ever() if m not in self.left]

    def steady(self) -> list[str]:
        """Current members that no member fault holds: they take admin requests."""
        return [m for m in self.current() if m not in self.held]

    def wait_serving(self, mid: str, timeout: float = 30.0) -> None:
        """A member serves once its log says so (its UDP port may be in another namespace)."""
        path = self.out / "logs" / f"{mid}.log"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if served(path, self.log_from.get(mid, 0)):
                return
            if self.members[mid].poll() is not None:
                raise RuntimeError(f"member {mid} exited ({self.members[mid].returncode}); see {path}")
            time.sleep(0.05)
        raise RuntimeError(f"member {mid} not serving after {timeout} s; see {path}")

    def start_worker(self, name: str, argv: list[str]) -> None:
        """``argv``: the role and its options; name, members and event file are added."""
        err = open(self.out / "logs" / f"{name}.err", "ab")  # noqa: SIM115
        members = ",".join(f"{m.id}={m.client_addr[0]}:{m.client_addr[1]}" for m in self.cc.members)
        cmd = [sys.executable, str(ROOT / "scripts" / "chaos_worker.py"), *argv, "--name", name,
               "--members", members, "--out", str(self.out / "events" / f"{name}.jsonl")]  # fmt: skip
        self.workers[name] = subprocess.Popen([*self.prefix(self.client_ns), *cmd],
                                              cwd=ROOT, stdout=err, stderr=err)  # fmt: skip
        err.close()

    def signal_member(self, mid: str, sig: int) -> None:
        p = self.members.get(mid)
        if p is not None and p.poll() is None:
            os.kill(p.pid, sig)

    def cleanup(self) -> None:
        """Stop every process, delete every rule and namespace of this run. Signals
        wait until it is done (a second Ctrl-C must not leave hosts behind), and
        each step runs even if the one before failed."""
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            try:
                self._stop_processes()
            finally:
                try:
                    if self.table is not None:
                        self.table.__exit__(None, None, None)  # (clears the table, drops its handlers)
                        self.table = None
                finally:
                    if self.netns:
                        from scripts import netns

                        netns.down()
                        self.netns = []
                    self.nemesis.close()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    def _stop_processes(self) -> None:
        for mid in list(self.paused):
            self.signal_member(mid, signal.SIGCONT)
        procs = [*self.workers.values(), *self.members.values()]
        for p in procs:
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + 10
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    # ------------------------------------------------------------ faults

    def host_of(self, mid: str) -> str:
        if mid in self.joined:
            return self.joined[mid][1][0]
        host = self.cc.member(mid).peer_addr[0]
        if host == "127.0.0.1" or self.cc.member(mid).client_addr[0] != host:
            raise RuntimeError(f"{mid}: network faults on loopback need one address per member "
                               f"(as the generated config has), not {host}")  # fmt: skip
        return host

    def all_hosts(self) -> list[str]:
        return [self.host_of(m) for m in self.ever()]

    def faults(self) -> Any:
        if self.table is None:
            from scripts.faults import FaultTable

            self.table = FaultTable(netns=self.netns or None)
            self.table.__enter__()
        return self.table


def served(path: Path, since: int) -> bool:
    """Whether a member's log says it serves, in what it wrote from byte ``since`` on (where this
    life of the process began: a restarted member's previous life said so too, and under load a
    new Python process takes seconds before it writes its first line)."""
    with open(path, "rb") as f:
        f.seek(since)
        return b"event=serving" in f.read()


def build_config(args: argparse.Namespace, out: Path) -> str:
    """The cluster config of the run: --config as given (its secret file made if it names one that
    does not exist, as `roost cluster up` does); with --netns and no --config, configs/netns3.toml
    in the mode of --mode (netns_config); else 3 members on free loopback ports."""
    if args.netns and not args.config:
        return netns_config(args.mode, out)
    if args.config:
        config = Path(args.config).resolve()
        created = ensure_secret_file(config)
        if created is not None:
            print(f"created the cluster secret {shown(created)} (mode 0600)", file=sys.stderr)
        return str(config)
    path = out / "cluster.toml"
    write_local_config(path, 3, "chaos-secret-" + os.urandom(8).hex(), node_extra='[node]\nlog_level = "info"\n',
                       cluster_extra=f'mode = "{args.mode}"\n', hosts=list(LOOPBACK_HOSTS))  # fmt: skip
    return str(path)


def netns_config(mode: str, out: Path) -> str:
    """configs/netns3.toml (one member per namespace) with ``[cluster] mode`` set to ``mode``,
    written to the run directory: the file says replicated, and a durable workload needs a
    partitioned cluster. Its secret file stays the one it names (made if missing), now by its
    absolute path; everything else is the file's."""
    base = NETNS_CONFIG
    created = ensure_secret_file(base)
    if created is not None:
        print(f"created the cluster secret {shown(created)} (mode 0600)", file=sys.stderr)
    text, subs = re.subn(r'(?m)^mode = "[a-z]+"', f'mode = "{mode}"', base.read_text(), count=1)
    table = read_toml(base)["cluster"]
    if subs != 1 or not isinstance(table, dict) or not isinstance(table.get("secret_file"), str):
        raise RuntimeError(f"{base}: expected one [cluster] mode line and a secret_file to rewrite")
    secret = secret_path(base, table["secret_file"]).resolve()
    text, subs = re.subn(r"(?m)^secret_file = .*$", f"secret_file = {json.dumps(str(secret))}", text, count=1)
    if subs != 1:
        raise RuntimeError(f"{base}: expected one secret_file line to rewrite")
    path = out / "cluster.toml"
    path.write_text(f"# scripts/chaos.py --netns: {base.name} in mode {mode!r}\n{text}")
    return str(path.resolve())


Plan = list[tuple[float, float, str, str]]  # (start, end, fault, target), seconds from the start


def schedule(rng: random.Random, kinds: list[str], members: list[str], duration: float) -> Plan:
    """(start, end, fault, target): member faults one at a time with gaps; network faults between;
    a join and a leave (if asked for) at fixed points, the leaver chosen when it is due."""
    plan: Plan = [(duration * f, duration * f, k, JOINER if k == "join" else "?")
                  for k, f in (("join", 0.3), ("leave", 0.6)) if k in kinds]  # fmt: skip
    kinds = [k for k in kinds if k not in MEMBERSHIP]
    t = 3.0
    while t < duration - 6.0 and kinds:
        kind = rng.choice(kinds)
        if kind in MEMBER_FAULTS:
            length = {"kill": rng.uniform(2, 5), "pause": rng.uniform(1, 4), "partition": rng.uniform(2, 5)}[kind]
            target = rng.choice(members)
        else:
            length, target = rng.uniform(3, 8), "all"
        end = min(t + length, duration - 3.0)
        plan.append((t, end, kind, target))
        t = end + rng.uniform(2.0, 5.0)
    return plan


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", help="cluster config (default: 3 members on free loopback ports)")
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of workload and faults (default 60)")
    ap.add_argument("--faults", default="kill,pause,partition,loss",
                    help=f"comma-separated, from {','.join(FAULTS)} ('' for none)")  # fmt: skip
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", required=True, help="run directory (created; must not hold a previous run)")
    ap.add_argument("--netns", action="store_true", help="one network namespace per member (scripts/netns.py)")
    ap.add_argument("--loss", type=float, default=10.0, help="percent of packets a loss fault drops (default 10)")
    ap.add_argument("--dup", type=float, default=5.0, help="percent a dup fault duplicates (default 5)")
    ap.add_argument("--delay", type=float, default=50.0, help="milliseconds a delay fault holds packets")
    ap.add_argument("--rate", type=float, default=100.0, help="publishes per second per publisher (default 100)")
    ap.add_argument(
        "--mode",
        choices=("replicated", "partitioned"),
        default="replicated",
        help="cluster mode of the default config, or of configs/netns3.toml with --netns (default replicated)",
    )
    ap.add_argument("--settle", type=float, default=8.0, help="seconds after the last heal before the end")
    chaos_durable.add_arguments(ap)
    args = ap.parse_args()
    kinds = [f for f in args.faults.split(",") if f]
    bad = [f for f in kinds if f not in FAULTS]
    if bad:
        ap.error(f"unknown fault {bad[0]!r}; known: {', '.join(FAULTS)}")
    if args.duration < 10 or args.duration > 3600:
        ap.error("--duration must be from 10 to 3600 seconds")
    if not 0 < args.loss <= 50 or not 0 < args.dup <= 50:
        ap.error("--loss and --dup must be percentages from 0 to 50")
    if any(k in MEMBERSHIP for k in kinds) and (args.mode != "partitioned" or args.config or args.netns):
        ap.error("join and leave need --mode partitioned with the generated config (not --config or --netns)")
    out = Path(args.out)
    if (out / "run.json").exists():
        ap.error(f"{out} holds a previous run: choose another --out")
    for d in ("events", "logs"):
        (out / d).mkdir(parents=True, exist_ok=True)
    run = Run(args)
    interrupted = False

    def stop(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    old_term = signal.signal(signal.SIGTERM, stop)
    try:
        return drive(run, kinds)
    except KeyboardInterrupt:
        interrupted = True
        print("\ninterrupted: cleaning up", file=sys.stderr)
        return 130
    except RuntimeError as exc:
        print(f"\nchaos: {exc}", file=sys.stderr)
        return 1
    finally:
        run.cleanup()
        signal.signal(signal.SIGTERM, old_term)
        if not interrupted:
            print(f"run directory: {out}")


def drive(run: Run, kinds: list[str]) -> int:
    args = run.args
    ids = start_cluster(run, kinds)
    subs = [("sub-0", "chaos.a:reliable,chaos.b/k1:reliable"), ("sub-1", "chaos.b:reliable,chaos.a:fire"),
            ("sub-2", "chaos.a/k2:reliable,chaos.b:fire")]  # fmt: skip
    for i, (name, spec) in enumerate(subs):
        run.start_worker(name, ["sub", "--seed", str(args.seed * 100 + i), "--subs", spec])
    if run.durable is not None:
        run.durable.start_subscribers(time.time() + 2.0 + args.duration)
    time.sleep(2.0)  # (the subscribers confirm; messages before that are not expected anyway)
    for i, mode in enumerate(("reliable", "reliable", "fire")):
        run.start_worker(f"pub-{i}", ["pub", "--seed", str(args.seed * 100 + 50 + i), "--mode", mode,
                                      "--rate", str(args.rate), "--duration", str(args.duration)])  # fmt: skip
    if run.durable is not None:
        run.durable.start_publishers()
    run_plan(run, schedule(run.rng, kinds, ids, args.duration), args.duration)
    finish(run, ids)
    return 0


def start_cluster(run: Run, kinds: list[str]) -> list[str]:
    """Hosts, config, run.json, the members (serving); returns the member ids."""
    args, out = run.args, run.out
    if args.netns:
        from scripts import netns

        netns.ensure_tools()
        run.netns = netns.up(CLIENT_HOST)
    run.config = build_config(args, out)
    if args.netns:
        shutil.rmtree(ROOT / "run" / "netns", ignore_errors=True)  # (the members' data dirs: a fresh cluster)
    run.cc = cc = load_cluster_config(run.config)
    ids = [m.id for m in cc.members]
    try:
        durable = chaos_durable.wanted(args, cc.settings.mode)
    except ValueError as exc:
        raise RuntimeError(str(exc)) from None
    run.info = {"version": 1, "seed": args.seed, "config": run.config, "config_text": Path(run.config).read_text(),
                "duration": args.duration, "faults": kinds, "netns": bool(args.netns), "started": time.time(),
                "loss": args.loss, "dup": args.dup, "delay": args.delay, "rate": args.rate, "settle": args.settle,
                "members": {m.id: {"client": "{}:{}".format(*m.client_addr), "peer": "{}:{}".format(*m.peer_addr)}
                            for m in cc.members}}  # fmt: skip
    if durable:
        run.durable = chaos_durable.DurableWorkers(run)
    (out / "run.json").write_text(json.dumps(run.info, indent=2))
    for mid in ids:
        run.start_member(mid)
    for mid in ids:
        run.wait_serving(mid)
    return ids


def run_plan(run: Run, plan: Plan, duration: float) -> None:
    """Inject and heal the planned faults until ``duration``, with a progress line."""
    ev = run.out / "events"
    t0 = time.monotonic()
    active: list[tuple[float, str, str, Any]] = []  # (end, fault, target, handle)
    done = 0
    plan = sorted(plan)
    tty, next_line = sys.stderr.isatty(), 0.0
    while True:
        now = time.monotonic() - t0
        while plan and plan[0][0] <= now:
            _, end, kind, target = plan.pop(0)
            active.append((end, kind, *inject(run, kind, target)))
        for item in [a for a in active if a[0] <= now]:
            active.remove(item)
            heal(run, item[1], item[2], item[3])
            done += 1
        if run.durable is not None:
            run.durable.watch()
        if now >= duration and not active:
            break
        if tty or now >= next_line:  # (a line every 5 s into a log file, one line redrawn on a terminal)
            next_line = now + 5.0
            size = sum(f.stat().st_size for f in ev.glob("*.jsonl"))
            doing = ", ".join(f"{k} {t}" for _, k, t, _ in active) or "no fault"
            line = f"[{now:5.0f}/{duration:.0f} s] {doing:<28} faults done {done:3d}  events ~{size // 110:,}"
            print("\r" + line if tty else line, end="" if tty else "\n", file=sys.stderr, flush=True)
        time.sleep(0.2)
    if tty:
        print(file=sys.stderr)


def finish(run: Run, ids: list[str]) -> None:
    """Everything is healed: publishers flush, subscribers settle, members report."""
    for name, p in run.workers.items():
        if name.startswith(("pub-", "dpub-")):
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.terminate()
    if run.durable is not None:
        run.durable.settle(run.args.settle)  # (a subscriber that crashed just before is started again)
    else:
        time.sleep(run.args.settle)
    for name, p in run.workers.items():
        if name.startswith(("sub-", "dsub-")) and p.poll() is None:
            p.terminate()
    for p in run.workers.values():
        p.wait(15)
    record_status(run, run.current())
    run.info["ended"] = time.time()
    # A worker that died is not the broker's fault: the run says so and fails, and the
    # checker would otherwise blame the broker for everything the worker missed since.
    run.info["workers_failed"] = failed = {n: p.returncode for n, p in run.workers.items() if p.returncode}
    (run.out / "run.json").write_text(json.dumps(run.info, indent=2))
    if failed:
        raise RuntimeError(f"worker(s) exited with an error: {failed}; see {run.out / 'logs'}/*.err")


def inject(run: Run, kind: str, target: str) -> tuple[str, Any]:
    """Start a fault; (its target, the handle heal needs). A member fault planned for a member
    that left falls on another; a leave picks its member now."""
    if kind in MEMBER_FAULTS and target in run.left:
        target = run.rng.choice(run.steady())
    if kind == "join":
        join(run, target)
        return target, None
    if kind == "leave":
        return leave(run), None
    if kind in MEMBER_FAULTS:
        run.held.add(target)
    return target, _inject(run, kind, target)


def _inject(run: Run, kind: str, target: str) -> Any:
    args = run.args
    params = {"loss": {"percent": args.loss}, "dup": {"percent": args.dup}, "delay": {"ms": args.delay},
              "kill": {"signal": "SIGKILL"}, "pause": {"signal": "SIGSTOP"}}.get(kind, {})  # fmt: skip
    run.fault(kind, target, "start", **params)
    if kind == "kill":
        run.signal_member(target, signal.SIGKILL)
        run.members[target].wait(10)
        return None
    if kind == "pause":
        run.signal_member(target, signal.SIGSTOP)
        run.paused.add(target)
        return None
    ft = run.faults()
    if kind == "partition":  # (a member's own namespace, or its own address on loopback)
        return ft.isolate(ns=run.ns_of(target)) if run.netns else ft.isolate(addrs=[run.host_of(target)])
    where: dict[str, Any] = {"ns": run.netns[: CLIENT_HOST - 1]} if run.netns else {"addrs": run.all_hosts()}
    if kind == "loss":
        return ft.loss(args.loss, **where)
    if kind == "dup":
        return ft.dup(args.dup, **where)
    return ft.delay(args.delay, args.delay / 2, **where)


def heal(run: Run, kind: str, target: str, handle: Any) -> None:
    if kind in MEMBERSHIP:
        return
    run.held.discard(target)
    if kind == "kill":
        run.start_member(target)
        run.wait_serving(target)  # (a member that cannot come back must not go unnoticed)
        run.fault("restart", target, "start")
        run.fault("restart", target, "end")  # (an instant: the process is started again)
    elif kind == "pause":
        run.signal_member(target, signal.SIGCONT)
        run.paused.discard(target)
    elif handle is not None:
        run.table.heal(handle)
    run.fault(kind, target, "end")


def join(run: Run, jid: str) -> None:
    """A new member joins through a member no fault holds (``roost node --join``, as
    ``roost cluster join`` starts it), on an address of its own."""
    seed = run.cc.member(run.rng.choice([m for m in run.steady() if m not in run.joined]))
    run.join_seed = "{}:{}".format(*seed.peer_addr)
    run.joined[jid] = ((JOINER_HOST, free_udp_port(JOINER_HOST)), (JOINER_HOST, free_tcp_port(JOINER_HOST)))
    client, peer = run.joined[jid]
    run.fault("join", jid, "start", seed=seed.id, client=f"{client[0]}:{client[1]}", peer=f"{peer[0]}:{peer[1]}")
    run.info["members"][jid] = {"client": f"{client[0]}:{client[1]}", "peer": f"{peer[0]}:{peer[1]}"}
    run.start_member(jid)
    run.wait_serving(jid)
    run.fault("join", jid, "end")


def non_voters(run: Run) -> list[str]:
    """Current members no fault holds that are not voters of the durable metadata quorum: the
    only ones that may leave (the cluster refuses a voter's leave, cluster/joining.py)."""
    voters = set(run.cc.settings.quorum)
    return [m for m in run.steady() if m not in voters]


def leave(run: Run) -> str:
    """A non-voter no fault holds leaves (``roost cluster leave``'s request); it exits by itself.
    With none to take, the leave is skipped (said on stderr and in run.json), not a failure:
    returns "-" then."""
    choices = non_voters(run)
    if not choices:
        why = (f"no member outside the quorum's voters {list(run.cc.settings.quorum)} that no fault holds "
               f"(current: {', '.join(run.current())}; held: {', '.join(sorted(run.held)) or 'none'})")  # fmt: skip
        run.info["leave"] = {"skipped": why}
        print(f"\nchaos: leave skipped: {why}", file=sys.stderr, flush=True)
        return "-"
    mid = run.rng.choice(choices)
    run.info["leave"] = {"member": mid}
    run.fault("leave", mid, "start")
    message, _, taken_by = admin.leave(run.cc, mid)
    run.left.add(mid)
    run.info["left"] = sorted(run.left)
    deadline = time.monotonic() + run.cc.settings.leave_timeout + 15
    while run.members[mid].poll() is None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{mid} did not exit after its leave ({message}, asked {taken_by})")
        time.sleep(0.1)
    run.fault("leave", mid, "end", asked=taken_by)
    return mid


def record_status(run: Run, ids: list[str]) -> None:
    """Each member's view (with its subscriptions' digest), through `roost status --json`."""
    with open(run.out / "events" / "status.jsonl", "a", encoding="utf-8") as f:
        for mid in ids:
            client = run.joined[mid][0] if mid in run.joined else run.cc.member(mid).client_addr
            cmd = [sys.executable, "-m", "roost", "status", "--json", "--node", "{}:{}".format(*client)]
            r = subprocess.run([*run.prefix(run.client_ns), *cmd], cwd=ROOT,
                               capture_output=True, text=True, timeout=30)  # fmt: skip
            try:
                st = json.loads(r.stdout)
            except json.JSONDecodeError:
                st = {"state": "unreachable", "digest": None, "subscriptions": None, "error": r.stderr[-300:]}
            digest = st.get("digest")
            if "partition_digests" in st:  # (partitioned: owners of each partition must agree; pipeline/rules.py)
                parts = st["partition_digests"]
                digest = "p:" + ";".join(f"{p}={parts[p]:x}" for p in sorted(parts, key=int))
            f.write(json.dumps({"t": time.time(), "proc": "status", "ev": "status", "member": mid,
                                "digest": digest, "subscriptions": st.get("subscriptions"),
                                "state": st.get("state")}) + "\n")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
