"""Target (c): the config loaders (node/config.py, cluster/config.py) fed mutated TOML documents:
they must refuse with their own ``ConfigError`` and a message that names the file, never raise
anything else; a document they accept must give a config that a broker core, and every member of
a cluster, starts with (and a member's STATUS encodes).

The templates are the repository's configs (configs/*.toml), a few documents written here, and
documents generated from the settings tables (``every_setting``): two node configs that set every
key of node/config.py's SETTINGS, and three cluster configs that set every key of
cluster/config.py's CLUSTER_SETTINGS, every node setting a cluster config may hold and every
``[[members]]`` key, each to a value its loader takes (the default, or an example where the
default leaves a setting off; a token and secrets in files the rig writes, mode 0600, and one
0644 that ``allow_insecure_secret_file`` lets through). Each is parsed, mutated on its tree with
values TOML can carry (no nil, no bytes, integers within int64), written back as TOML (``emit``),
or mutated byte by byte as text; then written to a file and loaded as ``roost node --config``
loads it. A document counts as mutated (``mutated``) only if its text differs from its
template's.
"""

from __future__ import annotations

import datetime
import functools
import json
import math
import random
import re
import tomllib
from collections import deque
from pathlib import Path
from typing import Any

from roost.cluster.config import CLUSTER_SETTINGS, MEMBER_KEYS, is_cluster_config, load_cluster_config
from roost.cluster.member import MemberCore
from roost.node.config import SETTINGS, ConfigError, Setting, load_node_config, read_toml
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
max_payload = 3000
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


#: Values for the settings whose default leaves them off (empty), so that the generated templates
#: set them to something the loaders read; the files are written by the rig (``files``).
EXAMPLES: dict[tuple[str, str], Any] = {
    ("node", "advertise_addr"): "127.0.0.1:7409", ("monitor", "addr"): "127.0.0.1:8409",
    ("monitor", "token"): "a-monitor-token-of-24-chars", ("monitor", "token_file"): "monitor.token",
    ("cluster", "secret"): "a-secret-of-sixteen-or-more", ("cluster", "secret_file"): "cluster.secret",
}  # fmt: skip
#: Settings a config sets one of, not both: the templates take turns.
EITHER = (("monitor", "token", "token_file"), ("cluster", "secret", "secret_file"))
#: Node settings a cluster config sets per member, in [[members]], never in its [node] or [monitor].
PER_MEMBER = {("node", "id"), ("node", "client_addr"), ("node", "advertise_addr"), ("monitor", "addr")}
#: The cluster templates: the turn of each ``EITHER`` pair (0 the secret, 1 its file), and what they
#: set in place of a setting's value: the third a file group and others may read, allowed, and
#: partitioned mode.
CLUSTER_VARIANTS: list[tuple[int, dict[tuple[str, str], Any]]] = [
    (0, {}),
    (1, {}),
    (1, {("cluster", "secret_file"): "cluster-open.secret", ("cluster", "allow_insecure_secret_file"): True,
         ("cluster", "mode"): "partitioned", ("cluster", "partitions"): 16}),
]  # fmt: skip


def every_setting(table: list[Setting], turn: int, skip: set[tuple[str, str]] | None = None,
                  overrides: dict[tuple[str, str], Any] | None = None) -> dict[str, dict[str, Any]]:  # fmt: skip
    """Every setting of ``table`` (but ``skip``), by section: its default, or ``EXAMPLES``' value
    where the default leaves it off; of each ``EITHER`` pair the one ``turn`` picks gets its
    example, the other its default if that is allowed, else nothing."""
    doc: dict[str, dict[str, Any]] = {}
    for st in table:
        where = (st.section, st.key)
        if skip is not None and where in skip:
            continue
        value = st.default
        pair = next((e for e in EITHER if e[0] == st.section and st.key in e[1:]), None)
        if pair is not None and pair[1 + turn % 2] != st.key:
            if not st.check(value):
                continue
        elif value == "" and where in EXAMPLES:
            value = EXAMPLES[where]
        doc.setdefault(st.section, {})[st.key] = (overrides or {}).get(where, value)
    return doc


