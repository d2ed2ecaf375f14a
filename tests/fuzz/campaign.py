"""Running a target: hypothesis draws each example (its setup, a few values of its own, and the
plans), the target's rig feeds them and checks, and a ``Tally`` counts what was fed.

``run`` is what both tests/test_fuzz.py (a bounded campaign, derandomized: the same examples on
every run) and scripts/fuzz.py (rounds with fresh seeds until a number of frames) call.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import hypothesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.fuzz.mutate import FREE, Plan, plans
from tests.fuzz.target_client import ClientRig
from tests.fuzz.target_config import ConfigRig
from tests.fuzz.target_member import MODES, MemberRig
from tests.fuzz.target_node import VARIANTS, NodeRig

#: The setups each target draws from (a node core's variant, a member's mode).
SETUPS: dict[str, tuple[str, ...]] = {"node": VARIANTS, "member": MODES, "client": ("router",), "config": ("toml",)}
#: Plans per example: hypothesis draws about (min + max) / 2.
MIN_PLANS, MAX_PLANS = 100, 300


class Rig(Protocol):
    frames: int
    mutated: int
    trace: Any

    def step(self, plan: Plan) -> None: ...

    def finish(self) -> bool: ...


@dataclass
class Tally:
    """What a campaign fed: examples, mutated frames (at most one per plan, the acceptance counts
    these: its bytes changed, and the core's decoding entry point took it; the package docstring
    says more), all frames (with the legitimate ones between), examples whose legitimate client
    was served."""

    examples: int = 0
    mutated: int = 0
    frames: int = 0
    served: int = 0
    seconds: float = 0.0
    per_target: dict[str, int] = field(default_factory=dict)

    def add(self, target: str, rig: Rig, served: bool) -> None:
        self.examples += 1
        self.mutated += rig.mutated
        self.frames += rig.frames
        self.served += served
        self.per_target[target] = self.per_target.get(target, 0) + rig.mutated

    def line(self) -> str:
        rate = self.mutated / self.seconds if self.seconds else 0.0
        return (f"{self.examples:,} examples, {self.mutated:,} mutated frames ({self.frames:,} with the legitimate "
                f"ones), {rate:,.0f} mutated frames/s, a legitimate client served after {self.served:,}")  # fmt: skip


@contextmanager
def no_local_constants() -> Iterator[None]:
    """Hypothesis draws about one value in twenty from a pool of constants, and that pool takes in
    the literals of every "local" module in ``sys.modules`` (hypothesis 6.170:
    ``internal/conjecture/providers.py``, ``_get_local_constants``: any module outside
    site-packages and the standard library, tests/ aside). So one seed drew other frames depending
    on what else had been imported (node-single fed 23,635 frames from a plain script, 19,891
    after ``import attack``, 20,947 when pytest collected all of tests/), and a failure seen under
    xdist might not replay with ``scripts/fuzz.py --replay``. No setting turns that source off, so
    for the campaign's duration it yields nothing (and the cache of what it yielded is emptied on
    the way in and out: other tests in the process get theirs back). Hypothesis's own constants
    (its fixed list of boundary values) still come, the same every run. tests/test_fuzz.py checks
    that a run's tally does not change when a module full of constants is imported; if hypothesis
    renames these, that test fails and this needs following."""
    try:
        from hypothesis.internal.conjecture import providers
        from hypothesis.internal.constants_ast import Constants
    except ImportError:  # (a hypothesis without them: nothing to turn off)
        yield
        return
    get, cache = getattr(providers, "_get_local_constants", None), getattr(providers, "CONSTANTS_CACHE", None)
    if get is None or cache is None:
        yield
        return
    empty = Constants()
    cache.cache.clear()
    providers._get_local_constants = lambda: empty
    try:
        yield
    finally:
        providers._get_local_constants = get
        cache.cache.clear()


def make_rig(target: str, setup: str, free: list[Any], tmp: Path) -> Rig:
    if target == "node":
        return NodeRig(setup, free)
    if target == "member":
        return MemberRig(setup, free)
    if target == "client":
        return ClientRig(free)
    return ConfigRig(tmp, free)


def run(target: str, examples: int, tally: Tally, *, setups: tuple[str, ...] | None = None,
        seed: int | None = None, shrink: bool = True) -> None:  # fmt: skip
    """``examples`` examples of ``target``; raises what the first failing one raised (shrunk, the
    frames that led to it in its notes). ``seed`` None: a fixed seed of the target and setups (the
    same examples each run; one of their own for each, where ``derandomize`` would give every setup
    the same plans)."""
    # (config files: on tmpfs where there is one; an open on this VM's disk costs about a millisecond)
    tmp = Path(tempfile.mkdtemp(prefix="roost-fuzz-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    setups = setups or SETUPS[target]
    if seed is None:
        seed = zlib.crc32(f"{target}/{'/'.join(setups)}".encode())

    @settings(max_examples=examples, deadline=None, database=None,
              phases=(Phase.generate, Phase.shrink) if shrink else (Phase.generate,),
              suppress_health_check=list(HealthCheck), report_multiple_bugs=False)  # fmt: skip
    @given(st.sampled_from(setups), FREE, plans(MIN_PLANS, MAX_PLANS))
    def example(setup: str, free: list[Any], ps: list[Plan]) -> None:
        rig = make_rig(target, setup, free, tmp)
        try:
            for p in ps:
                rig.step(p)
            served = rig.finish()
        except Exception as exc:
            exc.add_note(f"{target} ({setup}), the last steps:\n  " + "\n  ".join(map(str, rig.trace)))
            raise
        tally.add(target, rig, served)

    example = hypothesis.seed(seed)(example)
    start = time.perf_counter()
    try:
        with no_local_constants():
            example()
    finally:
        tally.seconds += time.perf_counter() - start
        shutil.rmtree(tmp, ignore_errors=True)
