"""The user-space delay of scripts/faults.py: a process bound to one NFQUEUE that holds each
packet ``ms`` +- ``jitter`` before accepting it (tc netem does not exist on this kernel; see
../shared/ENVIRONMENT.md). Run as its own process, since a busy caller distorts the delays.

    python scripts/delayqueue.py QNUM MS JITTER_MS [SEED]     (started by FaultTable.delay)
"""

from __future__ import annotations

import heapq
import itertools
import os
import random
import select
import signal
import subprocess
import sys
import time
from types import FrameType
from typing import Any

MAX_HELD = 100_000  # packets a delay handler holds at most; beyond, they pass at once


class DelayHandler:
    """Holds each queued packet ``ms`` +- ``jitter_ms`` (uniform), then accepts it.

    Runs in a process of its own (``faults.py _delay-handler``), not a thread
    of the caller: sharing the GIL with a busy driver delayed packets by
    hundreds of ms more than asked. Packets are released in due-time order,
    so jitter reorders them. On SIGTERM/SIGINT, or when its parent dies, it
    accepts everything it holds before exiting (a queue that closes drops what
    it holds), so healing never loses a packet.
    """

    def __init__(self, qnum: int, ms: float, jitter_ms: float, seed: int | None) -> None:
        import netfilterqueue

        self.ms, self.jitter = ms, jitter_ms
        self.rng = random.Random(seed)
        self.held: list[tuple[float, int, Any]] = []
        self.seq = itertools.count()
        self.halt = False
        self.nfq = netfilterqueue.NetfilterQueue()
        self.nfq.bind(qnum, self._queued, max_len=65536, mode=netfilterqueue.COPY_META)

    def _queued(self, pkt: Any) -> None:
        if len(self.held) >= MAX_HELD:
            pkt.accept()
            return
        hold = max(0.0, self.rng.uniform(self.ms - self.jitter, self.ms + self.jitter)) / 1000
        heapq.heappush(self.held, (time.monotonic() + hold, next(self.seq), pkt))

    def _stop(self, signum: int, frame: FrameType | None) -> None:
        self.halt = True

    def run(self, parent: int) -> None:
        """Until SIGTERM/SIGINT or the parent's death (checked every 50 ms at most)."""
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        fd = self.nfq.get_fd()
        print("ready", flush=True)
        try:
            while not self.halt and os.getppid() == parent:
                wait = 0.05 if not self.held else min(0.05, max(0.0, self.held[0][0] - time.monotonic()))
                try:
                    readable, _, _ = select.select([fd], [], [], wait)
                except InterruptedError:
                    continue
                if readable:
                    self.nfq.run(block=False)
                self._release(time.monotonic())
        finally:
            self._release(float("inf"))
            self.nfq.unbind()

    def _release(self, until: float) -> None:
        while self.held and self.held[0][0] <= until:
            heapq.heappop(self.held)[2].accept()


def start_handler(qnum: int, ms: float, jitter_ms: float, seed: int | None) -> subprocess.Popen[str]:
    """Start a delay handler process; return once its queue is bound (or raise with its error)."""
    cmd = [sys.executable, os.path.abspath(__file__), str(qnum), str(ms), str(jitter_ms),
           str(seed if seed is not None else "")]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    ready, _, _ = select.select([proc.stdout], [], [], 10.0)
    line = proc.stdout.readline() if ready else ""
    if line.strip() != "ready":
        proc.kill()
        err = proc.communicate(timeout=5)[1].strip()
        raise RuntimeError(f"delay handler did not start: {err or 'no answer in 10 s'}")
    return proc


def stop_handler(proc: subprocess.Popen[str]) -> None:
    """SIGTERM (the handler releases what it holds), SIGKILL after 5 s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                print(f"faults: delay handler {proc.pid} did not exit after SIGKILL", file=sys.stderr)
    for f in (proc.stdout, proc.stderr):
        if f is not None:
            f.close()


if __name__ == "__main__":
    qnum, ms, jitter, seed = [*sys.argv[1:], ""][:4]
    DelayHandler(int(qnum), float(ms), float(jitter), int(seed) if seed else None).run(os.getppid())
