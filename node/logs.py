"""Operator-readable logs: one line per event, the node id in every line.

Format (``[node] log_format``): ``logfmt``, the default,
``2026-11-22T10:00:00.123Z INFO node=n1 event=client_new client=ab.. addr=..``, so that grep and
any log shipper can pick fields out; or ``json``, one object per line with the same fields
(``{"ts": "...", "level": "info", "node": "n1", "event": "client_new", "client": "ab..", ...}``)
for shippers that want JSON. Lines go to stderr; rotation is left to the platform.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any


def _timestamp(record: logging.LogRecord) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"


class _Formatter(logging.Formatter):
    def __init__(self, node_id: str) -> None:
        super().__init__()
        self.node_id = node_id

    def format(self, record: logging.LogRecord) -> str:
        return f"{_timestamp(record)} {record.levelname} node={self.node_id} {record.getMessage()}"


class _JsonFormatter(logging.Formatter):
    def __init__(self, node_id: str) -> None:
        super().__init__()
        self.node_id = node_id

    def format(self, record: logging.LogRecord) -> str:
        event, fields = record.args  # type: ignore[misc]  # (set by EventLog: (event, fields))
        assert isinstance(fields, dict)
        line = {"ts": _timestamp(record), "level": record.levelname.lower(), "node": self.node_id, "event": event}
        line.update((k, v if v.__class__ in (int, float, bool, str) else str(v))
                    for k, v in fields.items() if v is not None and k not in line)  # fmt: skip
        return json.dumps(line, separators=(",", ":"))


def _value(v: Any) -> str:
    s = str(v)
    if not s or any(c in s for c in ' "=\n'):
        return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    return s


def event_line(event: str, fields: dict[str, Any]) -> str:
    return " ".join([f"event={event}"] + [f"{k}={_value(v)}" for k, v in fields.items() if v is not None])


class EventLog:
    """A thin logfmt (or JSON lines) front over the stdlib logger of one node."""

    def __init__(self, node_id: str, level: str = "info", stream: Any = None, fmt: str = "logfmt") -> None:
        self.logger = logging.getLogger(f"roost.{node_id}")
        self.logger.handlers.clear()
        handler = logging.StreamHandler(stream or sys.stderr)
        self.json = fmt == "json"
        handler.setFormatter(_JsonFormatter(node_id) if self.json else _Formatter(node_id))
        self.logger.addHandler(handler)
        self.logger.setLevel(level.upper())
        self.logger.propagate = False

    def __call__(self, level: str, event: str, **fields: Any) -> None:
        lvl = logging.getLevelName(level.upper())
        if self.logger.isEnabledFor(lvl):
            if self.json:
                self.logger.log(lvl, "%s", event, fields)  # (the formatter takes both from args)
            else:
                self.logger.log(lvl, event_line(event, fields))