def generated() -> list[dict[str, Any]]:
    """The node and cluster templates that set every setting (module docstring)."""
    docs: list[dict[str, Any]] = [every_setting(SETTINGS, turn) for turn in (0, 1)]
    for turn, overrides in CLUSTER_VARIANTS:
        doc: dict[str, Any] = every_setting(CLUSTER_SETTINGS, turn, overrides=overrides)
        doc.update(every_setting(SETTINGS, turn, PER_MEMBER))
        doc["members"] = [{k: _member_value(k, i) for k in MEMBER_KEYS} for i in range(2)]
        docs.append(doc)
    return docs


def _member_value(key: str, i: int) -> str:
    if key == "id":
        return f"m{i}"
    if key == "data_dir":
        return f"data/m{i}"
    return f"127.0.0.{i + 1}:{7600 + 100 * MEMBER_KEYS.index(key) + i}"


def files(tmp: Path) -> None:
    """The files the templates name, beside the config: the token and secrets, mode 0600 (a
    loader refuses what group or others may read), and one 0644."""
    for name, text, mode in (("cluster.secret", "a-secret-read-from-a-file\n", 0o600),
                             ("cluster-open.secret", "a-secret-others-may-read\n", 0o644),
                             ("monitor.token", "a-monitor-token-read-from-a-file\n", 0o600)):  # fmt: skip
        (tmp / name).write_text(text)
        (tmp / name).chmod(mode)


def templates() -> list[dict[str, Any]]:
    docs = [tomllib.loads(p.read_text()) for p in sorted((ROOT / "configs").glob("*.toml"))]
    for d in docs:  # (their secret file is in run/, or the environment: the rig's, beside the config)
        if isinstance(d.get("cluster"), dict) and not d["cluster"].get("secret"):
            d["cluster"]["secret_file"] = "cluster.secret"
    return [*docs, *(tomllib.loads(d) for d in (EVERY_SECTION, EVERY_CLUSTER_SECTION, SECRET_FILE)), *generated()]


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


VALUES_TOML = [v for v in VALUES if toml_safe(v)] + [
    datetime.date(2026, 1, 1),
    "data/x",
    "/dev/null",
    "0.0.0.0:0",
    "127.0.0.1:65536",
    "[::1]:7400",
    "partitioned",
    "replicated",
]


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


@functools.cache
def _templates() -> tuple[list[dict[str, Any]], list[bytes]]:
    """The templates as the rig copies them (through JSON: dates become strings), and their text:
    read once per process (the rig only reads them)."""
    docs = [json.loads(json.dumps(d, default=str)) for d in templates()]
    return docs, [emit(d).encode() for d in docs]


class ConfigRig:
    def __init__(self, tmp: Path, free: list[Any]) -> None:
        self.path = tmp / "fuzz.toml"
        if not (tmp / "monitor.token").exists():
            files(tmp)
        self.docs, self.texts = _templates()
        self.values = Values(VALUES_TOML, [v for v in free if toml_safe(v)])
        self.trace: deque[str] = deque(maxlen=8)
        self.frames = self.mutated = self.accepted = 0

    def step(self, plan: Plan) -> None:
        a, b, c = plan
        kind = KINDS[a & 7]
        doc = json.loads(json.dumps(self.docs[b % len(self.docs)]))  # (a copy)
        template = self.texts[b % len(self.docs)]
        if kind in ("bytes", "as-is"):
            text = template
            for i in range(1 + (a >> 6)):
                text, _ = mutate_bytes(text, (b >> 3) + i * 7919, c + i)
        else:
            for i in range(1 + (a >> 6)):  # (one to four changes)
                mutate_tree(doc, kind, (b >> 3) + i * 7919, self.values, c + i * 31)
            text = emit(tomlable(doc)).encode()
        self.path.write_bytes(text)
        self.trace.append(text.decode(errors="replace")[:400])
        self.mutated += text != template
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
