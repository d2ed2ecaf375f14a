"""``roost status`` and ``roost top``: what a node says of itself, once or live.

``status`` asks the node over UDP (STATUS: the members and their states, what every node
answers) and, when the node has a monitoring endpoint (its STATUS names it), adds what
only /varz knows: version, uptime, CPU, memory, traffic. ``top`` reads /varz (and /connz) of
one or more monitoring endpoints every ``--interval`` and prints rates, as nats-top does.

An endpoint with a token ([monitor] token) answers /varz and /connz only with it: both commands
send ``Authorization: Bearer`` with the first line of ``--monitor-token-file``, else with
$ROOST_MONITOR_TOKEN (the variable the node reads too). A flag holding the token itself would
show it to every user of the machine in the process list.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request
from typing import Any

import trio

from roost.client import addresses
from roost.client.cli import NODE_HELP, _run, counter, nodes, positive
from roost.client.library import Client
from roost.client.session import ClientConfig

HTTP_TIMEOUT = 2.0
TOKEN_ENV = "ROOST_MONITOR_TOKEN"
TOKEN_FILE_HELP = (f"a file whose first line is the monitoring endpoint's token ([monitor] token); default: "
                   f"${TOKEN_ENV}, else none")  # fmt: skip


def add_status_commands(sub: Any) -> None:
    st = sub.add_parser("status", help="show a node's view of itself and its cluster")
    st.add_argument("--node", type=nodes, default=None, metavar="HOST:PORT", help=NODE_HELP)
    st.add_argument("--json", action="store_true", help="print the status map as JSON (with /varz as 'varz')")
    st.add_argument("--monitor-token-file", default=None, metavar="FILE", help=TOKEN_FILE_HELP)
    st.set_defaults(func=cmd_status)
    top = sub.add_parser("top", help="live traffic, memory and clients of nodes, from their monitoring endpoints")
    top.add_argument(
        "--monitor",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="a monitoring endpoint ([monitor] addr); repeatable (default: the one --node's STATUS names)",
    )
    top.add_argument("--node", type=nodes, default=None, metavar="HOST:PORT", help=NODE_HELP)
    top.add_argument("--interval", type=positive, default=1.0, metavar="S", help="seconds between refreshes")
    top.add_argument(
        "--count", type=counter(1), default=None, metavar="N", help="stop after N refreshes (default: until Ctrl-C)"
    )
    top.add_argument(
        "--clients", type=counter(0), default=5, metavar="N", help="show the N clients with the deepest mailboxes"
    )
    top.add_argument("--monitor-token-file", default=None, metavar="FILE", help=TOKEN_FILE_HELP)
    top.set_defaults(func=cmd_top)


def monitor_token(args: argparse.Namespace) -> str:
    """The token to send: ``--monitor-token-file``'s first line, else $ROOST_MONITOR_TOKEN, else
    none; OSError naming the file when it cannot be read."""
    if args.monitor_token_file is None:
        return os.environ.get(TOKEN_ENV, "").strip()
    try:
        with open(args.monitor_token_file) as f:
            return f.readline().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise OSError(f"--monitor-token-file {args.monitor_token_file}: {getattr(exc, 'strerror', None) or exc}") \
            from None  # fmt: skip


def fetch(base: str, path: str, token: str = "") -> dict[str, Any]:
    """GET a monitoring document (with the bearer token, if any); OSError (with the URL) when it
    cannot be had."""
    url = base.rstrip("/") + path
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=HTTP_TIMEOUT) as r:
            doc = json.loads(r.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 503:  # (/healthz of a syncing member: the document still says why)
            return dict(json.loads(exc.read()))
        if exc.code == 401:
            what = "the token sent is not the endpoint's" if token else \
                f"it wants a token: set {TOKEN_ENV} or pass --monitor-token-file"  # fmt: skip
            raise OSError(f"{url}: HTTP 401: {what}") from None
        raise OSError(f"{url}: HTTP {exc.code}") from None
    except (OSError, ValueError) as exc:
        raise OSError(f"{url}: {getattr(exc, 'reason', None) or exc}") from None
    if not isinstance(doc, dict):
        raise OSError(f"{url}: not a JSON object")
    return doc


def monitor_url(status: dict[str, Any], node: tuple[str, int] | None) -> str | None:
    """The monitoring endpoint a STATUS names, reachable from here: a node bound to every
    address (0.0.0.0, ::) is asked at the address we reached it by."""
    m = status.get("monitor")
    if not isinstance(m, str) or not m:
        return None
    host, _, port = m.rpartition(":")
    host = host.strip("[]")
    if host in ("0.0.0.0", "::") and node is not None:
        host = node[0]
    return "http://" + addresses.hostport(host, int(port))


async def _ask_status(node: str | None) -> tuple[dict[str, Any], str, tuple[str, int]]:
    async with Client(node, config=ClientConfig(node_timeout=2.0)) as c:
        return await c.status(), addresses.show([c.node]), c.node


async def _fetch(base: str, path: str, token: str) -> dict[str, Any]:
    return await trio.to_thread.run_sync(fetch, base, path, token)


def cmd_status(args: argparse.Namespace) -> int:
    async def main() -> int:
        token = monitor_token(args)
        status, where, addr = await _ask_status(args.node)
        url = monitor_url(status, addr)
        varz: dict[str, Any] | None = None
        if url is not None:
            try:
                varz = await _fetch(url, "/varz", token)
            except OSError as exc:
                print(f"roost status: the monitoring endpoint did not answer: {exc}", file=sys.stderr)
        if args.json:
            print(json.dumps({**status, **({"varz": varz} if varz else {})}, indent=2, sort_keys=True))
            return 0
        members = status.get("members") or [
            {"id": status["node"], "state": status.get("state", "ready"), "subscriptions": status["subscriptions"],
             "clients": status["clients"], "queue": 0, "client_addr": where}
        ]  # fmt: skip
        gone = sum(1 for m in members if m["state"] == "left")
        print(f"node {status['node']} ({status.get('state', 'ready')}), "
              f"{status.get('mode', 'single')}, {len(members) - gone} member(s)"
              + (f" and {gone} that left" if gone else ""))  # fmt: skip
        if varz is not None:
            print(f"roost {varz['version']}, up {_duration(varz['uptime_s'])}, cpu {varz['cpu_seconds']:.1f} s, "
                  f"memory {_size(varz['rss_bytes'])}, {varz['in_msgs']:,} msgs in, {varz['out_msgs']:,} out, "
                  f"monitor {url}")  # fmt: skip
        print(f"{'ID':8} {'STATE':8} {'SUBSCRIPTIONS':>13} {'CLIENTS':>8} {'QUEUE':>8}  CLIENT ADDR")
        for m in members:
            print(f"{m['id']:8} {m['state']:8} {m['subscriptions']:>13} {m['clients']:>8} {m['queue']:>8}  "
                  f"{m['client_addr']}")  # fmt: skip
        return 0

    return _run(main)


def cmd_top(args: argparse.Namespace) -> int:
    async def main() -> int:
        token = monitor_token(args)
        urls = [_http(m) for m in args.monitor]
        if not urls:
            status, _, addr = await _ask_status(args.node)
            url = monitor_url(status, addr)
            if url is None:
                print(f"roost top: node {status['node']} has no monitoring endpoint: set [monitor] addr in its "
                      "config (a cluster member: monitor_addr in its [[members]] entry), or name one with "
                      "--monitor", file=sys.stderr)  # fmt: skip
                return 2
            urls = [url]
        before: dict[str, tuple[float, dict[str, Any]]] = {}
        screen = sys.stdout.isatty()
        n = 0
        while args.count is None or n < args.count:
            if n:
                await trio.sleep(args.interval)
            n += 1
            lines = [f"roost top  {time.strftime('%H:%M:%S')}  (every {args.interval:g} s)", _TOP_HEADER]
            conns: list[tuple[str, dict[str, Any]]] = []
            for url in urls:
                try:
                    varz, now = await _fetch(url, "/varz", token), time.monotonic()
                    if args.clients:
                        page = await _fetch(url, "/connz?limit=1024", token)
                        conns += [(varz["server_id"], c) for c in page["connections"]]
                except OSError as exc:
                    lines.append(f"{url}: {exc}")
                    continue
                lines.append(_top_line(varz, now, before.get(url)))
                before[url] = (now, varz)
            if args.clients and conns:
                conns.sort(key=lambda x: (-x[1]["mailbox"], x[1]["addr"]))
                lines.append(f"\n{'NODE':8} {'CLIENT':22} {'SUBS':>5} {'MAILBOX':>8} {'IN FLIGHT':>9} {'AGE':>8}")
                lines += [f"{node:8} {c['addr']:22} {c['subscriptions']:>5} {c['mailbox']:>8} {c['in_flight']:>9} "
                          f"{_duration(c['age_s']):>8}" for node, c in conns[: args.clients]]  # fmt: skip
            print(("\x1b[H\x1b[2J" if screen else "") + "\n".join(lines), flush=True)
        return 0

    return _run(main)


_TOP_HEADER = (f"{'NODE':8} {'UPTIME':>8} {'CPU%':>6} {'MEMORY':>9} {'CLIENTS':>7} {'SUBS':>8} "
               f"{'MSGS IN/S':>10} {'MSGS OUT/S':>10} {'DGRAMS IN/S':>11} {'DROPS':>7}")  # fmt: skip


def _top_line(varz: dict[str, Any], now: float, before: tuple[float, dict[str, Any]] | None) -> str:
    """One node's line: rates since the previous refresh (blank on the first)."""

    def rate(key: str) -> str:
        if before is None or now <= before[0]:
            return "-"
        return f"{(varz[key] - before[1][key]) / (now - before[0]):,.0f}"

    cpu = "-" if before is None else f"{100 * (varz['cpu_seconds'] - before[1]['cpu_seconds']) / (now - before[0]):.0f}"
    drops = sum(varz["drops"].values())
    return (f"{varz['server_id']:8} {_duration(varz['uptime_s']):>8} {cpu:>6} {_size(varz['rss_bytes']):>9} "
            f"{varz['clients']:>7} {varz['subscriptions']:>8} {rate('in_msgs'):>10} {rate('out_msgs'):>10} "
            f"{rate('in_datagrams'):>11} {drops:>7}")  # fmt: skip


def _http(value: str) -> str:
    return value if value.startswith(("http://", "https://")) else "http://" + value


def _duration(s: float) -> str:
    s = int(s)
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"
