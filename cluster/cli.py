"""The ``roost`` command line.

It lives in ``cluster`` because it reaches every layer (dependencies point
one way: client <- node <- cluster): ``node`` runs a single node or one
cluster member, ``pub``/``sub``/``status`` are client commands, ``cluster``
runs a whole cluster as local processes.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import trio

from roost import __version__
from roost.client.addresses import hostport
from roost.client.cli import add_client_commands, positive
from roost.client.statuscli import add_status_commands
from roost.cluster import admin
from roost.cluster.config import CLUSTER_SETTINGS, ClusterConfig, Member, is_cluster_config, load_cluster_config
from roost.cluster.launcher import DEFAULT_RUN_DIR, READY_TIMEOUT, Launcher, find_run_dir, free_tcp_port, node_command
from roost.cluster.server import ClusterNode
from roost.node import gcpolicy
from roost.node.config import ConfigError, config_doc, load_node_config, parse_hostport, read_toml
from roost.node.procs import free_udp_port
from roost.node.server import CannotBind, NodeServer, run_until_signal, wait_for_signal
from roost.pipeline import audit


class Defaults(argparse.HelpFormatter):
    """Each flag's help ends with its default, unless the help text already says it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or not action.option_strings or action.default is argparse.SUPPRESS:
            return text
        d = action.default
        shown = "none" if d is None or d == [] else "off" if d is False else "%(default)s"
        return f"{text} (default: {shown})"


