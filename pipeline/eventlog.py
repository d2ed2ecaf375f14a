"""Reading a run for the checker (pipeline/rules.py): run.json, the event files, and the
validation of every line against docs/eventlog.md. Untrusted input: a bad line is reported
with its file and line number and never stops the reading."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

MODES = ("reliable", "fire")
FAULT_KINDS = frozenset(
    {"kill", "restart", "pause", "resume", "partition", "heal", "loss", "dup", "delay", "join", "leave"}
)


class Sink(Protocol):
    """What read_events feeds (pipeline.checker.Checker)."""

    files: int

    def add(self, e: dict[str, Any]) -> None: ...
    def malformed(self, file: str, line: int, why: str) -> None: ...


_STR: tuple[type, ...] = (str,)
_STR_NULL: tuple[type, ...] = (str, type(None))
_INT: tuple[type, ...] = (int,)
_NUM: tuple[type, ...] = (float, int)

# Per event kind, its fields beyond t/proc/ev and the exact types accepted (type(), so a bool is
# not an int).
FIELDS: dict[str, tuple[tuple[str, tuple[type, ...]], ...]] = {
    "publish": (
        ("pid", _STR),
        ("seq", _INT),
        ("topic", _STR),
        ("key", _STR_NULL),
        ("mode", _STR),
        ("member", _STR_NULL),
    ),
    "puback": (("pid", _STR), ("seq", _INT), ("member", _STR_NULL)),
    "subscribe": (("sub", _STR), ("topic", _STR), ("key", _STR_NULL), ("mode", _STR), ("member", _STR_NULL)),
    "unsubscribe": (("sub", _STR), ("topic", _STR), ("key", _STR_NULL)),
    "cancel": (("sub", _STR), ("topic", _STR), ("key", _STR_NULL), ("reason", _STR)),
    "deliver": (
        ("sub", _STR),
        ("topic", _STR),
        ("key", _STR_NULL),
        ("mode", _STR),
        ("pid", _STR),
        ("seq", _INT),
        ("member", _STR_NULL),
    ),
    "failover": (("client", _STR), ("from", _STR_NULL), ("to", _STR_NULL)),
    "fault": (("fault", _STR), ("target", _STR), ("phase", _STR)),
    "status": (("member", _STR), ("digest", _STR_NULL), ("subscriptions", (int, type(None))), ("state", _STR)),
    # durable mode (pipeline/durablerules.py)
    "put": (("pid", _STR), ("seq", _INT), ("topic", _STR), ("member", _STR_NULL)),
    "putack": (("pid", _STR), ("seq", _INT), ("partition", _INT), ("member", _STR_NULL)),
    "dsubscribe": (("sub", _STR), ("client", _STR), ("durable", _STR), ("topic", _STR), ("start", _STR)),
    "record": (
        ("sub", _STR),
        ("client", _STR),
        ("durable", _STR),
        ("topic", _STR),
        ("partition", _INT),
        ("offset", _INT),
        ("pid", _STR),
        ("seq", _INT),
        ("member", _STR_NULL),
    ),
    "commit": (("sub", _STR), ("client", _STR), ("durable", _STR), ("topic", _STR), ("offset", _INT)),
    "crash": (("sub", _STR), ("client", _STR), ("durable", _STR), ("topic", _STR)),
}
_ENUMS: dict[str, frozenset[str]] = {
    "mode": frozenset(MODES),
    "phase": frozenset({"start", "end"}),
    "fault": FAULT_KINDS,
}
_TYPE_NAMES = {_STR: "a string", _STR_NULL: "a string or null", _INT: "an integer", _NUM: "a number"}
_MISSING = object()
_INT_FIELDS = ("seq", "subscriptions", "partition", "offset")
_INT64 = 1 << 63
_FLOAT_MAX = 1 << 1023  # (an int this large has no float: float() would raise OverflowError)


class InputError(Exception):
    """The run directory cannot be judged at all (exit status 2)."""


def _type_name(v: object) -> str:
    return "null" if v is None else type(v).__name__


def _field_error(ev: str, name: str, v: object, types: tuple[type, ...], allowed: frozenset[str] | None) -> str:
    where = f"{ev}: " if ev else ""
    if v is _MISSING:
        return f"{where}missing field {name!r}"
    if type(v) not in types:
        return f"{where}field {name!r} is {_type_name(v)}, expected {_TYPE_NAMES[types]}"
    return f"{where}field {name!r} is {v!r}, expected one of {', '.join(sorted(allowed or ()))}"


# FIELDS with each field's allowed values, checked in one pass by validate().
_SPECS = {ev: tuple((name, types, _ENUMS.get(name)) for name, types in spec) for ev, spec in FIELDS.items()}


def validate(obj: object) -> str | None:
    """Why `obj` is not an event of docs/eventlog.md, or None when it is one.

    Runs once per line, so it is written for speed: one dict lookup and one exact type test
    (a bool is not an int) per field; the messages are built only for the lines that fail.
    """
    if type(obj) is not dict:
        return f"not a JSON object ({_type_name(obj)})"
    get = obj.get
    t = get("t", _MISSING)
    if type(t) not in _NUM:
        return _field_error("", "t", t, _NUM, None)
    # inf or nan (json.loads accepts Infinity and NaN), or an integer too large for a float
    if t - t != 0 or (type(t) is int and not -_FLOAT_MAX < t < _FLOAT_MAX):
        return "field 't' is not finite"
    proc = get("proc", _MISSING)
    if type(proc) is not str:
        return _field_error("", "proc", proc, _STR, None)
    ev = get("ev", _MISSING)
    if type(ev) is not str:
        return _field_error("", "ev", ev, _STR, None)
    spec = _SPECS.get(ev)
    if spec is None:
        return f"unknown ev {ev!r}"
    for name, types, allowed in spec:
        v = get(name, _MISSING)
        if type(v) not in types or (allowed is not None and v not in allowed):
            return _field_error(ev, name, v, types, allowed)
    if ev == "fault" and type(get("params", {})) is not dict:
        return "fault: field 'params' is not an object"
    for name in _INT_FIELDS:  # (stored as 64-bit integers, by Parquet as by anyone)
        v = get(name)
        if type(v) is int and not -_INT64 <= v < _INT64:
            return f"{ev}: field {name!r} is out of the 64-bit range"
    return None


@dataclass
class RunInfo:
    """What run.json says (only what the checker uses; everything is optional but the file)."""

    dir: str
    seed: Any = None
    started: float | None = None
    ended: float | None = None
    members: list[str] = field(default_factory=list)
    config: str | None = None
    subscriber_timeout: float | None = None
    # [cluster] of config_text: partitioned mode's placement (pipeline/rules.py, Placement)
    partitioned: bool = False
    partitions: int = 256
    replicas: int = 2


def load_run(run_dir: str | Path) -> RunInfo:
    """Read RUN_DIR/run.json; InputError when it is missing or not a JSON object."""
    path = Path(run_dir) / "run.json"
    try:
        raw = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: {e}") from None
    if type(raw) is not dict:
        raise InputError(f"{path}: not a JSON object")

    def num(name: str) -> float | None:
        v = raw.get(name)
        return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None

    members = raw.get("members")
    info = RunInfo(
        dir=str(run_dir),
        seed=raw.get("seed"),
        started=num("started"),
        ended=num("ended"),
        members=sorted(members) if isinstance(members, dict) else [],
        config=raw.get("config") if isinstance(raw.get("config"), str) else None,
    )
    text = raw.get("config_text")
    if isinstance(text, str):
        try:
            toml = tomllib.loads(text)
            timeouts = toml.get("timeouts", {})
            v = timeouts.get("subscriber_timeout") if isinstance(timeouts, dict) else None
            if isinstance(v, int | float) and not isinstance(v, bool):
                info.subscriber_timeout = float(v)
            cluster = toml.get("cluster", {})
            if isinstance(cluster, dict) and cluster.get("mode") == "partitioned":
                info.partitioned = True
                for name in ("partitions", "replicas"):
                    n = cluster.get(name)
                    if type(n) is int and n >= 1:
                        setattr(info, name, n)
        except tomllib.TOMLDecodeError:
            info.subscriber_timeout = None  # (unreadable: the checker's default applies)
    return info


def event_files(run_dir: str | Path) -> list[Path]:
    """RUN_DIR/events/*.jsonl in name order (the order ties in time are broken in)."""
    d = Path(run_dir) / "events"
    return sorted(p for p in d.glob("*.jsonl") if p.is_file()) if d.is_dir() else []


def _json_error(line: str) -> str:
    """Why a line is not one JSON value, with the column counted within the line."""
    try:
        json.loads(line.rstrip("\r\n"))
    except json.JSONDecodeError as e:
        return f"bad JSON: {e.msg} at column {e.colno}"
    except (ValueError, RecursionError) as e:
        return f"bad JSON: {e}"
    return "bad JSON"


def _surrogate_error(obj: object) -> str | None:
    """A string with a lone surrogate (json.loads takes "\\ud800") cannot be stored as UTF-8:
    such a line is malformed for every reader of the logs alike."""
    try:
        json.dumps(obj, ensure_ascii=False).encode()
    except UnicodeEncodeError as e:
        return f"a string holds a lone surrogate ({e.object[e.start : e.end]!a})"
    return None


Parsed = tuple[Any, str | None]


def line_parser() -> Callable[[bytes], Parsed]:
    """A function from one raw line (with or without its newline) to (event, None) for a valid
    event, or (None, why) for a malformed line. The one parser every reader of the logs uses:
    the reference checker and the Spark audit's event source (pipeline/eventsource.py).

    The JSON parser's scanner is called directly (twice as fast as json.loads, which scans
    whitespace and checks the end with regular expressions); a line it does not take whole goes
    through json.loads, so what is accepted is exactly what json.loads accepts.
    """
    decoder = json.JSONDecoder()
    scan: Callable[[str, int], tuple[Any, int]] = getattr(decoder, "scan_once", decoder.raw_decode)
    loads = json.loads

    def parse(raw: bytes) -> Parsed:
        try:
            line = raw.decode()
        except UnicodeDecodeError as e:
            return None, f"not UTF-8: {e.reason} at byte {e.start}"
        try:
            obj, end = scan(line, 0)
            if end != len(line) - 1 and line[end:].strip():
                raise ValueError("extra data")
        except (StopIteration, ValueError, RecursionError):
            try:
                obj = loads(line)
            except (ValueError, RecursionError):
                return None, _json_error(line)
        err = validate(obj)
        if err is None and "\\u" in line:
            err = _surrogate_error(obj)
        return (obj, None) if err is None else (None, err)

    return parse


def read_events(paths: Iterable[Path], checker: Sink) -> None:
    """Feed every line of `paths` to `checker`: events to add(), the rest to malformed()."""
    parse = line_parser()
    add = checker.add
    for path in paths:
        checker.files += 1
        name = path.name
        with open(path, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                obj, err = parse(raw)
                if err is None:
                    add(obj)
                else:
                    checker.malformed(name, lineno, err)
