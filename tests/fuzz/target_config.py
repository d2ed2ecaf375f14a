"""Target (c): the config loaders (node/config.py, cluster/config.py) fed mutated TOML documents:
they must refuse with their own ``ConfigError`` and a message that names the file, never raise
anything else; a document they accept must give a config that a broker core, and every member of
a cluster, starts with (and a member's STATUS encodes).

The templates are the repository's configs (configs/*.toml) and two documents that set every
section: each is parsed, mutated on its tree with values TOML can carry (no nil, no bytes,
integers within int64), written back as TOML (``emit``), and sometimes mutated byte by byte as
text; then written to a file and loaded as ``roost node --config`` loads it.
"""

from __future__ import annotations

import datetime
import json
import math
import random
import re
import tomllib
from collections import deque
from pathlib import Path
from typing import Any

from roost.cluster.config import is_cluster_config, load_cluster_config
from roost.cluster.member import MemberCore
from roost.node.config import ConfigError, load_node_config, read_toml
from roost.node.core import BrokerCore
from tests.fuzz import checks
from tests.fuzz.mutate import KINDS, VALUES, Plan, Values, mutate_bytes, mutate_tree

ROOT = Path(__file__).resolve().parents[2]
_BARE = re.compile(r"^[A-Za-z0-9_-]+$")

EVERY_SECTION = """
[node]
id = "n9"
client_addr = "127.0.0.1:7409"
advertise_addr = "127.0.0.1:7409"
text_networks = ["127.0.0.0/8", "::1/128", "10.0.0.0/8"]
log_level = "debug"
log_format = "json"
[monitor]
addr = "127.0.0.1:8409"
max_connections = 8
idle_timeout = 5.0
[limits]
max_datagram = 1500
mailbox_capacity = 64
send_window = 16
max_payload = 4096
max_per_host = 4
admission_share = 0.5
[timeouts]
subscriber_timeout = 3.0
retransmit_timeout = 0.05
retransmit_max = 0.5
text_sub_lease = 2.0
producer_timeout = 10.0
cookie_lifetime = 60.0
ping_interval = 0.5
"""

EVERY_CLUSTER_SECTION = """
[cluster]
secret = "a-secret-of-sixteen-or-more"
mode = "partitioned"
partitions = 16
replicas = 2
heartbeat_interval = 0.2
suspect_after = 0.6
down_after = 1.2
anti_entropy_interval = 2.0
link_idle_timeout = 3.0
max_frame = 1048576
[durable]
fsync = "always"
fetch_bytes = 65536
[limits]
max_datagram = 8192
[timeouts]
subscriber_timeout = 5.0
[[members]]
id = "a"
client_addr = "127.0.0.1:7601"
peer_addr = "127.0.0.1:7701"
data_dir = "data/a"
monitor_addr = "127.0.0.1:8601"
[[members]]
id = "b"
client_addr = "127.0.0.2:7602"
peer_addr = "127.0.0.2:7702"
data_dir = "data/b"
advertise_addr = "192.0.2.10:7602"
"""

SECRET_FILE = """
[cluster]
secret_file = "cluster.secret"
[[members]]
id = "solo"
client_addr = "[::1]:7603"
peer_addr = "[::1]:7703"
data_dir = "data/solo"
"""


def templates() -> list[dict[str, Any]]:
    docs = [tomllib.loads(p.read_text()) for p in sorted((ROOT / "configs").glob("*.toml"))]
    return [*docs, *(tomllib.loads(d) for d in (EVERY_SECTION, EVERY_CLUSTER_SECTION, SECRET_FILE))]


def toml_safe(v: Any, depth: int = 0) -> bool:
    """A value TOML can carry (what a parsed document can hold), nested at most 200 deep."""
    if v is None or v.__class__ is bytes or depth > 200:
        return False
    if v.__class__ is int:
        return -(2**63) <= v < 2**63
    if isinstance(v, list):
        return all(toml_safe(x, depth + 1) for x in v)
    if isinstance(v, dict):
        return all(k.__class__ is str and toml_safe(x, depth + 1) for k, x in v.items())
    return True