class Parser(argparse.ArgumentParser):
    """The subcommands inherit the class, and with it the formatter."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", Defaults)
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="roost", description="Roost pub/sub broker")
    parser.add_argument("--version", action="version", version=f"roost {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    n = sub.add_parser("node", help="run a node (or one cluster member) until SIGINT/SIGTERM")
    n.add_argument("--config", default=None, metavar="FILE", help="TOML config (single node or cluster)")
    n.add_argument("--id", default=None, help="which member of a cluster config to run")
    n.add_argument(
        "--bind-host",
        default=None,
        metavar="HOST",
        help="bind the client and peer ports on HOST instead of the configured host",
    )
    n.add_argument(
        "--peer-host",
        action="append",
        default=[],
        metavar="ID=HOST",
        help="dial peer ID at HOST (its configured port); repeatable (containers)",
    )
    n.add_argument(
        "--join",
        default=None,
        metavar="HOST:PORT",
        help="run a member that is not in the config: join the cluster through this member "
        "(its client or peer address); needs --client-addr, --peer-addr, --data-dir",
    )
    n.add_argument("--client-addr", default=None, metavar="HOST:PORT", help="with --join: our UDP address")
    n.add_argument("--peer-addr", default=None, metavar="HOST:PORT", help="with --join: our peer (TCP) address")
    n.add_argument("--data-dir", default=None, metavar="DIR", help="with --join: our data directory")
    n.set_defaults(func=cmd_node)
    add_client_commands(sub)
    add_status_commands(sub)
    c = sub.add_parser("cluster", help="run a cluster's members as local processes")
    csub = c.add_subparsers(dest="action", required=True)
    up = csub.add_parser("up", help="start every member")
    up.add_argument("config", help="the cluster's TOML config")
    up.add_argument("--detach", action="store_true", help="return once all serve; pid files and logs in --run-dir")
    down = csub.add_parser("down", help="stop the members started with --detach")
    kill = csub.add_parser("kill", help="SIGKILL one member (crash drill)")
    kill.add_argument("id", help="the member's id")
    start = csub.add_parser("start", help="start one member again")
    start.add_argument("id", help="the member's id")
    join = csub.add_parser("join", help="start a new member that joins the running cluster")
    join.add_argument("--config", required=True, metavar="FILE", help="the cluster's config (its base members)")
    join.add_argument("--id", required=True, help="the new member's id")
    join.add_argument("--seed", required=True, metavar="HOST:PORT", help="a running member (client or peer address)")
    join.add_argument(
        "--client-addr",
        default=None,
        metavar="HOST:PORT",
        help="the new member's UDP address (default: the seed's host, a free port)",
    )
    join.add_argument(
        "--peer-addr",
        default=None,
        metavar="HOST:PORT",
        help="its peer (TCP) address (default: the seed's host, a free port)",
    )
    join.add_argument(
        "--data-dir",
        default=None,
        metavar="DIR",
        help="its data directory (default: beside the first member's, named by its id)",
    )
    leave = csub.add_parser("leave", help="a member hands its partitions off and stops")
    leave.add_argument("id", help="the member's id")
    leave.add_argument(
        "--config", default=None, metavar="FILE", help="the cluster's config (default: the one `cluster up` used)"
    )
    up.add_argument("--run-dir", default=DEFAULT_RUN_DIR, metavar="DIR", help="where the members' pid files and "
                    "logs go")  # fmt: skip
    join.add_argument("--run-dir", default=None, metavar="DIR", help="where its pid file and log go (default: the "
                      "run directory of the cluster that runs, so that down stops it too)")  # fmt: skip
    for p in (up, start, join):
        p.add_argument("--ready-timeout", type=positive, default=READY_TIMEOUT, metavar="S",
                       help=f"how long a member may take to sync and answer before it counts as failed "
                            f"(default {READY_TIMEOUT:g})")  # fmt: skip
    for p in (down, kill, start, leave):
        p.add_argument(
            "--run-dir",
            default=None,
            metavar="DIR",
            help="the cluster's run directory (default: the one `cluster up` used, found by the member)",
        )
    c.set_defaults(func=cmd_cluster)
    b = sub.add_parser(
        "bench",
        help="the side-by-side benchmark: runs scripts/bench.py of a source checkout "
        "with the arguments that follow (roost bench --help for its options)",
        add_help=False,
    )
    b.add_argument("args", nargs=argparse.REMAINDER, help="passed to scripts/bench.py")
    b.set_defaults(func=lambda a: bench(a.args))  # (main passes "bench ..." on before parsing)
    au = sub.add_parser(
        "audit", help="audit run event logs with Spark (report, summary, plots)", description=audit.DESCRIPTION
    )
    audit.add_arguments(au)
    au.set_defaults(func=audit.run)
    d = sub.add_parser("config-doc", help="print the table of every setting (markdown)")
    d.set_defaults(func=lambda a: print(config_doc() + config_doc(CLUSTER_SETTINGS), end="") or 0)
    return parser


def cmd_node(args: argparse.Namespace) -> int:
    gcpolicy.freeze_survivors()  # (a node process's: not the tests' that run a node in theirs)
    try:
        data = read_toml(args.config) if args.config else {}
        if args.config and is_cluster_config(data):
            return _run_member(args, data)
        if args.id or args.peer_host:
            raise ConfigError("--id and --peer-host need a cluster config ([cluster] and [[members]])")
        cfg = load_node_config(args.config, data) if args.config else load_node_config(None)
        if args.bind_host:
            cfg.client_addr = (args.bind_host, cfg.client_addr[1])
            if cfg.monitor_addr:
                cfg.monitor_addr = hostport(args.bind_host, parse_hostport(cfg.monitor_addr)[1])
    except ConfigError as exc:
        print(f"roost node: {exc}", file=sys.stderr)
        return 2
    try:
        trio.run(run_until_signal, lambda: NodeServer(cfg))
    except CannotBind as exc:
        print(f"roost node: {cfg.id}: {exc}", file=sys.stderr)
        return 1
    return 0


def _run_member(args: argparse.Namespace, data: dict[str, object]) -> int:
    cc = load_cluster_config(args.config, data)
    if not args.id:
        raise ConfigError(f"{args.config}: a cluster config needs --id (one of "
                          f"{', '.join(m.id for m in cc.members)})")  # fmt: skip
    roster: list[object] = []
    if args.join:
        roster = _join_as(cc, args)
    cc.member(args.id)
    hosts = {}
    for item in args.peer_host:
        pid, sep, host = item.partition("=")
        if not sep or not host:
            raise ConfigError(f"--peer-host {item!r}: expected ID=HOST")
        cc.member(pid)
        hosts[pid] = host
    node = ClusterNode(cc, args.id, bind_host=args.bind_host, peer_hosts=hosts, roster=roster)
    try:
        trio.run(_run_cluster_node, node)
    except CannotBind as exc:  # the peer (TCP) port or the monitoring port
        print(f"roost node: {args.id}: {exc}", file=sys.stderr)
        return 1
    if node.bind_error is not None:
        host, port = node.cfg.client_addr
        print(f"roost node: {args.id}: cannot bind {host}:{port} (client port): {node.bind_error.strerror}",
              file=sys.stderr)  # fmt: skip
        return 1
    if node.fatal:
        print(f"roost node: {args.id}: {node.fatal}", file=sys.stderr)
        return 2
    return 0


def _join_as(cc: ClusterConfig, args: argparse.Namespace) -> list[object]:
    """``roost node --join``: ask the seed to make us a member (again: a restart asks the same),
    and run with ourselves added to the config; the roster it answers with is our start."""
    if not (args.client_addr and args.peer_addr and args.data_dir):
        raise ConfigError("--join needs --client-addr, --peer-addr and --data-dir")
    if any(m.id == args.id for m in cc.members):
        raise ConfigError(f"{args.config}: {args.id} is in [[members]]: it needs no --join")
    try:
        client, peer = parse_hostport(args.client_addr), parse_hostport(args.peer_addr)
    except ValueError as exc:
        raise ConfigError(f"--client-addr/--peer-addr: {exc}") from None
    seed = admin.resolve_peer(cc, args.join)
    message, entries = admin.request(cc, seed, admin.join_request(args.id, client, peer))
    print(f"roost node: {args.id}: {message}", file=sys.stderr)
    cc.members = sorted([*cc.members, Member(args.id, client, peer, args.data_dir)], key=lambda m: m.id)
    return entries


def cmd_join(args: argparse.Namespace, launcher: Launcher) -> int:
    """Join a new member: the seed records it, then its process starts and pulls what it owns."""
    cc = load_cluster_config(args.config)
    seed = admin.resolve_peer(cc, args.seed)
    host = seed[0]
    client = parse_hostport(args.client_addr) if args.client_addr else (host, free_udp_port(host))
    peer = parse_hostport(args.peer_addr) if args.peer_addr else (host, free_tcp_port(host))
    data_dir = args.data_dir or str(Path(cc.members[0].data_dir).parent / args.id)
    message, entries = admin.request(cc, seed, admin.join_request(args.id, client, peer))
    after = admin.roster_from(cc, entries).members()
    print(message)
    print(admin.moved_report(cc, [m for m in after if m != args.id], list(after)))
    command = [*node_command(args.config, args.id), "--join", f"{seed[0]}:{seed[1]}",
               "--client-addr", f"{client[0]}:{client[1]}", "--peer-addr", f"{peer[0]}:{peer[1]}",
               "--data-dir", data_dir]  # fmt: skip
    proc = launcher.start_command(args.id, command, client)
    print(f"{args.id} ready: clients udp://{client[0]}:{client[1]}, peer {peer[0]}:{peer[1]}, pid {proc.pid}, "
          f"log {launcher.logfile(args.id)}")  # fmt: skip
    return 0


def cmd_leave(args: argparse.Namespace, launcher: Launcher) -> int:
    """A member leaves: the others pull what they gain, the map moves, it delivers what it holds
    and stops."""
    config = args.config or launcher.config_path()
    cc = load_cluster_config(config)
    message, members, taken_by = admin.leave(cc, args.id)
    print(f"{message} (asked {taken_by})")
    print(admin.moved_report(cc, members, [m for m in members if m != args.id]))
    pid = launcher.pid_of(args.id)
    if pid is not None:
        if launcher.wait_gone(pid, cc.settings.leave_timeout + cc.settings.stop_timeout + 5):
            launcher.forget(args.id)
            print(f"{args.id} has left and stopped (pid {pid})")
        else:
            print(f"roost cluster: {args.id} (pid {pid}) has not stopped yet; see its log", file=sys.stderr)
            return 1
    return 0


async def _run_cluster_node(node: ClusterNode) -> None:
    """Run until a signal (then stop cleanly) or until the member exits by
    itself, for example when it cannot bind: then nothing waits for a signal."""

    async def stop_on_signal() -> None:
        await wait_for_signal(node.log)
        await node.stop()

    error: CannotBind | None = None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(stop_on_signal)
        try:
            await node.run()
        except CannotBind as exc:  # (raised here, not inside the nursery's group: one plain error)
            error = exc
        nursery.cancel_scope.cancel()
    if error is not None:
        raise error


def cmd_cluster(args: argparse.Namespace) -> int:
    try:
        if args.run_dir is None:
            if args.action == "join":  # (the running cluster started from this config)
                args.run_dir = find_run_dir(None, running=True, config=args.config)
            else:
                args.run_dir = find_run_dir(args.id if args.action != "down" else None,
                                            running=args.action in ("kill", "down", "leave"))  # fmt: skip
        launcher = Launcher(args.run_dir, getattr(args, "ready_timeout", READY_TIMEOUT))
        if args.action == "join":
            return cmd_join(args, launcher)
        if args.action == "leave":
            return cmd_leave(args, launcher)
        if args.action == "up":
            return launcher.up(args.config, args.detach)
        if args.action == "down":
            return launcher.down()
        if args.action == "kill":
            return launcher.kill(args.id)
        config = launcher.config_path()
        proc = launcher.start(load_cluster_config(config), config, args.id)
        print(f"started {args.id} (pid {proc.pid})")
        return 0
    except ConfigError as exc:
        print(f"roost cluster: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # (up has stopped what it started, and said so)
        return 130
    except (RuntimeError, ValueError) as exc:  # (AdminError is a RuntimeError)
        print(f"roost cluster: {exc}", file=sys.stderr)
        return 1


def bench(rest: list[str]) -> int:
    """Run scripts/bench.py of the checkout this package runs from: the bench drives peers'
    servers and many processes, and lives with the repository, not in the installed package."""
    root = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    script = os.path.join(root, "scripts", "bench.py")
    if not os.path.exists(script):
        print(f"roost bench: no scripts/bench.py beside this package ({root}); it runs from a source checkout: "
              "git clone the repository and run make bench there", file=sys.stderr)  # fmt: skip
        return 2
    rest = rest[1:] if rest[:1] == ["--"] else rest
    return subprocess.call([sys.executable, script, *rest])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:  # (everything after it is the script's, options too)
        return bench(argv[1:])
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
