"""Idle and slow connections against a node's monitoring endpoint, and how /healthz fares.

    python scripts/monitor_flood.py --spawn                      # a node of this checkout, 100 idle
    python scripts/monitor_flood.py --monitor 127.0.0.1:8222 --idle 40 --tries 40
    python scripts/monitor_flood.py --spawn --slow 8 --idle 0    # 8 requests trickled a byte a second

A flood process opens ``--idle`` TCP connections that never send a byte (a port scanner, a
client that connects and hangs, a deliberate flood) and ``--slow`` ones that trickle a request a
byte a second (slowloris). Once they are all open, this process tries ``--path`` (``/healthz``)
on a fresh connection ``--tries`` times, ``--interval`` seconds apart, each given ``--timeout``
seconds, with plain blocking sockets, as a container healthcheck (a process of its own) would.
With ``--reopen`` the flood opens every connection the node closes again at once, so it never
thins; ``--flood-from 127.0.0.2`` sends it from another address than the tries (another host, to
the node's ``max_per_host``). It prints each try with ``--verbose``, then the figures: tries
answered 200, within 100 ms, their latencies, the other outcomes (503: refused as busy), and how
many of the flood's connections the node closed. ``$ROOST_MONITOR_TOKEN``, when set, is sent as
a bearer token (``/healthz`` needs none). Exit status 0 when every try was answered 200 within
100 ms.

``--spawn`` runs ``python -m roost node`` of this checkout on free loopback ports with default
[monitor] limits (``--node-config`` adds TOML lines) and stops it at the end. Everything is
bounded: at most 10,000 connections, 1,000 tries, and ``--duration-cap`` seconds in all. Only
loopback addresses may be flooded (``--allow-remote`` for a machine of your own).
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import trio  # noqa: E402

from roost.node.config import parse_hostport  # noqa: E402
from roost.node.procs import free_port, free_udp_port  # noqa: E402

TOKEN_ENV = "ROOST_MONITOR_TOKEN"
GONE = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)


# ------------------------------------------------------------ the flood (a child process)


class Flood:
    """The connections that hog the endpoint, and what became of them."""

    def __init__(self, host: str, port: int, reopen: bool, source: str | None) -> None:
        self.host, self.port, self.reopen, self.source = host, port, reopen, source
        self.open = self.opened = self.closed_by_node = self.failed = 0

    def figures(self) -> dict[str, int]:
        return {"open": self.open, "opened": self.opened, "closed_by_node": self.closed_by_node, "failed": self.failed}

    async def hold(self, slow: bool, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """One connection, silent (or trickling a request), until the node closes it; again with
        ``reopen``. Started once it is open (or failed to open)."""
        started = False
        while True:
            try:
                stream = await trio.open_tcp_stream(self.host, self.port, local_address=self.source)
            except OSError:
                self.failed += 1
                if not started:
                    task_status.started()
                return
            self.open += 1
            self.opened += 1
            if not started:
                started = True
                task_status.started()
            with contextlib.suppress(*GONE):
                async with stream:
                    if slow:
                        await _trickle(stream)
                    else:
                        while await stream.receive_some(4096):
                            pass
            self.open -= 1
            self.closed_by_node += 1
            if not self.reopen:
                return


async def _trickle(stream: trio.SocketStream) -> None:
    """Send a request one byte a second for as long as the node takes it, reading any answer."""
    request = b"GET /healthz HTTP/1.1\r\nhost: flood\r\n" + b"x-pad: " + b"y" * 4000 + b"\r\n\r\n"

    async def reader(cancel: trio.CancelScope) -> None:
        with contextlib.suppress(*GONE):
            while await stream.receive_some(4096):
                pass
        cancel.cancel()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader, nursery.cancel_scope)
        with contextlib.suppress(*GONE):
            for i in range(len(request)):
                await stream.send_all(request[i : i + 1])
                await trio.sleep(1.0)


async def flood_child(args: argparse.Namespace, host: str, port: int) -> None:
    """Open the flood, say so on stdout (one JSON line), hold it until stdin closes (the parent is
    done) or the duration cap passes, then print the figures (another JSON line)."""
    flood = Flood(host, port, args.reopen, args.flood_from)
    with trio.move_on_after(args.duration_cap):
        async with trio.open_nursery() as nursery:
            t0 = trio.current_time()
            for i in range(args.idle + args.slow):
                await nursery.start(flood.hold, i >= args.idle)
            print(json.dumps({**flood.figures(), "seconds": trio.current_time() - t0}), flush=True)
            await trio.to_thread.run_sync(sys.stdin.read, abandon_on_cancel=True)
            nursery.cancel_scope.cancel()
    print(json.dumps(flood.figures()), flush=True)


# ------------------------------------------------------------ the tries (this process)


def try_once(host: str, port: int, path: str, timeout: float, token: str) -> tuple[int, float]:
    """One request on a fresh connection: (status, seconds); status 0 when it failed or timed out."""
    t0 = time.perf_counter()
    auth = f"authorization: Bearer {token}\r\n" if token else ""
    data = b""
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nhost: {host}\r\n{auth}connection: close\r\n\r\n".encode())
            while (chunk := s.recv(65536)) and time.perf_counter() - t0 < timeout:
                data += chunk
    except OSError:
        if not data:
            return 0, time.perf_counter() - t0
    status = data.split(b" ", 2)
    code = int(status[1]) if len(status) > 2 and status[1].isdigit() else 0
    return code, time.perf_counter() - t0


def run(args: argparse.Namespace, argv: list[str], host: str, port: int) -> int:
    child = subprocess.Popen([sys.executable, __file__, "--flood-child", *argv, "--monitor", f"{host}:{port}"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert child.stdin is not None and child.stdout is not None
    deadline = time.monotonic() + args.duration_cap
    results: list[tuple[int, float]] = []
    try:
        opened: dict[str, Any] = json.loads(child.stdout.readline() or "{}")
        how = (", reopened when closed" if args.reopen else "") + (f", from {args.flood_from}" if args.flood_from
                                                                   else "")  # fmt: skip
        print(f"flood: {opened.get('opened', 0)} connections open in {opened.get('seconds', 0):.2f} s ({args.idle} "
              f"idle, {args.slow} slow{how}); {opened.get('closed_by_node', 0)} already closed by the node, "
              f"{opened.get('failed', 0)} failed to open", flush=True)  # fmt: skip
        token = os.environ.get(TOKEN_ENV, "")
        for i in range(args.tries):
            if i:
                time.sleep(args.interval)
            if time.monotonic() >= deadline:
                break
            code, took = try_once(host, port, args.path, args.timeout, token)
            results.append((code, took))
            if args.verbose:
                print(f"try {i + 1:3}: {code or 'failed'} in {took * 1000:.1f} ms", flush=True)
    finally:
        child.stdin.close()
        try:
            end = json.loads(child.stdout.readline() or "{}")
            child.wait(10)
        except (subprocess.TimeoutExpired, ValueError):
            child.kill()
            end = {}
    ok = [t for c, t in results if c == 200]
    fast = [t for t in ok if t <= 0.1]
    cut = "" if len(results) == args.tries else f" (stopped by --duration-cap {args.duration_cap:g} s)"
    print(f"{args.path}: {len(results)} tries, {len(ok)} answered 200, {len(fast)} within 100 ms{cut}")
    if ok:
        ms = sorted(t * 1000 for t in ok)
        print(f"latency of the answered: p50 {statistics.median(ms):.2f} ms, max {ms[-1]:.2f} ms")
    others = sorted({c for c, _ in results if c != 200})
    if others:
        what = {o: str(o or "failed (closed, reset or timed out)") for o in others}
        print("other outcomes: " + ", ".join(f"{sum(1 for c, _ in results if c == o)} x {what[o]}" for o in others))
    print(f"flood: {end.get('opened', '?')} opened, {end.get('closed_by_node', '?')} closed by the node, "
          f"{end.get('open', '?')} still open at the end")  # fmt: skip
    return 0 if results and len(fast) == len(results) == args.tries else 1


def spawn(extra: str, workdir: Path) -> tuple[subprocess.Popen[bytes], int]:
    """A node of this checkout with a monitoring endpoint on a free loopback port, answering."""
    mport = free_port("127.0.0.1", kind=socket.SOCK_STREAM)
    cfg = workdir / "node.toml"
    cfg.write_text(f'[node]\nclient_addr = "127.0.0.1:{free_udp_port()}"\n[monitor]\naddr = "127.0.0.1:{mport}"\n'
                   + extra.replace("\\n", "\n") + "\n")  # fmt: skip
    log = open(workdir / "node.log", "wb")  # noqa: SIM115 (closed with the process, below)
    proc = subprocess.Popen([sys.executable, "-m", "roost", "node", "--config", str(cfg)], cwd=ROOT, stdout=log,
                            stderr=subprocess.STDOUT)  # fmt: skip
    log.close()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the node exited with {proc.returncode}: {(workdir / 'node.log').read_text()}")
        if try_once("127.0.0.1", mport, "/healthz", 0.5, "")[0] == 200:
            return proc, mport
        time.sleep(0.1)
    proc.terminate()
    raise SystemExit("the node's /healthz did not answer 200 within 15 s")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--monitor", metavar="HOST:PORT", help="a running node's monitoring endpoint")
    ap.add_argument("--spawn", action="store_true", help="start a node of this checkout for the run")
    ap.add_argument("--node-config", default="", metavar="TOML", help="lines added to the spawned node's config")
    ap.add_argument("--idle", type=int, default=100, help="connections that send nothing (default 100)")
    ap.add_argument("--slow", type=int, default=0, help="connections that trickle a request, a byte a second")
    ap.add_argument("--reopen", action="store_true", help="open every connection the node closes again")
    ap.add_argument("--flood-from", default=None, metavar="ADDR",
                    help="the flood's source address (a loopback one such as 127.0.0.2; the tries come from the "
                         "default): another host, as far as the node's max_per_host is concerned")  # fmt: skip
    ap.add_argument("--tries", type=int, default=40, help="requests tried (default 40)")
    ap.add_argument("--interval", type=float, default=0.2, help="seconds between tries (default 0.2)")
    ap.add_argument("--timeout", type=float, default=1.0, help="seconds a try may take (default 1)")
    ap.add_argument("--path", default="/healthz", help="what to ask for (default /healthz)")
    ap.add_argument("--duration-cap", type=float, default=120.0, help="seconds the whole run may take")
    ap.add_argument("--allow-remote", action="store_true", help="flood a non-loopback address")
    ap.add_argument("--verbose", "-v", action="store_true", help="print every try")
    ap.add_argument("--flood-child", action="store_true", help=argparse.SUPPRESS)
    argv = sys.argv[1:] if argv is None else argv
    args = ap.parse_args(argv)
    if not (0 <= args.idle + args.slow <= 10_000 and 1 <= args.tries <= 1000):
        ap.error("--idle + --slow must be at most 10000, --tries from 1 to 1000")
    if not 0 < args.timeout <= 60 or not 0 <= args.interval <= 60 or not 0 < args.duration_cap <= 3600:
        ap.error("--timeout up to 60 s, --interval up to 60 s, --duration-cap up to 3600 s")
    if args.flood_from is not None and not ipaddress.ip_address(args.flood_from).is_loopback:
        ap.error(f"--flood-from {args.flood_from}: must be a loopback address")
    if args.flood_child:  # (the parent passes the endpoint it chose as the last --monitor)
        host, port = parse_hostport(args.monitor)
        trio.run(flood_child, args, host, port)
        return 0
    if bool(args.monitor) == args.spawn:
        ap.error("give --monitor HOST:PORT or --spawn")
    if args.spawn:
        with tempfile.TemporaryDirectory(prefix="roost-flood-") as tmp:
            proc, port = spawn(args.node_config, Path(tmp))
            try:
                return run(args, argv, "127.0.0.1", port)
            finally:
                proc.terminate()
                proc.wait(10)
    try:
        host, port = parse_hostport(args.monitor)
    except ValueError as exc:
        ap.error(f"--monitor {args.monitor!r}: {exc}")
    if not ipaddress.ip_address(host).is_loopback and not args.allow_remote:
        ap.error(f"--monitor {args.monitor}: not a loopback address (--allow-remote for a machine of your own)")
    return run(args, argv, host, port)


if __name__ == "__main__":
    sys.exit(main())
