"""The ``roost`` command line.

It lives in ``cluster`` because it reaches every layer (dependencies point
one way: client <- node <- cluster): ``node`` runs a single node or one
cluster member, ``pub``/``sub``/``status`` are client commands, ``cluster``
runs a whole cluster as local processes.
"""

from __future__ import annotations

import argparse
import sys

import trio

from client.cli import add_client_commands
from cluster.config import CLUSTER_SETTINGS, is_cluster_config, load_cluster_config
from cluster.launcher import DEFAULT_RUN_DIR, Launcher
from cluster.server import ClusterNode
from node.config import ConfigError, config_doc, load_node_config, read_toml
from node.server import NodeServer, run_until_signal, wait_for_signal
from pipeline import audit


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="roost", description="Roost pub/sub broker")
    sub = parser.add_subparsers(dest="command", required=True)
    n = sub.add_parser("node", help="run a node (or one cluster member) until SIGINT/SIGTERM")
    n.add_argument("--config", default=None, metavar="FILE", help="TOML config (single node or cluster)")
    n.add_argument("--id", default=None, help="which member of a cluster config to run")
    n.add_argument("--bind-host", default=None, metavar="HOST",
                   help="bind the client and peer ports on HOST instead of the configured host")
    n.add_argument("--peer-host", action="append", default=[], metavar="ID=HOST",
                   help="dial peer ID at HOST (its configured port); repeatable (containers)")
    n.set_defaults(func=cmd_node)
    add_client_commands(sub)
    c = sub.add_parser("cluster", help="run a cluster's members as local processes")
    csub = c.add_subparsers(dest="action", required=True)
    up = csub.add_parser("up", help="start every member")
    up.add_argument("config")
    up.add_argument("--detach", action="store_true", help="return once all serve; pid files and logs in --run-dir")
    down = csub.add_parser("down", help="stop the members started with --detach")
    kill = csub.add_parser("kill", help="SIGKILL one member (crash drill)")
    kill.add_argument("id")
    start = csub.add_parser("start", help="start one member again")
    start.add_argument("id")
    for p in (up, down, kill, start):
        p.add_argument("--run-dir", default=DEFAULT_RUN_DIR, metavar="DIR")
    c.set_defaults(func=cmd_cluster)
    au = sub.add_parser("audit", help="audit run event logs with Spark (report, summary, plots)",
                        description=audit.DESCRIPTION)
    audit.add_arguments(au)
    au.set_defaults(func=audit.run)
    d = sub.add_parser("config-doc", help="print the table of every setting (markdown)")
    d.set_defaults(func=lambda a: print(config_doc() + config_doc(CLUSTER_SETTINGS), end="") or 0)
    return parser


def cmd_node(args: argparse.Namespace) -> int:
    try:
        data = read_toml(args.config) if args.config else {}
        if args.config and is_cluster_config(data):
            return _run_member(args, data)
        if args.id or args.peer_host:
            raise ConfigError("--id and --peer-host need a cluster config ([cluster] and [[members]])")
        cfg = load_node_config(args.config, data) if args.config else load_node_config(None)
        if args.bind_host:
            cfg.client_addr = (args.bind_host, cfg.client_addr[1])
    except ConfigError as exc:
        print(f"roost node: {exc}", file=sys.stderr)
        return 2
    try:
        trio.run(run_until_signal, lambda: NodeServer(cfg))
    except OSError as exc:
        print(f"roost node: cannot bind {cfg.client_addr[0]}:{cfg.client_addr[1]}: {exc.strerror}",
              file=sys.stderr)  # fmt: skip
        return 1
    return 0


def _run_member(args: argparse.Namespace, data: dict[str, object]) -> int:
    cc = load_cluster_config(args.config, data)
    if not args.id:
        raise ConfigError(f"{args.config}: a cluster config needs --id (one of "
                          f"{', '.join(m.id for m in cc.members)})")  # fmt: skip
    cc.member(args.id)
    hosts = {}
    for item in args.peer_host:
        pid, sep, host = item.partition("=")
        if not sep or not host:
            raise ConfigError(f"--peer-host {item!r}: expected ID=HOST")
        cc.member(pid)
        hosts[pid] = host
    node = ClusterNode(cc, args.id, bind_host=args.bind_host, peer_hosts=hosts)
    try:
        trio.run(_run_cluster_node, node)
    except OSError as exc:  # the peer (TCP) port
        host, port = node.bind_host or node.me.peer_addr[0], node.me.peer_addr[1]
        print(f"roost node: {args.id}: cannot bind {host}:{port} (peer port): {exc.strerror or exc}",
              file=sys.stderr)  # fmt: skip
        return 1
    if node.bind_error is not None:
        host, port = node.cfg.client_addr
        print(f"roost node: {args.id}: cannot bind {host}:{port}: {node.bind_error.strerror}", file=sys.stderr)
        return 1
    return 0


async def _run_cluster_node(node: ClusterNode) -> None:
    """Run until a signal (then stop cleanly) or until the member exits by
    itself, for example when it cannot bind: then nothing waits for a signal."""

    async def stop_on_signal() -> None:
        await wait_for_signal(node.log)
        await node.stop()

    error: OSError | None = None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(stop_on_signal)
        try:
            await node.run()
        except OSError as exc:  # the peer port (raised here, not inside the nursery's group)
            error = exc
        nursery.cancel_scope.cancel()
    if error is not None:
        raise error


def cmd_cluster(args: argparse.Namespace) -> int:
    launcher = Launcher(args.run_dir)
    try:
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
    except RuntimeError as exc:
        print(f"roost cluster: {exc}", file=sys.stderr)
        return 1


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
