"""The member's peer-frame dispatch (cluster/peerframes.py) and dialling (cluster/dialling.py),
directly on a member core of a simulated cluster: what each frame asks of the member comes back
as a value, and a peer's dial schedule follows its link."""

from __future__ import annotations

import math

import pytest

from roost.cluster import peerframes
from roost.cluster.events import SendFrame
from roost.cluster.member import MemberCore
from roost.cluster.peerwire import PeerProtocolError, PeerType, encode
from sim.simulation import Simulation


def _core(mode: str = "partitioned") -> tuple[Simulation, MemberCore]:
    sim = Simulation(3, members=3, clients=2, faults=(), fault_time=2.0, quiet=1.0, mode=mode)
    assert sim.run_until(3.0)
    core = sim.members["m0"].core
    assert core is not None and core.ready
    return sim, core


def test_a_push_is_merged_and_acknowledged_with_nothing_more_for_the_member():
    sim, core = _core()
    inbound = next(x for x in core.links.values() if not x.outbound and x.peer == "m1" and x.up)
    core._out.clear()
    then = core.frames.request(inbound, [PeerType.PUSH, 7, []], sim.now, core.phase)
    assert then == peerframes.NOTHING
    assert [a.data for a in core._out if isinstance(a, SendFrame)] == [encode([PeerType.PUSHACK, 7])]
    assert inbound.deadline == sim.now + core.s.link_idle_timeout


def test_a_heartbeat_with_a_new_state_asks_for_the_map_again():
    sim, core = _core()
    inbound = next(x for x in core.links.values() if not x.outbound and x.peer == "m1" and x.up)
    view = core.membership.peers["m1"]
    state = "syncing" if view.reported == "ready" else "ready"
    f = [PeerType.HEARTBEAT, state, 0, 0, core.own.epoch, core.joins.synced, core.joins.committed]
    then = core.frames.request(inbound, f, sim.now, core.phase)
    assert then[:1] == (peerframes.REMAP,)
    assert encode([PeerType.BEAT]) in [a.data for a in core._out if isinstance(a, SendFrame)]


def test_a_reply_proves_our_link_alive_and_an_unexpected_one_is_refused():
    sim, core = _core()
    lid = core.out["m1"]
    assert lid is not None
    link = core.links[lid]
    assert core.frames.reply(link, [PeerType.BEAT], sim.now + 1, core.phase) == peerframes.NOTHING
    assert link.deadline == sim.now + 1 + core.s.down_after
    with pytest.raises(PeerProtocolError):
        core.frames.reply(link, [PeerType.DUMPEND, 0], sim.now, core.phase)  # (no PULL of ours on it)
    assert core.frames.refused(link, PeerProtocolError("bad")) == "bad"


def test_a_dropped_link_is_dialled_again_after_reconnect_interval_and_logged_once():
    sim, core = _core("replicated")
    d = core.dialling
    d.dropped("m1", True, False, "reset", sim.now)
    assert d.next_dial["m1"] == sim.now + core.s.reconnect_interval and d.was_up["m1"] is False
    core._out.clear()
    d.dropped("m1", False, False, "refused", sim.now)  # (still out of reach: no second link_down)
    assert not [a for a in core._out if getattr(a, "event", None) == "link_down"]


def test_a_departed_peer_is_dialled_only_until_it_can_have_stopped():
    sim, core = _core("replicated")
    d = core.dialling
    d.dropped("m2", False, True, "refused", sim.now)
    until = d.redial_gone["m2"]
    assert until == sim.now + core.s.leave_timeout + core.s.stop_timeout and d.next_dial["m2"] < math.inf
    d.dropped("m2", False, True, "refused", until)
    assert d.next_dial["m2"] == math.inf


@pytest.mark.parametrize("phase", ["syncing", "ready"])
def test_a_leaver_that_dials_us_is_dialled_back_even_while_we_sync(phase):
    """Simulator seeds 7615, 9384 (--mode partitioned): a member restarted after a leave knows
    the leaver as gone and never dials it; the leaver dialled it while it synced, and that link
    stayed up, so a dial back only once ready never came. The leaver heard no heartbeat of it
    again, kept a map without it, and forwarded its publishes to a member that refused them
    for ever (its publisher's PUBACKs withheld: stalled)."""
    sim, core = _core()
    inbound = next(x for x in core.links.values() if not x.outbound and x.peer == "m1" and x.up)
    core.maps.roster.propose_leave("m1")  # (its leave committed here: out of the placed members)
    core.maps.placed = core.maps.roster.members()
    assert core.maps.gone("m1")
    core.lt.out["m1"] = None  # (a restarted member never dials a member that left)
    core.dialling.next_dial["m1"] = math.inf
    core.frames._up(inbound, sim.now, phase)  # (the leaver's link to us comes up)
    assert core.dialling.next_dial["m1"] == sim.now
