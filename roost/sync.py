"""The Roost client for plain threads: ``from roost.sync import Client`` (client/blocking.py)."""

from roost.client import blocking as _shell
from roost.client.blocking import *  # noqa: F403  (the shell's own __all__: one list per shell)

__all__ = _shell.__all__
