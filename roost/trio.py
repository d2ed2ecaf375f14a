"""The Roost client for trio (also ``from roost import Client``): client/library.py."""

from roost.client import library as _shell
from roost.client.library import *  # noqa: F403  (the shell's own __all__: one list per shell)

__all__ = _shell.__all__
