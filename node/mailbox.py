"""Per-subscriber reliable mailbox (Ray's SubscriberState mailbox, with a window).

Messages get consecutive sequence numbers within a *stream*; a new stream
(a fresh id, sequences from 1 again) starts whenever the node discards what
it had for the subscriber, so the client can tell a restart from a gap. A
message leaves the mailbox only when the client acknowledges it cumulatively
(``max_processed_seq``, as in Ray). Up to ``window`` messages are in flight;
the rest wait, and so do those past ``window_bytes`` of messages in flight (a window
counted in messages alone would let 8 KB messages overrun the subscriber's socket buffer many
times over, and every loss costs a resend). Lost datagrams are repaired two ways: selective ACK ranges let
the node resend the holes at once (fast retransmit), and a retransmission
timeout with exponential back-off resends everything unacknowledged.

The mailbox is bounded: ``push`` refuses beyond ``capacity`` so that one slow
subscriber costs the node bounded memory and never slows anybody else
(Tendermint ADR 033); the broker then cancels with ``out_of_capacity``.
"""

from __future__ import annotations

from bisect import bisect_right
from itertools import accumulate


class Mailbox:
    __slots__ = (
        "stream_id", "acked", "buf", "base", "sent", "sacked", "capacity",
        "rto_base", "rto_max", "rto", "rto_at", "fast_ok_at", "armed", "nbytes", "max_bytes", "queued", "sack_run",
        "inflight",
    )  # fmt: skip

    def __init__(self, stream_id: int, capacity: int, rto: float, rto_max: float, max_bytes: int = 1 << 62) -> None:
        self.stream_id = stream_id
        self.capacity = capacity
        self.max_bytes = max_bytes
        self.nbytes = 0  # bytes of unacknowledged messages held
        self.inflight = 0  # bytes of them sent (sequences acked + 1 .. sent)
        self.armed = False  # a timer entry for rto_at (or earlier) is pending
        self.rto_base = rto
        self.rto_max = rto_max
        self.acked = 0  # highest cumulatively acknowledged sequence
        self.buf: list[bytes] = []  # buf[base + i] holds sequence acked + 1 + i
        self.base = 0
        self.sent = 0  # highest sequence sent at least once
        self.sacked: set[int] = set()
        self.rto = rto
        self.rto_at: float | None = None
        self.fast_ok_at = 0.0
        self.queued = False  # it was given a queue group's message (node/delivery.py, _requeue)
        # Every sequence from acked + 1 through this one is SACKed: a client that holds a queue
        # group's messages untaken SACKs the same long run in each ACK, and only what is new
        # in it costs anything
        self.sack_run = 0

    def __len__(self) -> int:
        return len(self.buf) - self.base

    def push(self, packed: bytes) -> bool:
        if len(self.buf) - self.base >= self.capacity or self.nbytes + len(packed) > self.max_bytes:
            return False
        self.buf.append(packed)
        self.nbytes += len(packed)
        return True

    def fits(self, count: int, size: int) -> bool:
        """Room for ``count`` more messages of ``size`` bytes in all (``push`` of each would hold)."""
        return len(self.buf) - self.base + count <= self.capacity and self.nbytes + size <= self.max_bytes

    def push_many(self, packed: list[bytes], size: int) -> None:
        """``push`` of each of ``packed`` (``size`` bytes in all), which ``fits``: one call for a
        run of one publisher's datagram."""
        self.buf += packed
        self.nbytes += size

    def take_new(self, window: int, now: float, window_bytes: int = 1 << 62) -> tuple[int, list[bytes]]:
        """Messages never sent before that the window allows (``window`` messages and
        ``window_bytes`` bytes in flight; one at least when none is), and their first seq."""
        first = self.sent + 1
        limit = self.acked + window
        last = min(limit, self.acked + len(self))
        if last < first:
            return first, []
        i = self.base + (first - self.acked - 1)
        out = self.buf[i : i + (last - first + 1)]
        ends = list(accumulate(map(len, out)))
        room = window_bytes - self.inflight
        # (not while the client SACKs: what it SACKed has left its socket buffer, and a queue
        # group's member SACKs the fragments of a large message it holds until all came; counting
        # them would leave it waiting for ever for the rest)
        if ends[-1] > room and not self.sacked and self.sack_run <= self.acked:
            k = bisect_right(ends, room) or (0 if self.sent > self.acked else 1)
            if not k:
                return first, []
            out = out[:k]
            last = first + k - 1
        self.inflight += ends[len(out) - 1]
        self.sent = last
        if self.rto_at is None:
            self.rto_at = now + self.rto
        return first, out

    def on_ack(self, max_seq: int, sack: list[tuple[int, int]], now: float) -> bool:
        """Apply an ACK; returns True if the cumulative point advanced."""
        progressed = False
        if max_seq > self.acked:
            max_seq = min(max_seq, self.sent)
            n = max_seq - self.acked
            done = sum(map(len, self.buf[self.base : self.base + n]))
            self.nbytes -= done
            self.inflight -= done
            self.base += n
            self.acked = max_seq
            if self.base > 4096 and self.base * 2 > len(self.buf):
                del self.buf[: self.base]
                self.base = 0
            if self.sacked:
                self.sacked = {s for s in self.sacked if s > max_seq}
            progressed = n > 0
        if sack:
            # Merge the ranges first: overlapping or repeated ranges must not
            # multiply the work (an ACK could otherwise cost milliseconds).
            top = self.acked
            run = max(self.sack_run, self.acked)
            for lo, hi in sorted(sack):
                if lo <= run + 1:
                    lo = max(lo, run + 1)  # (what the run covers is SACKed already)
                lo = max(lo, top + 1)
                hi = min(hi, self.sent)
                if lo <= hi:
                    self.sacked.update(range(lo, hi + 1))
                    top = hi
                    if lo <= run + 1:
                        run = hi
            self.sack_run = run
        if progressed:
            self.rto = self.rto_base
            self.rto_at = now + self.rto if self.sent > self.acked else None
        return progressed

    def runs(self, upto: int) -> list[tuple[int, list[bytes]]]:
        """Unacknowledged, un-SACKed messages up to ``upto`` as contiguous runs."""
        out: list[tuple[int, list[bytes]]] = []
        seq = self.acked + 1
        sacked = self.sacked
        while seq <= upto:
            if seq in sacked:
                seq += 1
                continue
            start = seq
            while seq <= upto and seq not in sacked:
                seq += 1
            i = self.base + (start - self.acked - 1)
            out.append((start, self.buf[i : i + (seq - start)]))
        return out

    def fast_retransmit(self, now: float) -> list[tuple[int, list[bytes]]]:
        """Holes below the highest SACKed sequence, at most once per rto/2."""
        if not self.sacked or now < self.fast_ok_at:
            return []
        self.fast_ok_at = now + self.rto / 2
        return self.runs(max(self.sacked))

    def on_timeout(self, now: float) -> list[tuple[int, list[bytes]]]:
        """The retransmission timer fired: resend all in flight, back off."""
        if self.sent <= self.acked:
            self.rto_at = None
            return []
        self.rto = min(self.rto * 2, self.rto_max)
        self.rto_at = now + self.rto
        return self.runs(self.sent)
