"""``roost pub`` and ``roost sub``: the client side of the command line."""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from typing import Any

import trio

from roost.client.library import Client, NodeLost
from roost.client.session import ClientConfig
from roost.client.wire import WireError


def add_client_commands(sub: Any) -> None:
    p = sub.add_parser("pub", help="publish messages to a topic")
    p.add_argument("topic")
    p.add_argument("message", nargs="?", help="payload; {n} becomes 0..N-1; stdin lines if absent")
    _common(p)
    p.set_defaults(func=cmd_pub)

    pt = sub.add_parser("put", help="publish messages durably: each is on disk on both owners of its "
                        "partition before it is acknowledged (a partitioned cluster; docs/durable.md)")
    pt.add_argument("topic")
    pt.add_argument("message", nargs="?", help="payload; {n} becomes 0..N-1; stdin lines if absent")
    pt.add_argument("--node", default="127.0.0.1:7400", metavar="HOST:PORT")
    pt.add_argument("--key", default=None, metavar="K")
    pt.add_argument("--count", type=int, default=None, metavar="N")
    pt.add_argument("--timeout", type=float, default=30.0, metavar="S",
                    help="fail if the puts are not all acknowledged within S seconds of the last (default 30)")
    pt.set_defaults(func=cmd_put)

    g = sub.add_parser("get", help="read a durable subscription: print each payload on its own line, then "
                       "move its cursor past them (docs/durable.md)")
    g.add_argument("topic")
    g.add_argument("--durable", required=True, metavar="NAME", help="the durable subscription's name")
    g.add_argument("--client", default="default", metavar="C", help="whose subscription it is (default: default)")
    g.add_argument("--count", type=int, default=1, metavar="N", help="messages to read (default 1)")
    g.add_argument("--start", default="earliest", metavar="WHERE",
                   help="where a new subscription begins: earliest (default), latest, an offset, or a "
                   "time (ISO 8601, such as 2026-11-24T09:30:00Z; local time without a zone)")
    g.add_argument("--timeout", type=float, default=10.0, metavar="S",
                   help="give up waiting after S seconds (default 10; non-zero exit with fewer than N)")
    g.add_argument("--offsets-dir", default=None, metavar="DIR",
                   help="record each commit here first, so that a crash before the cluster has it "
                   "repeats nothing on the next run (client/offsets.py)")
    g.add_argument("--node", default="127.0.0.1:7400", metavar="HOST:PORT")
    g.set_defaults(func=cmd_get)

    s = sub.add_parser("sub", help="subscribe and print each payload on its own line")
    s.add_argument("topic")
    _common(s)
    s.add_argument("--timeout", type=float, default=None, metavar="S",
                   help="give up after S seconds (non-zero exit if --count was not reached)")
    s.set_defaults(func=cmd_sub)

    st = sub.add_parser("status", help="show a node's view of itself and its cluster")
    st.add_argument("--node", default="127.0.0.1:7400", metavar="HOST:PORT")
    st.add_argument("--json", action="store_true", help="print the status map as JSON")
    st.set_defaults(func=cmd_status)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--node", default="127.0.0.1:7400", metavar="HOST:PORT")
    p.add_argument("--key", default=None, metavar="K")
    p.add_argument("--count", type=int, default=None, metavar="N")
    p.add_argument("--mode", choices=("fire", "reliable"), default="reliable")