VALUES_TOML = [v for v in VALUES if toml_safe(v)] + [datetime.date(2026, 1, 1), "data/x", "/dev/null", "0.0.0.0:0",
                                                     "127.0.0.1:65536", "[::1]:7400", "partitioned", "replicated"]


def tomlable(v: Any) -> Any:
    """``v`` with what TOML cannot carry made into what it can (a mutation may leave a nil, bytes
    or an integer key): strings."""
    if v is None or v.__class__ is bytes:
        return "" if v is None else v.decode("latin-1")
    if isinstance(v, list):
        return [tomlable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): tomlable(x) for k, x in v.items()}
    return v


def _key(k: str) -> str:
    return k if _BARE.match(k) else _string(k)


def _string(s: str) -> str:
    return json.dumps(s, ensure_ascii=False).replace("\x7f", "\\u007f")


def _value(v: Any) -> str:
    if v is True or v is False:
        return "true" if v else "false"
    if v.__class__ is int:
        return str(v)
    if v.__class__ is float:
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, str):
        return _string(v)
    if isinstance(v, (datetime.date, datetime.time)):
        return v.isoformat()
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    return "{" + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items()) + "}"


def emit(doc: dict[str, Any]) -> str:
    """``doc`` as a TOML document: tables as [sections], the rest as keys and inline values."""
    lines = [f"{_key(k)} = {_value(v)}" for k, v in doc.items() if not isinstance(v, dict)]
    for k, v in doc.items():
        if isinstance(v, dict):
            lines.append(f"[{_key(k)}]")
            lines += [f"{_key(kk)} = {_value(vv)}" for kk, vv in v.items()]
    return "\n".join(lines) + "\n"


class ConfigRig:
    def __init__(self, tmp: Path, free: list[Any]) -> None:
        self.path = tmp / "fuzz.toml"
        (tmp / "cluster.secret").write_text("a-secret-read-from-a-file\n")
        self.docs = templates()
        self.values = Values(VALUES_TOML, [v for v in free if toml_safe(v)])
        self.trace: deque[str] = deque(maxlen=8)
        self.frames = self.mutated = self.accepted = 0

    def step(self, plan: Plan) -> None:
        a, b, c = plan
        kind = KINDS[a & 7]
        doc = json.loads(json.dumps(self.docs[b % len(self.docs)], default=str))  # (a copy)
        if kind in ("bytes", "as-is"):
            text = emit(doc).encode()
            for i in range(1 + (a >> 6)):
                text, _ = mutate_bytes(text, (b >> 3) + i * 7919, c + i)
        else:
            for i in range(1 + (a >> 6)):  # (one to four changes)
                mutate_tree(doc, kind, (b >> 3) + i * 7919, self.values, c + i * 31)
            text = emit(tomlable(doc)).encode()
        self.path.write_bytes(text)
        self.trace.append(text.decode(errors="replace")[:400])
        self.mutated += 1
        self.frames += 1
        self._load(text)

    def _load(self, text: bytes) -> None:
        """As ``roost node --config`` does (cluster/cli.py): read the TOML, then the loader its
        shape calls for."""
        source = str(self.path)
        try:
            data = read_toml(self.path)
            if is_cluster_config(data):
                cc = load_cluster_config(self.path, data)
            else:
                BrokerCore(load_node_config(self.path, data), random.Random(1), 1)
                self.accepted += 1
                return
        except ConfigError as exc:
            assert str(exc).startswith(source), f"a ConfigError that does not name the file: {exc}"
            return
        for m in cc.members:
            cc.node_config(m.id)
        member = MemberCore(cc, cc.members[0].id, rng=random.Random(1), now=0.0, wall_offset=0.0, incarnation=1)
        checks.status_encodes({**member.broker.status(), **member.status()})
        self.accepted += 1

    def finish(self) -> bool:
        return True
