"""Durable partition logs in the whole simulated cluster (member cores, peer links, the simulator's
disk with power loss): puts made at the primary of a partition's map, retried go-back-N until a
member acknowledges them, must be in the partition's log exactly once and on both owners."""

from __future__ import annotations

import msgpack

from roost.cluster.events import Tick
from roost.cluster.partitionlog import LEADING
from sim.simulation import Simulation


class Producer:
    """Puts one message per step to partition ``p``, resending what is not acknowledged."""

    def __init__(self, sim: Simulation, p: int, pid: bytes) -> None:
        self.sim, self.p, self.pid = sim, p, pid
        self.next_seq, self.acked = 1, 0

    def step(self) -> None:
        sim = self.sim
        for m in sim.members.values():  # (acknowledgements: the tokens members committed)
            core = m.core
            if core is not None:
                for pid, seq in core.durable.committed:
                    if pid == self.pid:
                        self.acked = max(self.acked, seq)
                core.durable.committed[:] = [t for t in core.durable.committed if t[0] != self.pid]
        if self.next_seq - self.acked <= 20:
            self.next_seq += 1
        first, last = self.acked + 1, self.next_seq - 1
        if first > last:
            return
        msgs = [[f"d{self.p}", None, None, f"{seq}".encode()] for seq in range(first, last + 1)]
        for m in sim.members.values():  # (to whoever leads it in its own view)
            core = m.core
            if core is not None and core.ready and core.cmap is not None and core.cmap.owners[self.p][:1] == (m.id,):
                token = lambda last: (self.pid, last)  # noqa: E731
                core.durable.put(self.p, msgs, self.pid, first, first, token, 5000, sim.now, True)
                sim.feed(m, Tick())  # (the core's actions go out)


def run(sim: Simulation, producers: list[Producer], until: float, step: float = 0.05) -> None:
    t = sim.now
    while t < until:
        for pr in producers:
            pr.step()
        t += step
        assert sim.run_until(t)


def log_payloads(sim: Simulation, member: str, p: int, pid: bytes) -> list[int]:
    log = sim.logdisk.logs.get(member, {}).get(p)
    if log is None:
        return []
    out = []
    for r in log.records:
        b = msgpack.unpackb(r.body, raw=False)
        if b[1] == 0 and b[6] == pid:
            out.append(b[7])
    return out


def test_puts_are_committed_on_both_owners_and_survive_the_primary_crashing() -> None:
    # (its own producer, not the campaign's durable workload: sim/durable.py)
    sim = Simulation(3, members=3, clients=2, faults=(), mode="partitioned", fault_time=2.0, quiet=1.0, durable=False)
    assert sim.run_until(2.0)
    m0 = sim.members["m0"].core
    assert m0 is not None and m0.cmap is not None
    p = 0
    owners = list(m0.cmap.owners[p])
    pr = Producer(sim, p, b"P" * 16)
    run(sim, [pr], 4.0)
    assert pr.acked > 20
    for m in owners:  # (both owners hold every acknowledged put, once, in order)
        got = log_payloads(sim, m, p, pr.pid)
        assert got[: pr.acked] == list(range(1, pr.acked + 1)), m
    acked_before = pr.acked
    sim.crash(owners[0])  # (a power loss: its unsynced writes are gone)
    run(sim, [pr], 8.0)
    assert pr.acked > acked_before + 20
    new_primary = next(m.core for m in sim.members.values()
                       if m.core is not None and p in m.core.plogs and m.core.plogs[p].role == LEADING)  # fmt: skip
    got = log_payloads(sim, new_primary.id, p, pr.pid)
    assert got[: pr.acked] == list(range(1, pr.acked + 1))  # nothing acknowledged lost, nothing twice
    sim.restart(owners[0])
    run(sim, [pr], 12.0)
    back = log_payloads(sim, owners[0], p, pr.pid)
    assert back[: pr.acked] == list(range(1, pr.acked + 1))  # the restarted owner caught up
