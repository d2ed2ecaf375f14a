"""Local node processes: free ports and waiting until a node is listening.

Shared by the demo, the benchmark and the end-to-end tests (and the local
cluster launcher to come), so that there is one way to start a node process.
"""

from __future__ import annotations

import random
import socket
import subprocess
import time

FASTPUSS_LINE = (b"SUB t1\n", b"PUB t1\nhello world  ")


# Ports handed out for nodes to bind later come from below the kernel's ephemeral range
# (/proc/sys/net/ipv4/ip_local_port_range, 32768-60999 by default): a port the kernel chose for
# us and we released is next handed to any socket that binds port 0 (every client's), and a
# node that binds it a moment later fails with "Address already in use".
PORT_RANGE = (20000, 32768)


def free_port(host: str = "127.0.0.1", kind: socket.SocketKind = socket.SOCK_DGRAM) -> int:
    """A port nobody is bound to right now, outside the ephemeral range (see PORT_RANGE)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for _ in range(200):
        port = random.randrange(*PORT_RANGE)
        with socket.socket(family, kind) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port on {host} in {PORT_RANGE[0]}-{PORT_RANGE[1] - 1} after 200 tries")


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
