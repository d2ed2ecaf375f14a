"""The cyclic collector in a node process: long-lived state out of its sight.

A node's state (producers, subscriptions, the filter index, client records) is many small
objects that live long and are freed by reference counting: it holds no cycles by design. But
CPython 3.11's collector scans every object the program ever kept at each full (generation 2)
collection, which runs whenever what survived grew by a quarter: a node that a crowd of
strangers filled with 100,000 producers and 20,000 kilobyte filters paused 100-360 ms each
time (scripts/attack.py exhaust, its node timed by a gc.callbacks hook, 2026-11-28), and a
round trip that meets such a pause is that late.

So every object that survived a full collection is frozen (``gc.freeze``: moved to the
permanent generation, never scanned again) right after it. A full collection then scans only
what came since the last one, and its cost follows the state's growth, not its size.

The price: a cycle alive at a full collection that dies later (a trio task, an HTTP
connection, a peer link) stays frozen. The node's own state makes none, and what dies young
dies in the younger generations, which run as before, but some do (a review counted 462 such
objects after a churn of monitor and client connections). So once an hour (``THAW_AFTER``)
everything is thawed, and the next full collection scans it all and frees them: one long pass
an hour instead of one at every quarter of growth.
"""

from __future__ import annotations

import gc
import time
from typing import Any

THAW_AFTER = 3600.0  # seconds between thaws
_thawed = [time.monotonic()]


def _after(phase: str, info: dict[str, Any]) -> None:
    if phase == "stop" and info["generation"] == 2:
        now = time.monotonic()
        if now - _thawed[0] >= THAW_AFTER:
            _thawed[0] = now
            gc.unfreeze()  # (the next full collection sees everything, frees the frozen cycles)
        else:
            gc.freeze()


def freeze_survivors() -> None:
    """Freeze what start-up left, then what survives each full collection (idempotent)."""
    gc.collect()
    gc.freeze()
    if _after not in gc.callbacks:
        gc.callbacks.append(_after)
