"""Non-blocking UDP helpers shared by the node and client shells.

trio's socket calls cost about 3x a plain one per datagram (docs/architecture.md), so the
shells use a plain non-blocking socket: drain everything that is ready with
direct ``recvfrom`` calls and only await trio when the socket is empty (or the
send buffer is full).
"""

from __future__ import annotations

import errno
import os
import socket
from collections import Counter
from collections.abc import Callable

import trio

Addr = tuple[str, int]
BUFFER_BYTES = 8 * 1024 * 1024


def open_udp(host: str, port: int, buffer: int = BUFFER_BYTES) -> socket.socket:
    """A bound non-blocking UDP socket with large kernel buffers (``buffer`` bytes each way)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_DGRAM)
    _buffers(sock, buffer)
    sock.setblocking(False)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def _buffers(sock: socket.socket, size: int) -> None:
    """Receive and send buffers of ``size`` bytes: forced past the system's limit (rmem_max)
    where we may (root), else as much of it as the limit allows."""
    for opt, force in ((socket.SO_RCVBUF, 33), (socket.SO_SNDBUF, 32)):  # *BUFFORCE
        try:
            sock.setsockopt(socket.SOL_SOCKET, force, size)
        except OSError:
            sock.setsockopt(socket.SOL_SOCKET, opt, size)


def open_client_socket(node: Addr, buffer: int = BUFFER_BYTES) -> socket.socket:
    """A client session's socket: any local port, of the family of the node it talks to."""
    family = socket.AF_INET6 if ":" in node[0] else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_DGRAM)
    _buffers(sock, buffer)
    sock.setblocking(False)
    sock.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", 0))
    return sock


def drain(sock: socket.socket, bufsize: int, limit: int = 1024) -> list[tuple[bytes, Addr]]:
    """Every datagram that is ready now (up to ``limit``), without blocking."""
    batch: list[tuple[bytes, Addr]] = []
    recvfrom = sock.recvfrom
    try:
        while len(batch) < limit:
            data, addr = recvfrom(bufsize)
            batch.append((data, addr[:2] if len(addr) > 2 else addr))
    except BlockingIOError:
        return batch  # drained
    except OSError as exc:  # e.g. ECONNREFUSED from an ICMP error: not fatal
        if exc.errno not in (errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH):
            raise
    return batch


def send_ready(sock: socket.socket, sends: list[tuple[Addr, bytes]], metrics: Counter[str], start: int = 0) -> int:
    """Send ``sends[start:]`` in order until the send buffer is full; returns the index of the
    first datagram not sent (``len(sends)`` when all went), so a caller that waits and goes on
    copies nothing.

    The node's counters of what left its client port are kept here, where ``sendto`` has
    succeeded, so every reply counts (broker, STATUS, durable, relayed) and a failed send does
    not: ``datagrams_out``, ``bytes_out``, and ``send_failed`` for a datagram that could not be
    sent (unreachable, refused by a firewall, an unusable address). UDP gives no promise; the
    protocols above repair or report the loss.
    """
    sendto = sock.sendto
    n = nbytes = failed = 0
    i, end = start, len(sends)
    while i < end:
        addr, data = sends[i]
        try:
            nbytes += sendto(data, addr)
            n += 1
        except BlockingIOError:
            break
        except (OSError, OverflowError, TypeError, ValueError):
            failed += 1
        i += 1
    metrics["datagrams_out"] += n
    metrics["bytes_out"] += nbytes
    if failed:
        metrics["send_failed"] += failed
    return i


yield_cpu = getattr(os, "sched_yield", lambda: None)  # (not on every platform)


async def send_all(sock: socket.socket, sends: list[tuple[Addr, bytes]], metrics: Counter[str],
                   give_way: Callable[[], None] = yield_cpu) -> None:  # fmt: skip
    """Send datagrams in order (counted as :func:`send_ready` does); waits only while the send
    buffer is full. ``sends`` may grow while it waits (the datagrams added go out too).

    Then it gives up the CPU (``sched_yield``). Linux wakes the receiver of a loopback datagram
    on the sender's core, and that receiver (a subscriber, the publisher awaiting its PUBACK)
    waits there until the sender sleeps: without the yield, the rest of the node's turn (its
    bookkeeping, the next drain, trio's scheduler) was added to every delivery's latency
    (docs/performance.md has the A/B); alone on its core, the call returns at once. (``give_way``:
    that yield, for a test to see what the receiver holds then.)"""
    i = send_ready(sock, sends, metrics)
    while i < len(sends):
        await trio.lowlevel.wait_writable(sock)
        i = send_ready(sock, sends, metrics, i)
    if sends:
        give_way()


def send_now(sock: socket.socket, datagrams: list[tuple[Addr, bytes]]) -> int:
    """Send without waiting (a client's datagrams); returns how many could not be sent.

    Unreachable, refused, a full send buffer, or an address the socket cannot use (another
    family; a cluster map is validated, but a member list from the application is not): UDP
    gives no promise, the session's retries and failover cover it."""
    failed = 0
    sendto = sock.sendto
    for addr, d in datagrams:
        try:
            sendto(d, addr)
        except (OSError, OverflowError, TypeError, ValueError):
            failed += 1
    return failed
