"""The JSON Schema of scripts/check.py's ``--json`` report (pipeline/rules.py's docstring describes it in
words); the tests validate every report against it, so the two cannot drift apart."""

from __future__ import annotations

from typing import Any

from roost.pipeline.durablerules import DURABLE_COUNTS, DURABLE_VIOLATIONS
from roost.pipeline.rules import COUNT_FIELDS, LOSS_CLASSES, MODES

_N = {"type": ["number", "null"]}
_NUM_S = {"type": "number"}
_INT_S = {"type": "integer", "minimum": 0}
_STR_S = {"type": "string"}
_STRN = {"type": ["string", "null"]}
_COUNTS = {f: _INT_S for f in COUNT_FIELDS}
_DCOUNTS = {f: _INT_S for f in DURABLE_COUNTS}
_INT_OR_NULL = {"type": ["integer", "null"]}


def _obj(props: dict[str, Any], extra: bool = False) -> dict[str, Any]:
    return {"type": "object", "required": list(props), "properties": props, "additionalProperties": extra}


REPORT_SCHEMA: dict[str, Any] = _obj(
    {
        "version": {"const": 1},
        "ok": {"type": "boolean"},
        "run": _obj(
            {
                "dir": _STR_S,
                "seed": {},
                "started": _N,
                "ended": _N,
                "members": {"type": "array", "items": _STR_S},
                "config": _STRN,
            }
        ),
        "options": _obj({"grace": _NUM_S, "subscriber_timeout": _NUM_S, "fault_tail": _NUM_S}),
        "input": _obj(
            {
                "files": _INT_S,
                "events": _INT_S,
                "malformed": _INT_S,
                "malformed_lines": {
                    "type": "array",
                    "items": _obj({"file": _STR_S, "line": {"type": "integer", "minimum": 1}, "error": _STR_S}),
                },
                "duplicate_publishes": _INT_S,
                "unpaired_fault_ends": _INT_S,
                "phantom_deliveries": _INT_S,
                "stray_deliveries": _INT_S,
                "by_kind": {"type": "object", "additionalProperties": _INT_S},
            }
        ),
        "published": _obj({mode: _obj({"messages": _INT_S, "acknowledged": _INT_S}) for mode in MODES}),
        "modes": _obj(
            {
                mode: _obj(
                    {
                        "totals": _obj(_COUNTS),
                        "lost_by_class": _obj({c: _INT_S for c in LOSS_CLASSES}),
                        "latency": _obj({"n": _INT_S, "p50": _N, "p90": _N, "p99": _N, "max": _N}),
                        "paths": {
                            "type": "array",
                            "items": _obj({"pid": _STR_S, "sub": _STR_S, "topic": _STR_S, "key": _STRN, **_COUNTS}),
                        },
                    }
                )
                for mode in MODES
            }
        ),
        "lost": {
            "type": "array",
            "items": _obj(
                {
                    "pid": _STR_S,
                    "seq": {"type": "integer"},
                    "sub": _STR_S,
                    "topic": _STR_S,
                    "key": _STRN,
                    "member": _STRN,
                    "t": _NUM_S,
                    "class": {"enum": list(LOSS_CLASSES)},
                }
            ),
        },
        "duplicated": {
            "type": "array",
            "items": _obj(
                {
                    "pid": _STR_S,
                    "seq": {"type": "integer"},
                    "sub": _STR_S,
                    "mode": {"enum": list(MODES)},
                    "count": {"type": "integer", "minimum": 2},
                    "members": {"type": "array", "items": _STRN},
                }
            ),
        },
        "reordered": {
            "type": "array",
            "items": _obj(
                {
                    "pid": _STR_S,
                    "seq": {"type": "integer"},
                    "sub": _STR_S,
                    "mode": {"enum": list(MODES)},
                    "after_seq": {"type": "integer"},
                    "class": _STR_S,
                }
            ),
        },
        "faults": {
            "type": "array",
            "items": _obj(
                {
                    "fault": _STR_S,
                    "target": _STR_S,
                    "start": _NUM_S,
                    "end": _N,
                    "healed": {"type": "boolean"},
                    "params": {"type": ["object", "null"]},
                    "gap": _NUM_S,
                    "recover": _N,
                    "deliveries": _INT_S,
                }
            ),
        },
        "agreement": _obj(
            {
                "agreed": {"type": ["boolean", "null"]},
                "digests": {"type": "object", "additionalProperties": _STRN},
                "missing": {"type": "array", "items": _STR_S},
            }
        ),
        "durable": _obj(
            {
                "puts": _INT_S,
                "acknowledged": _INT_S,
                "duplicate_puts": _INT_S,
                "crashes": _INT_S,
                "offset_conflicts": _INT_S,
                "phantoms": _INT_S,
                "totals": _obj(_DCOUNTS),
                "subscriptions": {
                    "type": "array",
                    "items": _obj(
                        {
                            "client": _STR_S,
                            "durable": _STR_S,
                            "topic": _STR_S,
                            **_DCOUNTS,
                            "committed": _INT_OR_NULL,
                            "read_to": _INT_S,
                        }
                    ),
                },
                "latency": _obj({"n": _INT_S, "p50": _N, "p90": _N, "p99": _N, "max": _N}),
                "longest_gap": _obj({"gap": _N, "sub": _STRN, "topic": _STRN, "t": _N}),
                "faults": {
                    "type": "array",
                    "items": _obj({"fault": _STR_S, "target": _STR_S, "start": _NUM_S, "end": _N, "gap": _NUM_S}),
                },
                "lost": {
                    "type": "array",
                    "items": _obj(
                        {
                            "pid": _STR_S,
                            "seq": {"type": "integer"},
                            "client": _STR_S,
                            "durable": _STR_S,
                            "topic": _STR_S,
                            "member": _STRN,
                            "t": _NUM_S,
                            "offset": _INT_OR_NULL,
                            "read_to": _INT_S,
                        }
                    ),
                },
                "duplicated": {
                    "type": "array",
                    "items": _obj(
                        {
                            "pid": _STR_S,
                            "seq": {"type": "integer"},
                            "client": _STR_S,
                            "durable": _STR_S,
                            "topic": _STR_S,
                            "offsets": {"type": "array", "minItems": 2},
                        }
                    ),
                },
                "regressions": {
                    "type": "array",
                    "items": _obj(
                        {
                            "client": _STR_S,
                            "durable": _STR_S,
                            "topic": _STR_S,
                            "kind": {"enum": ["commit_back", "read_below"]},
                            "offset": {"type": "integer"},
                            "committed": {"type": "integer"},
                            "t": _NUM_S,
                            "proc": _STR_S,
                        }
                    ),
                },
                "conflicts": {
                    "type": "array",
                    "items": _obj(
                        {
                            "partition": {"type": "integer"},
                            "offset": {"type": "integer"},
                            "first": {"type": "array"},
                            "other": {"type": "array"},
                            "t": _NUM_S,
                        }
                    ),
                },
            }
        ),
        "violations": {
            "type": "array",
            "items": _obj(
                {
                    "kind": {
                        "enum": ["lost", "duplicated", "reordered", "phantom", "disagreement", *DURABLE_VIOLATIONS]
                    },
                    "pid": _STRN,
                    "seq": {"type": ["integer", "null"]},
                    "sub": _STRN,
                    "member": _STRN,
                    "reason": _STR_S,
                    "t": _N,
                }
            ),
        },
    }
)
