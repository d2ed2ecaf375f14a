"""client/turns.py alone, with fake time: the decisions both async shells take from it (the
quiet path and its bursts, the sparse path, held sends)."""

from __future__ import annotations

import math

from roost.client.session import ClientConfig
from roost.client.turns import CALLER, LOOP, WAITER, TurnPolicy
from tests.test_router import router

GAP = 0.01


def policy(**config) -> TurnPolicy:
    return TurnPolicy(ClientConfig(**{"idle_gap": GAP, **config}))


def caller_turns(t: TurnPolicy, r, times: list[float]) -> list[bool]:
    """``turn_here`` at each time, and each turn made sends (as a shell's does: the path is busy)."""
    out = []
    for now in times:
        out.append(t.turn_here(r, now))
        if out[-1]:
            t.turned(0, now, CALLER)
    return out


def test_a_quiet_path_gives_a_burst_of_turns_each_within_idle_gap_of_the_last():
    t, r = policy(idle_burst=3), router()
    assert caller_turns(t, r, [1.0 + i * GAP / 2 for i in range(4)]) == [True, True, True, False]  # (spent)
    assert caller_turns(t, r, [2.0, 2.0 + GAP / 2]) == [True, True]  # (quiet again: a new burst)


def test_a_busy_path_makes_no_turn_here_and_a_burst_ends_when_its_last_turn_is_idle_gap_old():
    t, r = policy(idle_burst=4), router()
    t.turned(1, 1.0)  # (a datagram came)
    assert not t.turn_here(r, 1.0 + GAP / 2)  # (busy, and no burst under way)
    assert t.turn_here(r, 2.0)
    t.turned(1, 2.0 + GAP)  # (other traffic keeps the path busy ...)
    assert not t.turn_here(r, 2.0 + 1.5 * GAP)  # (... but the burst's last turn is idle_gap old)


def test_no_turn_here_with_more_reliable_publishes_in_flight_than_a_burst():
    t, r = policy(idle_burst=1), router()
    for _ in range(2):
        r.publish("t", None, None, b"x", True)
    assert r.last_seq - r.acked == 2 and not t.turn_here(r, 1.0)
    never = policy(idle_gap=math.inf)
    never.turned(1, 0.5)  # (the connection's turns)
    assert not never.turn_here(router(), 1e9)  # (idle_gap inf: never quiet)


def test_a_long_wait_makes_the_next_one_drive_and_a_short_one_leaves_it_to_the_loop():
    t = policy()
    assert not t.drives()
    t.waited(1.0, 1.0 + GAP)
    assert t.drives()
    t.waited(2.0, 2.0 + GAP / 2)
    assert not t.drives()


def test_a_held_turns_condition_that_raises_holds_nothing_and_turns_are_counted_by_who_made_them():
    def boom() -> bool:
        raise LookupError("the caller's own")

    assert TurnPolicy.holds(boom)() is False and TurnPolicy.holds(lambda: True)() is True
    t = policy()
    t.turned(0, 1.0, CALLER)  # (sent, received nothing)
    t.turned(2, 1.1, WAITER)
    t.turned(1, 1.2)
    assert t.came == {LOOP: 1, CALLER: 0, WAITER: 1} and t.busy_at == 1.2
