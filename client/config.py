"""Client timeouts and limits (:class:`ClientConfig`).

A module of its own because every part of the client session (handshake and
liveness, command batches, the receive side, the publisher) reads it, and the
CLI fills it from TOML before any session exists.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any


@dataclass
class ClientConfig:
    """Client timeouts and limits; every one can be set from code or TOML ``[client]``."""

    ping_interval: float = 0.5  # overridden by the node's WELCOME
    node_timeout: float = 1.5  # node silent this long: node_lost
    hello_retry: float = 0.25
    cmd_retry: float = 0.25
    pub_retry: float = 0.2
    pub_retry_max: float = 2.0
    pub_window: int = 8192  # reliable publishes in flight
    pub_window_bytes: int = 2 << 20  # and their bytes (one at least): under the node's socket buffer
    max_buffered: int = 100_000  # messages received but not yet consumed
    max_datagram: int = 16384  # until the node's WELCOME says otherwise
    max_payload: int = 1 << 20  # largest reliable payload, sent in parts (lowered to the node's WELCOME)
    reassembly_bytes: int = 16 << 20  # large messages being put together, all of them
    reassembly_timeout: float = 30.0  # a large message missing a part this long is dropped
    # Adaptive batching: a publish on a quiet path (idle_gap) is sent at once by the publishing
    # task; else it wakes the I/O loop, which sends at its next turn: when the caller next
    # waits, or after at most this many publishes (or messages taken) without a wait, when the
    # API yields to it (a busy caller: the lot in a few datagrams of one turn; 256 measured best
    # on W1, 64 and 128 lower, 512 and 1024 no better: docs/performance.md)
    yield_every: int = 256
    # Quiet path (the trio and asyncio Clients: client/turns.py): when its one session sent
    # and received nothing for this long (s), its I/O loop waiting (and at most idle_burst
    # reliable publishes in flight), an API call that queued something (a publish,
    # subscribe...) makes the loop's turn itself: sent before the call returns (with the
    # shells' CPU yields, W3 p50 ~50 us sooner: docs/performance.md). After the burst
    # (idle_burst), within it, the loop sends it with whatever follows. And a wait that lasted
    # this long makes the path sparse: the next wait (next(), flush(), a request) drives the
    # socket in its own task (trio), so what it waits for needs no hand-off from the loop's
    # task (W3 p50 ~25-40 us sooner), and the turn that brings it holds its ACK until the
    # waiter has it (trio and asyncio). 0: always when the loop waits, and every wait drives
    # (a busy subscriber then pays a parked loop per wait); inf: never
    idle_gap: float = 0.0002
    # A burst on a quiet path (the trio and asyncio Clients): this many calls that queue
    # something (and as many reliable publishes in flight), the first on the quiet path and
    # each next within idle_gap of the one before, each make the loop's turn themselves; only
    # what follows waits for the loop and shares its datagrams. A paced publisher wakes late
    # from its sleep (the event loop's timers have 1 ms steps) and publishes what is due at
    # once, 2-3 messages at 2,000/s: W3 p50 ~300 -> ~150-210 us (docs/performance.md). 1: the
    # first call alone
    idle_burst: int = 4
    socket_buffer: int = 8 << 20  # SO_RCVBUF and SO_SNDBUF of each session's socket, bytes
    # Deliberately broken builds the simulator selects (sim/breaks.py, ``--break``), never set
    # from TOML: the parts of the client that a name concerns read it once, at construction
    breaks: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        for name in ("yield_every", "pub_window", "pub_window_bytes", "socket_buffer", "max_buffered", "idle_burst"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"ClientConfig: {name} = {v!r}: must be a positive integer")
        gap = self.idle_gap
        if isinstance(gap, bool) or not isinstance(gap, (int, float)) or not gap >= 0:  # (not NaN)
            raise ValueError(
                f"ClientConfig: idle_gap = {gap!r}: must be a number of seconds, 0 or more "
                "(inf: never send from the caller)"
            )
        if self.reassembly_bytes < self.max_payload:
            raise ValueError(
                f"ClientConfig: reassembly_bytes = {self.reassembly_bytes}: must be at least "
                f"max_payload ({self.max_payload}), or no large message could be put together"
            )

    @classmethod
    def from_mapping(cls, source: str, table: dict[str, Any]) -> ClientConfig:
        cfg = cls()
        known = {f.name: f for f in fields(cls) if f.name != "breaks"}
        for k, v in table.items():
            f = known.get(k)
            if f is None:
                raise ValueError(f"{source}: [client] {k}: unknown key; known: {', '.join(known)}")
            kind = int if f.type in ("int", int) else float
            if (
                isinstance(v, bool)
                or not isinstance(v, (int, float))
                or not v > 0
                or (  # (not NaN either)
                    kind is int and not isinstance(v, int)
                )
            ):
                raise ValueError(f"{source}: [client] {k} = {v!r}: must be a positive {kind.__name__}")
            setattr(cfg, k, kind(v))
        if cfg.reassembly_bytes < cfg.max_payload:
            raise ValueError(
                f"{source}: [client] reassembly_bytes = {cfg.reassembly_bytes}: must be at least "
                f"max_payload ({cfg.max_payload}), or no large message could be put together"
            )
        return cfg
