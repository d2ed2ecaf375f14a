"""Operator-readable logs: one line per event, the node id in every line.

Format: ``2026-11-22T10:00:00.123Z INFO node=n1 event=client_new client=ab.. addr=..``
(logfmt), so that grep and any log shipper can pick fields out.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any


class _Formatter(logging.Formatter):
    def __init__(self, node_id: str) -> None:
        super().__init__()
        self.node_id = node_id

    def format(self, record: logging.LogRecord) -> str:
        t = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        return f"{t}.{int(record.msecs):03d}Z {record.levelname} node={self.node_id} {record.getMessage()}"


def _value(v: Any) -> str:
    s = str(v)
    if not s or any(c in s for c in ' "=\n'):
        return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    return s


def event_line(event: str, fields: dict[str, Any]) -> str:
    return " ".join([f"event={event}"] + [f"{k}={_value(v)}" for k, v in fields.items() if v is not None])


class EventLog:
    """A thin logfmt front over the stdlib logger of one node."""

    def __init__(self, node_id: str, level: str = "info", stream: Any = None) -> None:
        self.logger = logging.getLogger(f"roost.{node_id}")
        self.logger.handlers.clear()
        handler = logging.StreamHandler(stream or sys.stderr)
        handler.setFormatter(_Formatter(node_id))
        self.logger.addHandler(handler)
        self.logger.setLevel(level.upper())
        self.logger.propagate = False

    def __call__(self, level: str, event: str, **fields: Any) -> None:
        lvl = logging.getLevelName(level.upper())
        if self.logger.isEnabledFor(lvl):
            self.logger.log(lvl, event_line(event, fields))
