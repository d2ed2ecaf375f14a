"""Local node processes: free ports and waiting until a node is listening.

Shared by the demo, the benchmark and the end-to-end tests (and the local
cluster launcher to come), so that there is one way to start a node process.
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from roost.client import decoding, wire

FASTPUSS_LINE = (b"SUB t1\n", b"PUB t1\nhello world  ")


# Ports handed out for nodes to bind later come from below the kernel's ephemeral range
# (/proc/sys/net/ipv4/ip_local_port_range, 32768-60999 by default): a port the kernel chose for
# us and we released is next handed to any socket that binds port 0 (every client's), and a
# node that binds it a moment later fails with "Address already in use".
PORT_RANGE = (20000, 32768)


def port_range() -> tuple[int, int]:
    """Where free ports come from: PORT_RANGE, or ``ROOST_PORT_RANGE`` (``LOW-HIGH``, inclusive).

    Two programs that hand out ports at once (two test processes, two scripts starting local
    clusters) can each find a port free and both give it to a node; one node then fails to bind.
    Given ranges of their own, they cannot (``make test``'s two test processes take a half each:
    tests/conftest.py). A bad value is an error naming the variable and what is allowed."""
    text = os.environ.get("ROOST_PORT_RANGE", "")
    if not text:
        return PORT_RANGE
    low, sep, high = text.partition("-")
    if sep and low.strip().isdecimal() and high.strip().isdecimal() and 1024 <= int(low) <= int(high) <= 65535:
        return int(low), int(high) + 1
    raise ValueError(f"ROOST_PORT_RANGE={text!r}: must be LOW-HIGH, two port numbers with 1024 <= LOW <= HIGH "
                     f"<= 65535 (default {PORT_RANGE[0]}-{PORT_RANGE[1] - 1})")  # fmt: skip


def free_port(host: str = "127.0.0.1", kind: socket.SocketKind = socket.SOCK_DGRAM) -> int:
    """A port nobody is bound to right now, outside the ephemeral range (see PORT_RANGE)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    low, high = port_range()
    for _ in range(200):
        port = random.randrange(low, high)
        with socket.socket(family, kind) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port on {host} in {low}-{high - 1} after 200 tries")


def free_udp_port(host: str = "127.0.0.1") -> int:
    """A UDP port nobody is bound to right now."""
    return free_port(host, socket.SOCK_DGRAM)


def udp_port_taken(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def wait_listening(proc: subprocess.Popen[bytes], host: str, port: int, timeout: float = 10.0) -> None:
    """Block until ``proc`` has bound its UDP port; raise if it exits or takes too long."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"node process exited with {proc.returncode} before listening")
        if udp_port_taken(host, port):
            return
        time.sleep(0.05)
    raise RuntimeError(f"node did not listen on {host}:{port} within {timeout} s")


def reachable(host: str) -> str:
    """Where to ask a node bound to ``host``: a wildcard (0.0.0.0, ::) is answered from loopback,
    and a reply is taken only from the address asked."""
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    return "::1" if host == "::" else host


def probe_welcome(host: str, port: int, timeout: float = 0.25) -> tuple[Any, ...] | None:
    """The node's WELCOME to a HELLO (its id, cookie, params and members), or None when nothing
    answers within ``timeout``."""
    host, cid = reachable(host), os.urandom(wire.ID_LEN)
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM) as s:
        return _ask(s, (host, port), wire.encode_hello(cid), wire.FrameType.WELCOME, time.monotonic() + timeout)


def probe_status(host: str, port: int, timeout: float = 0.25) -> dict[str, Any] | None:
    """What the node at ``host:port`` says of itself (HELLO, then STATUS), or None when nothing
    answers within ``timeout``. Its ``node`` and ``pid`` tell a launcher that the process it
    started is the one serving, and not another that holds the port."""
    cid, node, deadline = os.urandom(wire.ID_LEN), (reachable(host), port), time.monotonic() + timeout
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM) as s:
        welcome = _ask(s, node, wire.encode_hello(cid), wire.FrameType.WELCOME, deadline)
        reply = None if welcome is None else _ask(s, node, wire.encode_status(cid, welcome[2]),
                                                  wire.FrameType.STATUS_REPLY, deadline)  # fmt: skip
    return reply[1] if reply is not None and isinstance(reply[1], dict) else None


def _ask(
    s: socket.socket, node: tuple[str, int], data: bytes, want: wire.FrameType, deadline: float
) -> tuple[Any, ...] | None:
    """Send ``data`` to ``node``; its first frame of type ``want`` before ``deadline``, or None."""
    try:
        s.sendto(data, node)
    except OSError:
        return None
    while (left := deadline - time.monotonic()) > 0:
        s.settimeout(left)
        try:
            data, addr = s.recvfrom(70000)
        except OSError:  # (a time-out, or ICMP port unreachable from the last send)
            return None
        if addr[:2] != node:
            continue
        try:
            frame = decoding.decode_untrusted_frame(data)
        except wire.WireError:
            continue
        if frame[0] is want:
            return frame
    return None


def log_tail(path: Path, lines: int = 8) -> str:
    """The last lines of a process's log, indented, for an error message."""
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return "    (no log)"
    return "\n".join("    " + line for line in text) or "    (the log is empty)"


def is_ready(proc: subprocess.Popen[bytes], member: str, addr: tuple[str, int], log: Path | None = None) -> bool:
    """Does ``proc`` serve at ``addr`` as ``member`` now? Its own STATUS must name the member and
    the process id. Raises RuntimeError naming the member (and the end of its log) if the
    process has exited."""
    code = proc.poll()
    if code is not None:
        tail = f"; the end of its log ({log}):\n{log_tail(log)}" if log is not None else ""
        raise RuntimeError(f"{member} exited with status {code} before it was ready{tail}")
    st = probe_status(*addr)
    return st is not None and st.get("node") == member and st.get("pid") == proc.pid and \
        st.get("state", "ready") == "ready"  # fmt: skip


def wait_ready(proc: subprocess.Popen[bytes], member: str, addr: tuple[str, int], timeout: float,
               log: Path | None = None) -> None:  # fmt: skip
    """Block until :func:`is_ready`; RuntimeError when the process exits or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while not is_ready(proc, member, addr, log):
        if time.monotonic() >= deadline:
            raise not_ready(proc, member, addr, timeout, log)
        time.sleep(0.05)


def not_ready(proc: subprocess.Popen[bytes], member: str, addr: tuple[str, int], timeout: float,
              log: Path | None) -> RuntimeError:  # fmt: skip
    st = probe_status(*addr)
    who = "" if st is None else f" (udp://{addr[0]}:{addr[1]} is answered by {st.get('node')}, pid {st.get('pid')})"
    tail = f"; the end of its log ({log}):\n{log_tail(log)}" if log is not None else ""
    return RuntimeError(f"{member} (pid {proc.pid}) was not ready within {timeout:g} s{who}{tail}")


def fastpuss_roundtrip(host: str, port: int, timeout: float = 3.0) -> bytes:
    """The FASTPUSS acceptance line: one socket sends ``SUB t1``, another
    ``PUB t1``; returns what the first one received (``MSG t1...`` when served)."""
    sub_line, pub_line = FASTPUSS_LINE
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as a, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as b:
        a.settimeout(timeout)
        a.sendto(sub_line, (host, port))
        time.sleep(0.1)
        b.sendto(pub_line, (host, port))
        return a.recv(65536)
