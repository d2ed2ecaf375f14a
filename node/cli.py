"""The ``roost`` command line: ``node`` here, ``pub``/``sub`` from the client.

It lives in ``node`` (not ``client``) because dependencies point one way:
client <- node <- cluster.
"""

from __future__ import annotations

import argparse
import sys

import trio

from client.cli import add_client_commands
from node.config import ConfigError, config_doc, load_node_config
from node.server import NodeServer, run_until_signal


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="roost", description="Roost pub/sub broker")
    sub = parser.add_subparsers(dest="command", required=True)
    n = sub.add_parser("node", help="run a broker node until SIGINT/SIGTERM")
    n.add_argument("--config", default=None, metavar="FILE", help="TOML config file")
    n.set_defaults(func=cmd_node)
    add_client_commands(sub)
    d = sub.add_parser("config-doc", help="print the table of node settings (markdown)")
    d.set_defaults(func=lambda a: print(config_doc(), end="") or 0)
    return parser


def cmd_node(args: argparse.Namespace) -> int:
    try:
        cfg = load_node_config(args.config)
    except ConfigError as exc:
        print(f"roost node: {exc}", file=sys.stderr)
        return 2
    try:
        trio.run(run_until_signal, lambda: NodeServer(cfg))
    except OSError as exc:
        print(f"roost node: cannot bind {cfg.client_addr[0]}:{cfg.client_addr[1]}: {exc.strerror}",
              file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
