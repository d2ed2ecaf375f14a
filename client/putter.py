"""Durable publishes (PUT) of one client, sans-IO: a stream per partition, go-back-N, one producer id.

Theory of operation (docs/durable.md). A durable message goes to the log of
its topic's partition, kept by the partition's owners; the primary stores a
producer's messages in a partition in the order of their sequences and refuses
a gap, so the client numbers its puts per partition (``PutStream``) and resends
from the first unacknowledged one: on a retry time-out, on a refusal, and when
the partition's primary changes. Every session of the client sends under the
same producer id, so the new primary (whose log has the old one's records)
stores a resent message once and acknowledges it again.

``frames`` packs what is due for one partition into PUT datagrams for the
session of its primary; ``on_putack`` takes the cumulative acknowledgement.
"""

from __future__ import annotations

import math
from collections import deque

from roost.client import durablewire, wire
from roost.client.config import ClientConfig

# what a refusal (PUTACK status) means, for the errors a user sees when a put is not acknowledged
REFUSALS = {
    durablewire.PUT_NOT_LEADER: "the member asked does not lead the partition (the leader is changing)",
    durablewire.PUT_BUSY: "the partition cannot commit now (fewer in-sync replicas than min_insync, or busy)",
    durablewire.PUT_GAP: "the leader is missing an earlier put of this producer",
    durablewire.PUT_NO_QUORUM: "the member cannot reach the majority of the metadata quorum (it is cut off)",
}


class PutStream:
    __slots__ = ("next_seq", "acked", "unacked", "unsent_from", "retry_at", "rto", "refused", "moved_at")

    def __init__(self, rto: float) -> None:
        self.next_seq = 1
        self.acked = 0
        self.unacked: deque[tuple[int, bytes]] = deque()  # (sequence, packed message)
        self.unsent_from = 1
        self.retry_at = math.inf
        self.rto = rto
        self.refused = 0  # the status of the last refusal since the last progress (0: none)
        self.moved_at = -math.inf  # when a change of primary last sent everything again (``moved``)


class Putter:
    def __init__(self, producer_id: bytes, config: ClientConfig) -> None:
        self.pid = producer_id
        self.cfg = config
        self.streams: dict[int, PutStream] = {}

    def put(self, p: int, packed: bytes) -> int:
        """Queue a packed message for partition ``p``; returns its sequence there."""
        st = self.streams.get(p)
        if st is None:
            st = self.streams[p] = PutStream(self.cfg.pub_retry)
        seq = st.next_seq
        st.next_seq += 1
        st.unacked.append((seq, packed))
        return seq

    def window_full(self, p: int) -> bool:
        st = self.streams.get(p)
        return st is not None and len(st.unacked) >= self.cfg.pub_window

    def due(self, p: int, now: float) -> bool:
        st = self.streams[p]
        return bool(st.unacked) and (st.unsent_from < st.next_seq or now >= st.retry_at)

    def timed_out(self, p: int, now: float) -> bool:
        """Whether partition ``p``'s unacknowledged puts are due again because their retry time-out passed."""
        st = self.streams[p]
        return bool(st.unacked) and now >= st.retry_at

    def frames(self, p: int, cid: bytes, cookie: bytes, max_datagram: int, now: float) -> list[bytes]:
        """PUT datagrams of what is due for partition ``p``: the unsent part, or everything
        unacknowledged once the retry time-out passed (go-back-N)."""
        st = self.streams[p]
        if not st.unacked:
            return []
        if now >= st.retry_at:
            st.unsent_from = st.unacked[0][0]
            st.rto = min(st.rto * 2, self.cfg.pub_retry_max)
        out: list[bytes] = []
        batch: list[bytes] = []
        size, first = 0, st.unsent_from
        floor = st.acked + 1
        budget = max_datagram - wire.FRAME_OVERHEAD - 2 * wire.ID_LEN - wire.COOKIE_LEN  # (PUT's header: as PUB's)
        for seq, packed in st.unacked:
            if seq < st.unsent_from:
                continue
            if batch and size + len(packed) > budget:
                out.append(durablewire.encode_put(cid, cookie, self.pid, p, first, floor, batch))
                batch, size, first = [], 0, seq
            batch.append(packed)
            size += len(packed)
        if batch:
            out.append(durablewire.encode_put(cid, cookie, self.pid, p, first, floor, batch))
        st.unsent_from = st.next_seq
        st.retry_at = now + st.rto
        return out

    def on_putack(self, pid: bytes, p: int, acked: int, status: int, now: float) -> bool:
        """Take a PUTACK; True if it acknowledged something new."""
        st = self.streams.get(p)
        if pid != self.pid or st is None:
            return False
        if status != durablewire.PUT_OK:  # (not the leader, busy or a gap: resend from the acknowledged point soon)
            st.retry_at = min(st.retry_at, now + self.cfg.pub_retry)
            st.refused = status
            return False
        acked = min(acked, st.next_seq - 1)
        if acked <= st.acked:
            return False
        st.acked = acked
        st.refused = 0
        while st.unacked and st.unacked[0][0] <= acked:
            st.unacked.popleft()
        st.unsent_from = max(st.unsent_from, acked + 1)
        st.rto = self.cfg.pub_retry
        st.retry_at = now + st.rto if st.unacked else math.inf
        return True

    def moved(self, p: int, now: float) -> None:
        """The partition's primary changed: send everything unacknowledged to the new one, at once
        unless a change did so less than ``pub_retry`` ago (maps that disagree, each adopted in
        turn, must not resend the window at round-trip rate): then at the retry time-out."""
        st = self.streams.get(p)
        if st is not None and st.unacked:
            if now >= st.moved_at + self.cfg.pub_retry:
                st.moved_at = now
                st.unsent_from = st.unacked[0][0]
            else:
                st.retry_at = min(st.retry_at, st.moved_at + self.cfg.pub_retry)

    def hold(self, p: int, until: float) -> None:
        """Partition ``p``'s puts are due but have nowhere to go yet (no live owner, or the session of
        its primary not connected): everything unacknowledged goes once they have, and the retry
        time-out, if it has passed, waits until ``until``: a shell that sleeps until
        ``next_deadline`` would otherwise wake at once, again and again (simulator seed 4)."""
        st = self.streams[p]
        if st.unacked:
            st.unsent_from = st.unacked[0][0]
            # (never sent, its retry time-out is not set: the pump must come back all the same)
            st.retry_at = until if st.retry_at == math.inf else max(st.retry_at, until)

    def refusal(self, p: int | None = None) -> str:
        """Why partition ``p``'s puts (every partition's, if None) were last refused, as a clause for
        an error message ("" if they were not)."""
        streams = self.streams.values() if p is None else [self.streams[p]] if p in self.streams else []
        why = sorted({REFUSALS.get(st.refused, f"status {st.refused}") for st in streams if st.refused and st.unacked})
        return f": last refused because {'; '.join(why)}" if why else ""

    def marks(self) -> dict[int, int]:
        return {p: st.next_seq - 1 for p, st in self.streams.items()}

    def flushed(self, marks: dict[int, int]) -> bool:
        return all(self.streams[p].acked >= seq for p, seq in marks.items())

    def next_deadline(self) -> float:
        return min((st.retry_at for st in self.streams.values() if st.unacked), default=math.inf)
