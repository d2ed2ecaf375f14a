"""What every layer of the broker core shares: settings, metrics, the actions
being built, the timer heap, admission counts, and how errors are answered.

The broker core is a stack of layers, one module each (see node/core.py):
this is the bottom one. An entry point of the core appends actions to
``_out`` as it runs and returns them at the end, so no layer needs to know
which entry point it was called from. Timers are one heap of
``(due, kind, key)`` entries; ``tick`` in node/core.py pops what is due and
dispatches on the kind. An entry may be stale by the time it fires (the
client went, the mailbox was acknowledged): every handler checks.
"""

from __future__ import annotations

import heapq
import ipaddress
from collections import Counter
from typing import Any

from roost.client import wire
from roost.client.text import encode_text_error
from roost.client.wire import WireError
from roost.node.actions import Action, Log, Send
from roost.node.admission import Admission
from roost.node.config import NodeConfig
from roost.node.cookies import Addr

# Timer kinds in the heap.
TIMER_RTO, TIMER_LIVENESS, TIMER_LEASE, TIMER_PRODUCER = range(4)

# An unvalidated address never gets more than this many times the bytes it sent.
AMPLIFICATION = 3


class CoreBase:
    def __init__(self, config: NodeConfig) -> None:
        self.cfg = config
        self.node_id = config.id
        self.metrics: Counter[str] = Counter()
        self.admission = Admission(config.max_per_host, self.metrics)
        self.client_share = Admission(config.max_clients)  # binary client records alone, per host
        self._out: list[Action] = []
        self._timers: list[tuple[float, int, Any]] = []
        self._now = 0.0  # of the entry point running (for code that is not passed it)
        self._max = config.max_datagram
        self._text_ok: dict[str, bool] = {}
        self._text_nets = [ipaddress.ip_network(n) for n in config.text_networks]
        # Partitioned mode: the epoch of the cluster map the member installed (0: no map) and
        # the REDIRECT frame that carries it (node/core.py, ``set_cluster_map``).
        self.map_epoch = 0
        self.redirect_frame: bytes | None = None
        # The process serving this core, set by the shell: STATUS tells it, so that a launcher
        # knows the process it started answers, and not another that holds the port.
        self.pid: int | None = None
        # Each source host's byte budget (max_host_bytes_per_second): the bytes it may still
        # send now, and when that was reckoned; two dicts of plain values, out of the
        # collector's sight.
        self._host_tokens: dict[str, float] = {}
        self._host_at: dict[str, float] = {}

    def _over_rate(self, host: str, n: int, now: float) -> bool:
        """Has ``host`` sent more than its bytes per second (a bucket of one second's worth)?
        Spends ``n`` from its budget if not."""
        rate = self.cfg.max_host_bytes_per_second
        tokens = self._host_tokens.get(host)
        if tokens is None:
            if len(self._host_tokens) >= 65536:  # (hosts silent for a second have a full bucket: forget them)
                quiet = [h for h, at in self._host_at.items() if now - at >= 1.0]
                for h in quiet:
                    del self._host_tokens[h], self._host_at[h]
            tokens = rate
        else:
            tokens = min(rate, tokens + max(0.0, now - self._host_at[host]) * rate)
        self._host_at[host] = now
        if tokens < n:
            self._host_tokens[host] = tokens
            self.metrics["dropped_host_rate"] += 1
            return True
        self._host_tokens[host] = tokens - n
        return False

    def _send(self, addr: Addr, data: bytes) -> None:
        self._out.append(Send(addr, data))

    def _log(self, level: str, event: str, **fields: Any) -> None:
        self._out.append(Log(level, event, fields))

    def _timer(self, at: float, kind: int, key: Any) -> None:
        heapq.heappush(self._timers, (at, kind, key))

    def _text_allowed(self, host: str) -> bool:
        """Is ``host`` on ``text_networks``? Those sources may use the text
        protocol and are trusted with every error reply."""
        ok = self._text_ok.get(host)
        if ok is None:
            try:
                ip = ipaddress.ip_address(host)
                ok = any(ip in n for n in self._text_nets)
            except ValueError:
                ok = False
            if len(self._text_ok) > 10000:
                self._text_ok.clear()
            self._text_ok[host] = ok
        return ok

    def _error(self, addr: Addr, exc: WireError, req_len: int, is_text: bool) -> None:
        """Reply with an error, within the amplification budget of the source."""
        self.metrics["errors"] += 1
        self.metrics[f"error_{exc.code.name.lower()}"] += 1
        trusted = self._text_allowed(addr[0])
        if is_text:
            if trusted:  # (within 3x of the datagram too: a text source address may be forged)
                self._send(addr, encode_text_error(exc.code, exc.text)[: min(self._max, AMPLIFICATION * req_len)])
            else:
                self.metrics["dropped_forbidden"] += 1
            return
        # Every source gets only what the anti-amplification budget allows, trusted or not: an
        # address on the text networks can be forged as well as any.
        self._bounded(addr, wire.encode_error(exc.code, exc.text), req_len)

    def _bounded(self, addr: Addr, data: bytes, req_len: float) -> None:
        """Send to an address that has not proven it receives: at most 3x in."""
        if len(data) <= AMPLIFICATION * req_len:
            self._send(addr, data)
        else:
            self.metrics["dropped_amplification"] += 1


def fmt(addr: Addr) -> str:
    """An address as logs show it."""
    return f"{addr[0]}:{addr[1]}"
