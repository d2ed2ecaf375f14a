"""Waiting in tests: for a condition, with a deadline, never for a fixed time.

``wait_until`` polls from plain code (subprocesses, status output, logs);
``eventually`` from a trio test, whose node runs in the same trio run and so
gets to process between two polls.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import trio


def wait_until(cond: Callable[[], object], timeout: float = 15.0, what: str = "condition",
               interval: float = 0.05) -> None:  # fmt: skip
    """Return once ``cond()`` is true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


async def eventually(cond: Callable[[], object], timeout: float = 5.0, what: str = "condition") -> None:
    """Return once ``cond()`` is true; fail after ``timeout`` seconds."""
    with trio.move_on_after(timeout):
        while not cond():
            await trio.sleep(0.001)  # a checkpoint: the in-process node runs
        return
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")
