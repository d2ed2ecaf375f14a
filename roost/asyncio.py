"""The Roost client for asyncio: ``from roost.asyncio import Client`` (client/aio.py)."""

from roost.client import aio as _shell
from roost.client.aio import *  # noqa: F403  (the shell's own __all__: one list per shell)

__all__ = _shell.__all__