def _node(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise SystemExit(f"roost: --node must be HOST:PORT, not {value!r}")
    return host or "127.0.0.1", int(port)


def _payloads(args: argparse.Namespace, command: str) -> Any:
    """The payloads of ``roost pub``/``put``: MESSAGE (``{n}`` numbered) ``--count`` times, or stdin lines."""
    count = 1 if args.count is None else args.count
    if count < 0:
        raise SystemExit(f"roost {command}: --count must be >= 0")
    templates = [args.message] if args.message is not None else (line.rstrip("\n") for line in sys.stdin)
    return ((t.replace("{n}", str(n)) if "{n}" in t else t).encode() for t in templates for n in range(count))


def cmd_pub(args: argparse.Namespace) -> int:
    payloads = _payloads(args, "pub")

    async def main() -> int:
        async with Client(_node(args.node), config=ClientConfig()) as c:
            for payload in payloads:
                await c.publish(args.topic, payload, key=args.key, mode=args.mode)
            if args.mode == "reliable" and not await c.flush():
                raise NodeLost("node lost before acknowledging every publish")
        return 0

    return _run(main)


def cmd_put(args: argparse.Namespace) -> int:
    if args.timeout <= 0:
        raise SystemExit("roost put: --timeout must be > 0")
    payloads = _payloads(args, "put")

    async def main() -> int:
        async with Client(_node(args.node), config=ClientConfig()) as c:
            for payload in payloads:
                await c.put(args.topic, payload, key=args.key)
            if not await c.flush(timeout=args.timeout):
                raise NodeLost(f"not every put was acknowledged within {args.timeout} s (the node lost, or "
                               "the partition's owners cannot commit: see the members' logs)")  # fmt: skip
        return 0

    return _run(main)


def cmd_get(args: argparse.Namespace) -> int:
    if args.count < 1 or args.timeout <= 0:
        raise SystemExit("roost get: --count must be >= 1 and --timeout > 0")
    start: str | int | datetime.datetime = args.start
    if args.start.isdigit():
        start = int(args.start)
    elif args.start not in ("earliest", "latest"):
        try:
            start = datetime.datetime.fromisoformat(args.start)
        except ValueError:
            raise SystemExit(f"roost get: --start must be earliest, latest, an offset or an ISO 8601 time, "
                             f"not {args.start!r}") from None  # fmt: skip

    async def main() -> int:
        out = sys.stdout.buffer
        async with Client(_node(args.node), offsets_dir=args.offsets_dir) as c:
            got = await c.get(args.topic, args.durable, args.count, start=start, timeout=args.timeout,
                              client=args.client)  # fmt: skip
            for m in got:
                out.write(m.payload + b"\n")
            out.flush()
            if got and not await c.commit(args.topic, args.durable, client=args.client):
                raise NodeLost("the cursor could not be committed: the next get repeats these")
        if len(got) < args.count:
            print(f"roost get: timed out after {args.timeout} s with {len(got)} of {args.count} messages",
                  file=sys.stderr)  # fmt: skip
            return 1
        return 0

    return _run(main)


def cmd_sub(args: argparse.Namespace) -> int:
    async def main() -> int:
        out = sys.stdout.buffer
        got = 0
        deadline = trio.current_time() + args.timeout if args.timeout else float("inf")
        async with Client(_node(args.node)) as c:
            async with c.subscribe(args.topic, key=args.key, mode=args.mode) as sub:
                if sub.reason is not None:
                    print(f"roost sub: subscription refused: {sub.reason}", file=sys.stderr)
                    return 1
                print(f"roost sub: subscribed to {args.topic} ({args.mode}) at node "
                      f"{c.session.node_id}", file=sys.stderr, flush=True)
                with trio.move_on_at(deadline):
                    while args.count is None or got < args.count:
                        try:
                            msg = await sub.next()
                        except StopAsyncIteration:
                            out.flush()
                            print(f"roost sub: subscription ended: {sub.reason}", file=sys.stderr)
                            return 1
                        out.write(msg.payload + b"\n")
                        got += 1
                        if not sub._st or not sub._st.queue:
                            out.flush()
                out.flush()
                if args.count is not None and got < args.count:
                    print(f"roost sub: timed out after {args.timeout} s with {got} of "
                          f"{args.count} messages", file=sys.stderr)
                    return 1
        return 0

    return _run(main)


def cmd_status(args: argparse.Namespace) -> int:
    async def main() -> int:
        async with Client(_node(args.node), config=ClientConfig(node_timeout=2.0)) as c:
            status = await c.status()
        if args.json:
            print(json.dumps(status, indent=2, sort_keys=True))
            return 0
        members = status.get("members") or [
            {"id": status["node"], "state": status.get("state", "ready"), "subscriptions": status["subscriptions"],
             "clients": status["clients"], "queue": 0, "client_addr": args.node}
        ]  # fmt: skip
        gone = sum(1 for m in members if m["state"] == "left")
        print(f"node {status['node']} ({status.get('state', 'ready')}), "
              f"{status.get('mode', 'single')}, {len(members) - gone} member(s)"
              + (f" and {gone} that left" if gone else ""))  # fmt: skip
        print(f"{'ID':8} {'STATE':8} {'SUBSCRIPTIONS':>13} {'CLIENTS':>8} {'QUEUE':>8}  CLIENT ADDR")
        for m in members:
            print(f"{m['id']:8} {m['state']:8} {m['subscriptions']:>13} {m['clients']:>8} {m['queue']:>8}  "
                  f"{m['client_addr']}")  # fmt: skip
        return 0

    return _run(main)


def _run(main: Any) -> int:
    try:
        return int(trio.run(main))
    except NodeLost as exc:
        print(f"roost: {exc}", file=sys.stderr)
        return 3
    except (WireError, ValueError) as exc:
        print(f"roost: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
